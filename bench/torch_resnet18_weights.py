#!/usr/bin/env python3
"""A PyTorch ResNet-18 (CIFAR) state_dict, an input batch and its eval-mode logits, for
examples/torch_weights to load into nn::resnet18_cifar and compare.

  bench/torch_resnet18_weights.py OUT_DIR [--batch N] [--seed S] [--numpy]

Writes OUT_DIR/weights.safetensors (the state_dict in torchvision's names, num_batches_tracked
included, written by hand in the safetensors format: no safetensors package needed),
OUT_DIR/input.npy (N x 3 x 32 x 32 float32) and OUT_DIR/logits.npy (N x 10 float32, eval mode,
f32 on the CPU with TF32 off). The network is cutrain's nn::resnet18_cifar (include/cutrain/nn/
models.hpp) built torchvision's way: 3x3 stride-1 stem without bias, BN, ReLU, no max pool; four
stages of two BasicBlocks (64, 128, 256, 512; stride 2 into stages 2-4, 1x1 conv + BN downsample
there); global average pool, fc 512 -> 10. BatchNorm's affine parameters and running statistics
are randomized too, so that eval-mode batch norm is not the identity.

--numpy (or no torch installed): the same network in numpy, with numpy's random init: checks the
name map and the weight layouts against PyTorch's conventions (OIHW convolutions, [out, in] fc)
on a machine without torch.
"""
import argparse
import json
import pathlib
import struct

import numpy as np

STAGES = ((64, 1), (128, 2), (256, 2), (512, 2))


