#!/usr/bin/env python3
"""PyTorch side of bench_attention_gpu: torch.nn.functional.scaled_dot_product_attention in bf16
on the same shapes, full and causal, forward alone and forward + backward (torch.autograd.grad,
so no gradient accumulates), with each of its backends (cuDNN, flash, efficient), q, k, v
[B, H, S, D] contiguous. Same timing: CUDA events around 10 back-to-back calls, median of 30
after warm-up, same buffers. With --cutrain JSON (Google Benchmark output of
bench_attention_gpu) it prints per shape cutrain's time (its [B, H, S, D] and [B, S, H, D] rows),
PyTorch's fastest backend, the ratio cutrain/PyTorch (below 1: cutrain is faster) and TFLOP/s
(a forward is 4 B H S^2 D flops, half when causal; a backward counts 2.5 forwards).
  python3 bench/torch_attention.py --cutrain attention.json --out torch_attention.json
"""
import argparse, json, statistics
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [(8, 16, 512, 64), (4, 16, 2048, 64), (2, 16, 4096, 128), (1, 32, 8192, 128)]
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def median_ms(fn):
    for _ in range(5):
        fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(30):
        a.record()
        for _ in range(10):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 10)
    return statistics.median(out)


def name(causal, s, layout, what):
    return f"attention/{'causal' if causal else 'full'}/{'x'.join(map(str, s))}/{layout}/{what}"


def tflops(s, causal, backward, ms):
    b, h, n, d = s
    return 4.0 * b * h * n * n * d * (0.5 if causal else 1.0) * (3.5 if backward else 1.0) / (ms * 1e-3) / 1e12


def run():
    res = {}
    for causal in (False, True):
        for s in SHAPES:
            r = lambda: torch.rand(*s, device="cuda", dtype=torch.bfloat16).mul_(2).sub_(1)
            q, k, v, do = r().requires_grad_(), r().requires_grad_(), r().requires_grad_(), r()
            for backend, kind in BACKENDS.items():
                try:
                    with sdpa_kernel(kind):
                        fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        both = lambda: torch.autograd.grad(fwd(), (q, k, v), do)
                        res[f"{name(causal, s, 'bhsd', 'fwd')}/{backend}"] = median_ms(lambda: fwd().detach())
                        res[f"{name(causal, s, 'bhsd', 'fwd_bwd')}/{backend}"] = median_ms(both)
                except RuntimeError as e:  # a backend that does not take the shape
                    print(f"# {backend} {s} causal={causal}: {str(e).splitlines()[0]}")
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cutrain")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch_ms = run()
    if args.out:
        json.dump({"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "ms": torch_ms},
                  open(args.out, "w"), indent=1)
    ours = {}
    if args.cutrain:
        for row in json.load(open(args.cutrain))["benchmarks"]:
            if "median_ms" in row and not row.get("error_occurred"):
                ours[row["name"].split("/manual_time")[0].removesuffix("/iterations:1")] = row["median_ms"]
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}; ms per call (TFLOP/s)")
    print(f"{'row':44} {'cutrain bhsd':>16} {'cutrain bshd':>16} {'torch cudnn':>16} {'flash':>8} {'efficient':>9}"
          f" {'best':>9} {'ratio':>6}")
    for what in ("fwd", "fwd_bwd"):
        for causal in (False, True):
            for s in SHAPES:
                back = what == "fwd_bwd"
                t = {b: torch_ms.get(f"{name(causal, s, 'bhsd', what)}/{b}") for b in BACKENDS}
                avail = {b: m for b, m in t.items() if m}
                best = min(avail, key=avail.get) if avail else None
                c1, c2 = ours.get(name(causal, s, "bhsd", what)), ours.get(name(causal, s, "bshd", what))
                fmt = lambda m: f"{m:7.3f} ({tflops(s, causal, back, m):4.0f})" if m else f"{'-':>16}"
                short = lambda m: f"{m:8.3f}" if m else f"{'-':>8}"
                mine = min([m for m in (c1, c2) if m], default=None)
                ratio = f"{mine / avail[best]:6.2f}" if mine and best else f"{'-':>6}"
                print(f"{name(causal, s, '*', what):44} {fmt(c1)} {fmt(c2)} {fmt(t['cudnn'])} {short(t['flash'])}"
                      f" {short(t['efficient']):>9} {best or '-':>9} {ratio}")


if __name__ == "__main__":
    main()
