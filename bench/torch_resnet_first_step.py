#!/usr/bin/env python3
"""PyTorch's cost of cudnn.benchmark on a ResNet-18, to set against cutrain's tuning time.

ResNet-18 for CIFAR-sized input (3x3 stem, no max pool), batch 256, bf16 autocast, channels-last,
SGD: the wall time of the first training step (where cudnn.benchmark times every convolution)
and the median of steps 10-29, with cudnn.benchmark on and off. The first step's extra time
with benchmark on, over the one with it off, is PyTorch's tuning time for this model.
"""
import statistics, sys, time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return F.relu(y + (self.short(x) if self.short is not None else x))


def resnet18():
    layers = [nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU()]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 10)]
    return nn.Sequential(*layers).cuda().to(memory_format=torch.channels_last)


def training_step(batch=256):
    """The benchmarked step: a fresh ResNet-18 (seed 0), SGD with momentum, one fixed random
    batch; returns a function running one bf16-autocast step on it."""
    torch.manual_seed(0)
    net = resnet18()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(batch, 3, 32, 32, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def run(benchmark):
    torch.backends.cudnn.benchmark = benchmark
    step = training_step()
    torch.cuda.synchronize()
    times = []
    for _ in range(30):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return times[0], statistics.median(times[10:])


def main():
    # One mode per process, so that both first steps pay the same one-time costs (CUDA context,
    # lazy kernel loading): bench/torch_resnet_first_step.py off, then ... on.
    benchmark = len(sys.argv) > 1 and sys.argv[1] == "on"
    torch.ones(1, device="cuda")  # context creation outside the timed steps
    first, steady = run(benchmark)
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}; "
          f"ResNet-18 (CIFAR), batch 256, bf16 autocast, channels-last, SGD")
    print(f"cudnn.benchmark {'on ' if benchmark else 'off'}: first step {first:8.1f} ms, steady {steady:6.2f} ms")


if __name__ == "__main__":
    main()
