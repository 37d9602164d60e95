#!/usr/bin/env python3
"""PyTorch's profile of the ResNet-18 (CIFAR) training step, to set beside cutrain's
(CUTRAIN_PROFILE=1 build/bench/resnet_first_step, steps 10-29).

  bench/torch_profile_resnet.py [--batch 256] [--steps 20] [--out FILE]

The model and step of bench/torch_resnet_first_step.py (bf16 autocast, channels-last, SGD with
momentum, cudnn.benchmark on): 10 warm-up steps, then torch.profiler (CUPTI) over --steps steps.
Every GPU kernel's time is summed into the categories cutrain's profiler uses, from the kernel's
name: conv fprop / dgrad / wgrad (cuDNN's kernel names say which), norm forward / backward
(batch_norm kernels), optimizer (multi_tensor_apply), casts and copies, reductions, pointwise
(elementwise kernels), other. Prints the category table (ms per step, share of GPU time) and the
ops with the most GPU time; --out writes both as JSON.
"""
import argparse
import json
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_resnet_first_step import training_step  # noqa: E402


def category(name):
    n = name.lower()
    if "wgrad" in n:
        return "conv wgrad"
    if "dgrad" in n:
        return "conv dgrad"
    if "copy" in n or "cast" in n:  # before "conv": bf16 copies are "convert" kernels
        return "casts and copies"
    if "fprop" in n or "conv" in n or "implicit_gemm" in n or "xmma" in n or "cudnn" in n:
        return "conv fprop"
    if "batch_norm" in n or "batchnorm" in n or "welford" in n or "bn_" in n:
        return "norm backward" if "backward" in n else "norm forward"
    if "multi_tensor_apply" in n or "sgd" in n or "foreach" in n:
        return "optimizer"
    if "reduce" in n:
        return "reductions"
    if "elementwise" in n or "vectorized" in n:
        return "pointwise"
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    step = training_step(a.batch)
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()

    cats, kernels = {}, {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            us = e.device_time if hasattr(e, "device_time") else e.cuda_time
            cats[category(e.name)] = cats.get(category(e.name), 0.0) + us
            kernels[e.name] = kernels.get(e.name, 0.0) + us
    total = sum(cats.values())
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}; "
          f"ResNet-18 (CIFAR), batch {a.batch}, bf16 autocast, channels-last, SGD; {a.steps} steps profiled")
    print(f"{'category':<20} {'ms/step':>9} {'share':>7}")
    rows = []
    for c, us in sorted(cats.items(), key=lambda kv: -kv[1]):
        ms = us / 1e3 / a.steps
        print(f"{c:<20} {ms:>9.3f} {100 * us / total:>6.1f}%")
        rows.append({"category": c, "ms_per_step": ms, "share": us / total})
    print(f"{'GPU time':<20} {total / 1e3 / a.steps:>9.3f}")
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:15]
    print("\nkernels with the most GPU time (ms/step):")
    for name, us in top:
        print(f"  {us / 1e3 / a.steps:8.3f}  {category(name):<16}  {name[:110]}")
    print()
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"torch": torch.__version__, "batch": a.batch, "steps": a.steps, "gpu_ms_per_step": total / 1e3 / a.steps,
                       "categories": rows,
                       "kernels": [{"name": n, "ms_per_step": us / 1e3 / a.steps} for n, us in top]}, f, indent=1)


if __name__ == "__main__":
    main()
