#!/usr/bin/env python3
"""examples/fashion_mnist's training recipes in PyTorch, for time to a test accuracy from process
start. The same network (nn::fashion_mnist_cnn at --width), data (the Debian package's idx files),
normalization, augmentation (random crop with 2 pixels of zero padding, horizontal flip), AdamW
(weight decay 5e-4) with cutrain's one-cycle schedule (PyTorch's OneCycleLR without momentum
cycling), label smoothing, bf16 autocast with channels-last, the last short batch dropped, and
--recipe fast as cutrain's: test-time flip augmentation (logits of the image and its mirror
averaged) and an exponential moving average of the weights (--ema DECAY) evaluated in their place.
Augmentation runs on the GPU here (the whole set lives there), which is PyTorch at its best.
With --cuda-graph the training step is captured once and replayed (AdamW capturable, the
learning rate a device tensor written before each replay).

Prints one line per epoch and, last, "time to X% test accuracy: S s from process start" (or
"not reached"), and with --json FILE writes the run's figures.
"""
import time

T0 = time.perf_counter()  # process start, as near as Python gets: before importing torch

import argparse, copy, gzip, json, math, os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MEAN, STD = 0.2860, 0.3530


def load(split, data):
    prefix = os.path.join(data, "train" if split == "train" else "t10k")
    with gzip.open(prefix + "-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(prefix + "-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    return torch.from_numpy(x.copy()).cuda().float().div_(255), torch.from_numpy(y.astype(np.int64)).cuda()


def net(width):
    c1, c2, h = 32 * width, 64 * width, 256 * width
    return nn.Sequential(nn.Conv2d(1, c1, 3, padding=1), nn.BatchNorm2d(c1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(c1, c2, 3, padding=1), nn.BatchNorm2d(c2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(c2 * 49, h), nn.ReLU(), nn.Linear(h, 10))


def one_cycle(step, total, max_lr, pct_start=0.3, div=25.0, final_div=1e4):
    initial = max_lr / div
    up_end, down_end = pct_start * total - 1, total - 1
    s = min(max(step, 0), down_end)
    anneal = lambda a, b, p: b + (a - b) / 2 * (math.cos(math.pi * p) + 1)
    if s <= up_end:
        return anneal(initial, max_lr, s / up_end if up_end > 0 else 1.0)
    return anneal(max_lr, initial / final_div, (s - up_end) / (down_end - up_end))


def augment(padded, idx, gen):
    """Random 28x28 crops of the 32x32 zero-padded images idx, each mirrored with probability 1/2."""
    b = idx.numel()
    dy = torch.randint(0, 5, (b, 1), device="cuda", generator=gen)
    dx = torch.randint(0, 5, (b, 1), device="cuda", generator=gen)
    flip = torch.rand((b, 1), device="cuda", generator=gen) < 0.5
    r = torch.arange(28, device="cuda")[None, :]
    rows, cols = dy + r, dx + torch.where(flip, 27 - r, r)
    x = padded[idx[:, None, None], 0, rows[:, :, None], cols[:, None, :]]
    return ((x - MEAN) / STD).unsqueeze(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", choices=["default", "fast"], default="default")
    ap.add_argument("--width", type=int)
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--label-smoothing", type=float)
    ap.add_argument("--ema", type=float, help="decay of the weights' moving average (0: off)")
    ap.add_argument("--tta", action=argparse.BooleanOptionalAction)
    ap.add_argument("--target", type=float, default=94.0, help="test accuracy to time, %%")
    ap.add_argument("--stop-at-target", action="store_true")
    ap.add_argument("--cuda-graph", action="store_true")
    ap.add_argument("--precision", choices=["f32", "bf16"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default=os.environ.get("CUTRAIN_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--json")
    a = ap.parse_args()
    # The recipes of examples/fashion_mnist: flags given on the command line override them.
    recipe = dict(width=1, epochs=20, batch=128, lr=2e-3, label_smoothing=0.0, ema=0.0, tta=False, precision="f32")
    if a.recipe == "fast":
        recipe.update(width=2, epochs=30, batch=256, lr=4e-3, label_smoothing=0.1, ema=0.99, tta=True, precision="bf16")
    for k, v in recipe.items():
        if getattr(a, k) is None:
            setattr(a, k, v)

    torch.manual_seed(a.seed)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(a.seed)
    torch.backends.cudnn.benchmark = False  # cutrain's example runs heuristic plans
    xtr, ytr = load("train", a.data)
    xte, yte = load("test", a.data)
    padded = F.pad(xtr, (2, 2, 2, 2))
    xte = ((xte - MEAN) / STD).contiguous(memory_format=torch.channels_last)
    model = net(a.width).cuda().to(memory_format=torch.channels_last)
    ema = copy.deepcopy(model) if a.ema > 0 else None
    lr_t = torch.tensor(a.lr, device="cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=lr_t if a.cuda_graph else a.lr, weight_decay=5e-4,
                            capturable=a.cuda_graph)
    dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
    steps_per_epoch = xtr.shape[0] // a.batch
    total = steps_per_epoch * a.epochs

    def loss_of(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            return F.cross_entropy(model(x).float(), y, label_smoothing=a.label_smoothing)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = loss_of(x, y)
        loss.backward()
        opt.step()
        return loss

    def ema_update():
        with torch.no_grad():
            p = list(ema.parameters()) + list(ema.buffers())
            q = list(model.parameters()) + list(model.buffers())
            fp = [(s, w) for s, w in zip(p, q) if s.dtype.is_floating_point]
            torch._foreach_lerp_([s for s, _ in fp], [w for _, w in fp], 1 - a.ema)

    def evaluate(m):
        m.eval()
        correct = 0
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            for i in range(0, xte.shape[0], 1000):
                x = xte[i:i + 1000]
                logits = m(x).float()
                if a.tta:
                    logits = logits + m(torch.flip(x, dims=[3])).float()
                correct += (logits.argmax(1) == yte[i:i + 1000]).sum().item()
        m.train()
        return 100.0 * correct / xte.shape[0]

    graph = None
    xs = torch.empty((a.batch, 1, 28, 28), device="cuda").contiguous(memory_format=torch.channels_last)
    ys = torch.empty((a.batch,), dtype=torch.int64, device="cuda")
    reached, k, acc, epochs = None, 0, 0.0, []
    t_train = time.perf_counter()
    for epoch in range(1, a.epochs + 1):
        perm = torch.randperm(xtr.shape[0], device="cuda", generator=gen)
        for s in range(steps_per_epoch):
            x = augment(padded, perm[s * a.batch:(s + 1) * a.batch], gen)
            y = ytr[perm[s * a.batch:(s + 1) * a.batch]]
            lr = one_cycle(k, total, a.lr)
            if a.cuda_graph:
                lr_t.fill_(lr)
                xs.copy_(x)
                ys.copy_(y)
                if graph is None:  # as cutrain's example: one eager step (on a side stream), then the capture
                    side = torch.cuda.Stream()
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        step(xs, ys)
                    torch.cuda.current_stream().wait_stream(side)
                    graph = torch.cuda.CUDAGraph()
                    opt.zero_grad(set_to_none=True)
                    with torch.cuda.graph(graph):
                        loss_of(xs, ys).backward()
                        opt.step()
                else:
                    graph.replay()
            else:
                for g in opt.param_groups:
                    g["lr"] = lr
                step(x, y)
            if ema is not None:
                ema_update()
            k += 1
        acc = evaluate(ema if ema is not None else model)
        now = time.perf_counter()
        epochs.append({"epoch": epoch, "test_accuracy": acc, "seconds_from_start": now - T0})
        print(f"epoch {epoch}: test accuracy {acc:.2f}%, {now - T0:.2f} s from process start", flush=True)
        if reached is None and acc >= a.target:
            reached = now - T0
            if a.stop_at_target:
                break
    train_s = time.perf_counter() - t_train
    print(f"training {train_s:.2f} s, {k * a.batch / train_s:.0f} images/s (with evaluation)")
    print(f"final test accuracy {acc:.2f}%")
    if reached is None:
        print(f"time to {a.target:.1f}% test accuracy: not reached")
    else:
        print(f"time to {a.target:.1f}% test accuracy: {reached:.2f} s from process start")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "epochs": epochs, "time_to_target_s": reached, "final_accuracy": acc,
                       "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}, f, indent=1)


if __name__ == "__main__":
    main()
