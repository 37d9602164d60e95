#!/usr/bin/env python3
"""The work of bench/bench_deploy_gpu.cpp in PyTorch, timed the same way, with the ratios.

ResNet-18 for CIFAR-sized input (bench/torch_resnet18_weights.py's network, random weights),
eval mode under torch.inference_mode, bf16 weights and input, channels_last, cudnn.benchmark on.
Per batch size: eager; the forward captured as a CUDA graph (torch.cuda.CUDAGraph, static input
copied in, output cloned out, as cutrain's engine does); with --compile, torch.compile (mode
default mode, then the same CUDA graph around it). CUDA events around one call,
median of 30 after 10 warm-up calls.

--model gpt: bench/torch_char_gpt.py's CharGPT (vocab 65, context 256, dim 384, 6 heads, 6 layers,
random weights) in bf16, its logits for tokens [N, 256], as bench_deploy_gpu --model gpt.

  bench/torch_deploy.py [--batches 1,32,256] [--compile] [--model resnet|gpt] [--cutrain bench_deploy_gpu.json]

With --cutrain (bench_deploy_gpu's output) it prints cutrain / PyTorch's best per batch.
"""
import argparse
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from torch_resnet18_weights import resnet18_cifar  # noqa: E402
from torch_train import median_step_ms as median_ms  # noqa: E402
from torch_char_gpt import CharGPT  # noqa: E402


def gpt_logits(m):
    """CharGPT's logits [N·S, vocab] for tokens [N, S] (its forward gives the loss)."""
    def f(x):
        h = m.wte(x) + m.wpe[: x.shape[1]]
        for blk in m.blocks:
            h = blk(h)
        return torch.nn.functional.linear(m.ln_f(h), m.wte.weight).view(-1, m.wte.weight.shape[0])
    return f


def graphed(fn, x):
    """fn on a static copy of x, captured as a CUDA graph: a call copies in, replays, clones out."""
    static_x = x.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(static_x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = fn(static_x)

    def call(inp):
        static_x.copy_(inp)
        g.replay()
        return static_y.clone()
    return call


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,32,256")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--model", default="resnet", choices=["resnet", "gpt"])
    ap.add_argument("--cutrain", type=pathlib.Path)
    a = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    if a.model == "gpt":
        net = gpt_logits(CharGPT(65, 256, 384, 6, 6).cuda().to(torch.bfloat16).eval())
    else:
        net = resnet18_cifar().cuda().to(torch.bfloat16).to(memory_format=torch.channels_last).eval()
    compiled = torch.compile(net) if a.compile else None
    rows = []
    with torch.inference_mode():
        for n in (int(b) for b in a.batches.split(",")):
            if a.model == "gpt":
                x = torch.randint(0, 65, (n, 256), device="cuda")
            else:
                x = torch.randn(n, 3, 32, 32, device="cuda").to(torch.bfloat16).to(memory_format=torch.channels_last)
            r = {"batch": n, "eager_ms": median_ms(lambda: net(x))}
            g = graphed(net, x)
            r["graph_ms"] = median_ms(lambda: g(x))
            if compiled is not None:
                r["compile_ms"] = median_ms(lambda: compiled(x))
                gc = graphed(compiled, x)
                r["compile_graph_ms"] = median_ms(lambda: gc(x))
            rows.append(r)
            print(json.dumps(r), flush=True)
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    if a.cutrain:
        ours = {r["batch"]: r for r in json.loads(a.cutrain.read_text())["rows"]}
        gpt = a.model == "gpt"
        # cutrain's columns: the model's own forward (gpt) or the e4m3 engine (resnet), then the ratios.
        print("| batch | " + ("cutrain model | " if gpt else "") + "cutrain engine | engine + CUDA graph | " +
              ("" if gpt else "e4m3 engine + CUDA graph | ") + "PyTorch eager | PyTorch CUDA graph | " +
              ("torch.compile + CUDA graph | " if gpt else "") + "PyTorch best | engine graph / best |" +
              ("" if gpt else " e4m3 graph / best |"))
        for r in rows:
            c = ours.get(r["batch"])
            if not c:
                continue
            best = min(v for k, v in r.items() if k.endswith("_ms"))
            f8 = c.get("fp8_graph_ms", float("nan"))
            cells = [r["batch"]] + ([c["model_ms"]] if gpt else []) + [c["engine_ms"], c["engine_graph_ms"]]
            cells += ([] if gpt else [f8]) + [r["eager_ms"], r["graph_ms"]]
            cells += ([r.get("compile_graph_ms", float("nan"))] if gpt else []) + [best]
            ratios = [c["engine_graph_ms"] / best] + ([] if gpt else [f8 / best])
            print("| " + " | ".join([str(cells[0])] + [f"{v:.4f}" for v in cells[1:]] + [f"{v:.2f}" for v in ratios]) + " |")

if __name__ == "__main__":
    main()
