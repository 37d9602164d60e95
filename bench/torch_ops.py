#!/usr/bin/env python3
"""PyTorch side of bench_ops_gpu: the same work (convs of bench/conv_shapes.txt, conv + bias + relu,
batch norm training forward alone and with relu, relu, max pool 2x2 forward and backward; same
dtypes and layouts) and timing (CUDA events around 10 back-to-back calls, median of 30 after
warm-up, same buffers, torch.backends.cudnn.benchmark=True). With --cutrain JSON (Google
Benchmark output of bench_ops_gpu) it prints cutrain/PyTorch per row (below 1 means cutrain is
faster). The fused conv + bias + relu row compares with PyTorch's conv ALONE (the target: fusion
costs nothing). With --tuned JSON (bench_ops_gpu's conv and fused rows run again
with CUTRAIN_AUTOTUNE=benchmark) it adds the tuned plans' time and ratio to those rows.
The conv rows are also timed with cudnn.benchmark off (PyTorch's heuristics alone, cutrain's
heuristic mode's counterpart), in a process of their own: PyTorch keeps one plan cache for both
settings, so one process would reuse the other setting's plans. --no-heuristic leaves that out.
  python3 bench/torch_ops.py --cutrain conv.json [--tuned tuned.json] --out torch_ops.json
"""
import argparse, json, os, statistics, subprocess, sys, tempfile
import torch

here = os.path.dirname(os.path.abspath(__file__))


def shapes():
    for line in open(os.path.join(here, "conv_shapes.txt")):
        if line.strip() and not line.startswith("#"):
            name, *v = line.split()
            yield name, [int(x) for x in v]


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


def run(tag, dtype, channels_last, tf32):
    torch.backends.cudnn.allow_tf32 = tf32
    res = {}
    for name, (n, c, h, w, k, r, s, p) in shapes():
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        x = torch.rand(n, c, h, w, device="cuda", dtype=dtype).mul_(2).sub_(1).to(memory_format=fmt)
        wt = torch.rand(k, c, r, r, device="cuda", dtype=dtype).mul_(2).sub_(1).to(memory_format=fmt)
        y = torch.nn.functional.conv2d(x, wt, stride=s, padding=p)
        dy = torch.rand_like(y).mul_(2).sub_(1)
        conv = lambda: torch.nn.functional.conv2d(x, wt, stride=s, padding=p)
        bw = lambda mask: (lambda: torch.ops.aten.convolution_backward(
            dy, x, wt, None, [s, s], [p, p], [1, 1], False, [0, 0], 1, mask))
        res[f"{tag}/{name}/fwd"] = median_ms(conv)
        res[f"{tag}/{name}/dgrad"] = median_ms(bw([True, False, False]))
        res[f"{tag}/{name}/wgrad"] = median_ms(bw([False, True, False]))
    return res


def run_convs():
    return {**run("fp32_nchw", torch.float32, False, False),
            **run("fp32_tf32_nchw", torch.float32, False, True),
            **run("bf16_nhwc", torch.bfloat16, True, False)}


