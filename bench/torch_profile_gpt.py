#!/usr/bin/env python3
"""PyTorch's kernels for the GPT forward of bench/torch_deploy.py --model gpt, to set beside
cutrain's profile of its GPT engine (bench_deploy_gpu --model gpt prints it on stderr).

  bench/torch_profile_gpt.py [--batches 1,32] [--calls 20]

CharGPT (vocab 65, context 256, dim 384, 6 heads, 6 layers, random weights) in bf16, eval, under
torch.inference_mode; tokens [N, 256]. 10 warm-up calls, then torch.profiler (CUPTI) over --calls
calls of the eager forward (the kernels its CUDA graph replays). Prints GPU time per call and
each kernel's time per call, summed by name.
"""
import argparse
import pathlib
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from torch_char_gpt import CharGPT  # noqa: E402
from torch_deploy import gpt_logits  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--calls", type=int, default=20)
    a = ap.parse_args()
    torch.manual_seed(0)
    net = gpt_logits(CharGPT(65, 256, 384, 6, 6).cuda().to(torch.bfloat16).eval())
    with torch.inference_mode():
        for n in (int(b) for b in a.batches.split(",")):
            x = torch.randint(0, 65, (n, 256), device="cuda")
            for _ in range(10):
                net(x)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(a.calls):
                    net(x)
                torch.cuda.synchronize()
            kernels = {}
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    us = e.device_time if hasattr(e, "device_time") else e.cuda_time
                    k = kernels.setdefault(e.name, [0.0, 0])
                    k[0] += us
                    k[1] += 1
            total = sum(v[0] for v in kernels.values())
            print(f"-- PyTorch {torch.__version__}, {torch.cuda.get_device_name()}: GPT forward at batch {n}, "
                  f"GPU time {total / 1e3 / a.calls:.4f} ms per call")
            for name, (us, c) in sorted(kernels.items(), key=lambda kv: -kv[1][0]):
                print(f"  {us / 1e3 / a.calls:8.4f} ms  {c // a.calls:3d}x  {name[:120]}")


if __name__ == "__main__":
    main()