def write_safetensors(path, tensors, metadata=None):
    """tensors: name -> numpy array (float32 or int64). The format by hand: an 8-byte
    little-endian header length, the JSON header padded with spaces to 8 bytes, the raw bytes."""
    codes = {np.dtype("<f4"): "F32", np.dtype("<i8"): "I64"}
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        b = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": codes[a.dtype.newbyteorder("<")], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def resnet18_cifar(classes=10):
    """The network as a torch.nn.Module (on the CPU, PyTorch's default init)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = F.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return F.relu(y + (self.downsample(x) if self.downsample is not None else x))

    class ResNet18Cifar(nn.Module):
        def __init__(self, classes=10):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            cin = 64
            for i, (cout, stride) in enumerate(STAGES, 1):
                setattr(self, f"layer{i}", nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
                cin = cout
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(512, classes)

        def forward(self, x):
            x = F.relu(self.bn1(self.conv1(x)))
            for i in range(1, 5):
                x = getattr(self, f"layer{i}")(x)
            return self.fc(torch.flatten(self.avgpool(x), 1))

    return ResNet18Cifar(classes)


def torch_model_and_logits(batch, seed):
    import torch
    import torch.nn as nn

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False

    torch.manual_seed(seed)
    net = resnet18_cifar()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
                m.num_batches_tracked.fill_(100)
    net.eval()
    x = torch.randn(batch, 3, 32, 32)
    with torch.no_grad():
        logits = net(x)
    sd = {k: v.detach().cpu().numpy() for k, v in net.state_dict().items()}
    return sd, x.numpy(), logits.numpy(), f"torch {torch.__version__}"


def numpy_model_and_logits(batch, seed):
    rng = np.random.default_rng(seed)
    sd = {}

    def conv(name, cin, cout, k):
        bound = 1 / np.sqrt(cin * k * k)
        sd[name + ".weight"] = rng.uniform(-bound, bound, (cout, cin, k, k)).astype(np.float32)  # OIHW

    def bn(name, c):
        sd[name + ".weight"] = rng.uniform(0.5, 1.5, c).astype(np.float32)
        sd[name + ".bias"] = rng.uniform(-0.2, 0.2, c).astype(np.float32)
        sd[name + ".running_mean"] = rng.uniform(-0.2, 0.2, c).astype(np.float32)
        sd[name + ".running_var"] = rng.uniform(0.5, 1.5, c).astype(np.float32)
        sd[name + ".num_batches_tracked"] = np.array(100, dtype=np.int64)

    conv("conv1", 3, 64, 3)
    bn("bn1", 64)
    cin = 64
    for i, (cout, stride) in enumerate(STAGES, 1):
        for b in range(2):
            p = f"layer{i}.{b}"
            conv(p + ".conv1", cin if b == 0 else cout, cout, 3)
            bn(p + ".bn1", cout)
            conv(p + ".conv2", cout, cout, 3)
            bn(p + ".bn2", cout)
            if b == 0 and (stride != 1 or cin != cout):
                conv(p + ".downsample.0", cin, cout, 1)
                bn(p + ".downsample.1", cout)
        cin = cout
    bound = 1 / np.sqrt(512)
    sd["fc.weight"] = rng.uniform(-bound, bound, (10, 512)).astype(np.float32)
    sd["fc.bias"] = rng.uniform(-bound, bound, 10).astype(np.float32)

    def conv2d(x, w, stride, pad):  # x NCHW, w OIHW, in float64
        n, c, h, wd = x.shape
        o, _, k, _ = w.shape
        xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        ho, wo = (h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1
        cols = np.empty((n, c, k, k, ho, wo))
        for i in range(k):
            for j in range(k):
                cols[:, :, i, j] = xp[:, :, i:i + stride * ho:stride, j:j + stride * wo:stride]
        return np.einsum("nckluv,ockl->nouv", cols, w.astype(np.float64), optimize=True)

    def batch_norm(x, name):
        s = sd[name + ".weight"] / np.sqrt(sd[name + ".running_var"].astype(np.float64) + 1e-5)
        return (x - sd[name + ".running_mean"][None, :, None, None]) * s[None, :, None, None] + \
            sd[name + ".bias"][None, :, None, None]

    relu = lambda v: np.maximum(v, 0)
    x = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)
    h = relu(batch_norm(conv2d(x.astype(np.float64), sd["conv1.weight"], 1, 1), "bn1"))
    cin = 64
    for i, (cout, stride) in enumerate(STAGES, 1):
        for b in range(2):
            p, s = f"layer{i}.{b}", stride if b == 0 else 1
            y = relu(batch_norm(conv2d(h, sd[p + ".conv1.weight"], s, 1), p + ".bn1"))
            y = batch_norm(conv2d(y, sd[p + ".conv2.weight"], 1, 1), p + ".bn2")
            if p + ".downsample.0.weight" in sd:
                h = batch_norm(conv2d(h, sd[p + ".downsample.0.weight"], s, 0), p + ".downsample.1")
            h = relu(y + h)
        cin = cout
    logits = h.mean(axis=(2, 3)) @ sd["fc.weight"].T.astype(np.float64) + sd["fc.bias"]
    return sd, x, logits.astype(np.float32), f"numpy {np.__version__} (float64 reference)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=pathlib.Path)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--numpy", action="store_true", help="the numpy reference instead of PyTorch")
    a = ap.parse_args()
    make = numpy_model_and_logits
    if not a.numpy:
        try:
            import torch  # noqa: F401
            make = torch_model_and_logits
        except ImportError:
            print("torch is not installed: using the numpy reference")
    sd, x, logits, source = make(a.batch, a.seed)
    a.out.mkdir(parents=True, exist_ok=True)
    write_safetensors(a.out / "weights.safetensors", sd, {"format": "pt", "source": source})
    np.save(a.out / "input.npy", np.ascontiguousarray(x, dtype=np.float32))
    np.save(a.out / "logits.npy", np.ascontiguousarray(logits, dtype=np.float32))
    print(f"{source}: {len(sd)} state_dict entries, input {tuple(x.shape)}, logits {tuple(logits.shape)} "
          f"(|logits| max {np.abs(logits).max():.3f}) -> {a.out}")


if __name__ == "__main__":
    main()