def heuristic_ms():
    """The conv rows with cudnn.benchmark off, timed by a child process (see the docstring)."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "heuristic.json")
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--heuristic-out", out])
        if r.returncode != 0:
            print(f"torch_ops: the benchmark-off run failed (exit {r.returncode}); its columns are left out")
            return {}
        return json.load(open(out))


def run_extra():
    res = {}
    # conv alone and conv + bias + relu, bf16 channels-last
    torch.backends.cudnn.allow_tf32 = False
    for name, (n, c, h, w, k, r, s, p) in shapes():
        cl = torch.channels_last
        x = torch.rand(n, c, h, w, device="cuda", dtype=torch.bfloat16).mul_(2).sub_(1).to(memory_format=cl)
        wt = torch.rand(k, c, r, r, device="cuda", dtype=torch.bfloat16).mul_(2).sub_(1).to(memory_format=cl)
        b = torch.rand(k, device="cuda", dtype=torch.bfloat16)
        conv = median_ms(lambda: torch.nn.functional.conv2d(x, wt, stride=s, padding=p))
        res[f"bf16_nhwc/{name}/conv_alone"] = conv
        res[f"bf16_nhwc/{name}/conv_bias_relu"] = conv  # the target: PyTorch's conv alone
        res[f"torch_only/bf16_nhwc/{name}/conv_bias_relu_eager"] = median_ms(
            lambda: torch.relu(torch.nn.functional.conv2d(x, wt, b, stride=s, padding=p)))
    for tag, dtype, cl in (("bf16_nhwc", torch.bfloat16, True), ("fp32_nchw", torch.float32, False)):
        fmt = torch.channels_last if cl else torch.contiguous_format
        x = torch.rand(256, 128, 32, 32, device="cuda", dtype=dtype).mul_(2).sub_(1).to(memory_format=fmt)
        g = torch.rand(128, device="cuda") + 0.5
        bb = torch.rand(128, device="cuda") - 0.5
        rm, rv = torch.zeros(128, device="cuda"), torch.ones(128, device="cuda")
        bn = lambda: torch.nn.functional.batch_norm(x, rm, rv, g, bb, training=True, momentum=0.1, eps=1e-5)
        res[f"{tag}/bn_train_256x128x32x32"] = median_ms(bn)
        res[f"{tag}/bn_relu_train_256x128x32x32"] = median_ms(lambda: torch.relu(bn()))
        res[f"{tag}/relu_256x128x32x32"] = median_ms(lambda: torch.relu(x))
        # max pool 2x2: forward alone; backward through autograd with a fixed output gradient
        res[f"{tag}/maxpool2_fwd_256x128x32x32"] = median_ms(lambda: torch.nn.functional.max_pool2d(x, 2))
        xg = x.detach().requires_grad_()
        yg = torch.nn.functional.max_pool2d(xg, 2)
        gy = torch.rand_like(yg).mul_(2).sub_(1)
        res[f"{tag}/maxpool2_bwd_256x128x32x32"] = median_ms(
            lambda: torch.autograd.grad(yg, xg, gy, retain_graph=True))
    return res


def run_general():
    # the general ops of a transformer in bf16, as bench_ops_gpu's bf16_general rows
    res = {}
    bf = dict(device="cuda", dtype=torch.bfloat16)
    r = lambda *s: torch.rand(*s, **bf).mul_(2).sub_(1)
    q, k, v, pr = r(64, 512, 64), r(64, 512, 64), r(64, 512, 64), r(64, 512, 512)
    res["bf16_general/bmm_qk_64x512x64"] = median_ms(lambda: torch.matmul(q, k.transpose(-1, -2)))
    res["bf16_general/bmm_pv_64x512x512x64"] = median_ms(lambda: torch.matmul(pr, v))
    res["bf16_general/softmax_last_64x512x512"] = median_ms(lambda: torch.softmax(pr, -1))
    res["bf16_general/softmax_axis1_64x512x512"] = median_ms(lambda: torch.softmax(pr, 1))
    x, b = r(256, 128, 32, 32), r(128, 1, 1)
    res["bf16_general/add_bcast_256x128x32x32_128x1x1"] = median_ms(lambda: x + b)
    xl = r(8192, 768)
    g, bb = torch.rand(768, device="cuda") + 0.5, torch.rand(768, device="cuda") - 0.5
    try:  # bf16 x with f32 parameters, as cutrain's; older PyTorch wants one dtype
        torch.nn.functional.layer_norm(xl, (768,), g, bb)
    except RuntimeError:
        g, bb = g.bfloat16(), bb.bfloat16()
    res["bf16_general/layer_norm_8192x768"] = median_ms(lambda: torch.nn.functional.layer_norm(xl, (768,), g, bb))
    table, idx = r(50000, 768), torch.randint(0, 50000, (4096,), device="cuda", dtype=torch.int32)
    res["bf16_general/index_select_50000x768_4096"] = median_ms(lambda: torch.index_select(table, 0, idx))
    return res


def run_fusion():
    # the fusions of docs/fusion.md as a PyTorch user writes them (eager ops, bf16), under the names
    # of bench_ops_gpu's bf16_fusion rows: PyTorch's time is the one to compare both cutrain rows with
    res = {}
    bf = dict(device="cuda", dtype=torch.bfloat16)
    r = lambda *s: torch.rand(*s, **bf).mul_(2).sub_(1)
    cl = torch.channels_last
    x, w, b, res_in = r(32, 64, 56, 56).to(memory_format=cl), r(64, 64, 3, 3).to(memory_format=cl), r(64), \
        r(32, 64, 56, 56).to(memory_format=cl)
    F = torch.nn.functional
    block = lambda: F.relu(F.conv2d(x, w, b, padding=1) + res_in)
    a, wm, bm = r(8, 1024, 768), r(768, 3072), r(3072)
    mlp = lambda: F.gelu(torch.matmul(a, wm) + bm)
    xs, sc, sh = r(32, 64, 56, 56).to(memory_format=cl), r(1, 64, 1, 1), r(1, 64, 1, 1)
    norm = lambda: F.relu(xs * sc + sh)
    xt, gt, bt, st = r(8192, 768), r(768), r(768), r(8192, 768)
    mod = lambda: F.silu(F.layer_norm(xt, (768,), gt, bt) * st)
    for name, fn in [("conv_bias_add_relu_32x64x56x56_k64_3x3", block), ("matmul_bias_gelu_8x1024x768_3072", mlp),
                     ("scale_shift_relu_32x64x56x56", norm), ("layer_norm_mul_silu_8192x768", mod)]:
        t = median_ms(fn)
        res[f"bf16_fusion/{name}/fused"] = t
        res[f"bf16_fusion/{name}/unfused"] = t
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cutrain")
    ap.add_argument("--tuned")
    ap.add_argument("--out")
    ap.add_argument("--no-heuristic", action="store_true", help="leave the benchmark-off conv rows out")
    ap.add_argument("--only-fusion", action="store_true", help="time the bf16_fusion rows alone")
    ap.add_argument("--heuristic-out", help=argparse.SUPPRESS)  # the child process of heuristic_ms()
    args = ap.parse_args()
    if args.heuristic_out:
        torch.backends.cudnn.benchmark = False
        json.dump(run_convs(), open(args.heuristic_out, "w"))
        return
    heur = {} if args.no_heuristic or args.only_fusion else heuristic_ms()
    torch.backends.cudnn.benchmark = True
    torch_ms = {}
    if not args.only_fusion:
        torch_ms.update(run_convs())
        torch_ms.update(run_extra())
        torch_ms.update(run_general())
    torch_ms.update(run_fusion())
    if args.out:
        json.dump({"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "ms": torch_ms,
                   "ms_benchmark_off": heur}, open(args.out, "w"), indent=1)
    def load(path):
        out = {}
        if path:
            try:
                rows = json.load(open(path))["benchmarks"]
            except (OSError, ValueError, KeyError) as e:
                print(f"torch_ops: ignoring {path}: {e}")
                return out
            for b in rows:
                if "median_ms" in b:
                    out[b["name"].split("/iterations")[0].replace("/manual_time", "")] = b["median_ms"]
        return out

    cut, tuned = load(args.cutrain), load(args.tuned)
    nan = float("nan")
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    head = f"{'row':42s} {'cutrain ms':>11s} {'torch ms':>9s} {'ratio':>6s}"
    head += f" {'tuned ms':>9s} {'tuned ratio':>11s}" if tuned else ""
    # benchmark off: PyTorch's heuristic plan, its ratio to PyTorch's benchmark mode, and cutrain's
    # heuristic plan against it (heuristics against heuristics)
    head += f" {'torch heur ms':>13s} {'heur/bench':>10s} {'c/t heur':>8s}" if heur else ""
    print(head)
    ratios, tuned_ratios, fused_ratios = [], [], []
    heur_ratios, heur_heur = {}, []
    for key, t in torch_ms.items():
        c, u = cut.get(key), tuned.get(key)
        conv = key.endswith(("/fwd", "/dgrad", "/wgrad"))
        fused = key.endswith("/conv_bias_relu")
        if c and conv:
            ratios.append(c / t)
        if u and conv:
            tuned_ratios.append(u / t)
        if u and fused:
            fused_ratios.append(u / t)
        line = f"{key:42s} {c if c else nan:11.4f} {t:9.4f} {c / t if c else nan:6.2f}"
        if tuned and (conv or fused):
            line += f" {u if u else nan:9.4f} {u / t if u else nan:11.2f}"
        elif tuned and heur.get(key):
            line += " " * 22
        if heur.get(key):
            h = heur[key]
            heur_ratios[key] = h / t
            if c:
                heur_heur.append(c / h)
            line += f" {h:13.4f} {h / t:10.2f} {c / h if c else nan:8.2f}"
        print(line)
    if ratios:
        print(f"geometric mean cutrain/torch over the {len(ratios)} conv fwd/dgrad/wgrad rows: "
              f"{statistics.geometric_mean(ratios):.3f} (heuristic plans)")
    if tuned_ratios:
        print(f"geometric mean cutrain/torch over the {len(tuned_ratios)} conv fwd/dgrad/wgrad rows: "
              f"{statistics.geometric_mean(tuned_ratios):.3f} (tuned plans); at or below PyTorch on "
              f"{sum(r <= 1.0 for r in tuned_ratios)}, within 1.03 on {sum(r <= 1.03 for r in tuned_ratios)}")
    if heur_ratios:
        above = sorted((r, k) for k, r in heur_ratios.items() if r > 1.10)
        print(f"PyTorch's own heuristic plans (benchmark off) against its benchmark mode, {len(heur_ratios)} conv rows: "
              f"geometric mean {statistics.geometric_mean(heur_ratios.values()):.3f}; {len(above)} above 1.10"
              + (": " + ", ".join(f"{k} {r:.2f}" for r, k in reversed(above)) if above else ""))
    if heur_heur:
        print(f"cutrain's heuristic plans against PyTorch's heuristic plans, {len(heur_heur)} conv rows: geometric mean "
              f"{statistics.geometric_mean(heur_heur):.3f}; within 1.10 on {sum(r <= 1.10 for r in heur_heur)}")
    if fused_ratios:
        print(f"fused conv + bias + relu (tuned plans) against PyTorch's conv alone, {len(fused_ratios)} rows: "
              f"within 1.05 on {sum(r <= 1.05 for r in fused_ratios)}, largest {max(fused_ratios):.3f}")


if __name__ == "__main__":
    main()
