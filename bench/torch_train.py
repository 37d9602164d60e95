#!/usr/bin/env python3
"""The work of bench/bench_train_gpu.cpp in PyTorch, timed the same way, with the ratio per row.

Training step of the reference Fashion-MNIST CNN (conv3x3 1->32, BN, ReLU, maxpool, conv3x3
32->64, BN, ReLU, maxpool, linear 3136->256, ReLU, linear 256->10), f32, AdamW, one fixed batch
on the GPU: CUDA events around one step, median of 30 after warm-up, eager and (when cutrain
has the row) captured as a CUDA graph; with automatic mixed precision (torch.autocast bf16, eager
and graphed; f16 with torch.amp.GradScaler, eager), as cutrain's nn::autocast rows. Host time
per call of a tiny op (relu, conv on 1x8x8x8).
ResNet-18 for CIFAR (bench/torch_resnet_first_step.py's model), bf16 autocast, channels-last, SGD
momentum, batch 256 and 512, eager and as a CUDA graph: CUDA events around 20 steps, median of 9
(cutrain's rows with _unfused compare with the same PyTorch row).
With --cutrain JSON (Google Benchmark output of bench_train_gpu) it prints cutrain/torch per row.
"""
import argparse, json, statistics, time

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_resnet_first_step import resnet18


def fmnet():
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(3136, 256), nn.ReLU(), nn.Linear(256, 10)).cuda()


def median_step_ms(step):
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(30):
        a.record()
        step()
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b))
    return statistics.median(ms)


def captured(step, loss_of, opt):
    """The training step as a CUDA graph: 3 warm-up steps on a side stream, then loss_of(),
    backward and opt.step() captured (no scaler: the graphed rows have none); returns its replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        loss = loss_of()
        loss.backward()
        opt.step()
    return g.replay


ROWS = [(128, "fp32", False), (128, "fp32", True), (512, "fp32", False), (512, "fp32", True),
        (128, "bf16", False), (128, "bf16", True), (512, "bf16", False), (512, "bf16", True), (512, "f16", False)]


def train_rows():
    res = {}
    for batch, precision, graphed in ROWS:
        torch.manual_seed(0)
        x = torch.rand(batch, 1, 28, 28, device="cuda") * 2 - 1
        y = torch.randint(0, 10, (batch,), device="cuda")
        net = fmnet()
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=5e-4, capturable=graphed)
        dtype = {"fp32": None, "bf16": torch.bfloat16, "f16": torch.float16}[precision]
        scaler = torch.amp.GradScaler("cuda") if precision == "f16" else None

        def loss_of():
            if dtype is None:
                return F.cross_entropy(net(x), y)
            # cache_enabled=False: the weight casts must be recorded in a graph, not cached.
            with torch.autocast("cuda", dtype=dtype, cache_enabled=not graphed):
                logits = net(x)
            return F.cross_entropy(logits.float(), y)

        def step():
            loss = loss_of()
            opt.zero_grad(set_to_none=True)
            if scaler:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()

        ms = median_step_ms(captured(step, loss_of, opt) if graphed else step)
        res[f"train/fmnet_b{batch}_{precision}_{'cudagraph' if graphed else 'eager'}"] = ms
    return res


def median_ms_per_step(run, steps=20, reps=9):
    for _ in range(10):
        run()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(reps):
        a.record()
        for _ in range(steps):
            run()
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b) / steps)
    return statistics.median(ms)


def resnet_rows():
    res = {}
    for batch in (256, 512):
        for graphed in (False, True):
            torch.manual_seed(0)
            net = resnet18()
            opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
            x = torch.randn(batch, 3, 32, 32, device="cuda").to(memory_format=torch.channels_last)
            y = torch.randint(0, 10, (batch,), device="cuda")

            def loss_of():
                with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=not graphed):
                    return F.cross_entropy(net(x), y)

            def step():
                loss = loss_of()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

            ms = median_ms_per_step(captured(step, loss_of, opt) if graphed else step)
            res[f"train/resnet18_b{batch}_bf16_{'cudagraph' if graphed else 'eager'}"] = ms
    return res


def host_rows():
    res = {}
    x = torch.rand(1, 8, 8, 8, device="cuda")
    w = torch.rand(8, 8, 3, 3, device="cuda")
    for name, op in (("host/tiny_relu", lambda: F.relu(x)), ("host/tiny_conv", lambda: F.conv2d(x, w, padding=1))):
        for _ in range(20):
            op()
        torch.cuda.synchronize()
        us = []
        for _ in range(30):
            t0 = time.perf_counter()
            for _ in range(200):
                op()
            us.append((time.perf_counter() - t0) / 200 * 1e6)
            torch.cuda.synchronize()
        res[name] = statistics.median(us)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cutrain")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    train, host = train_rows(), host_rows()
    train.update(resnet_rows())
    if args.out:
        json.dump({"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "train_ms": train,
                   "host_us": host}, open(args.out, "w"), indent=1)
    cut = {}
    if args.cutrain:
        for b in json.load(open(args.cutrain))["benchmarks"]:
            name = b["name"].split("/iterations")[0].replace("/manual_time", "")
            if "ms_per_step" in b:
                cut[name] = b["ms_per_step"]
            elif "host_us_per_op" in b:
                cut[name] = b["host_us_per_op"]
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    print(f"{'row':36s} {'cutrain':>9s} {'torch':>9s} {'ratio':>6s}  unit")
    for rows, unit in ((train, "ms/step"), (host, "us/call")):
        for key, t in rows.items():
            for ck in (key, key + "_unfused"):
                c = cut.get(ck)
                if c or ck == key:
                    print(f"{ck:36s} {c if c else float('nan'):9.4f} {t:9.4f} {c / t if c else float('nan'):6.2f}  {unit}")


if __name__ == "__main__":
    main()
