#!/usr/bin/env python3
"""ONNX Runtime's CPU provider on the models bench/bench_deploy_cpu exported, against cutrain's
CPU engine, with the ratios.

  bench/ort_deploy.py bench_deploy_cpu.json [--threads N] [--out FILE]

bench_deploy_cpu.json is bench_deploy_cpu's output (it names each model's ONNX file per batch
size). Each file runs in an InferenceSession with CPUExecutionProvider, all graph optimizations
on, intra- and inter-op threads set to --threads (default: the thread count bench_deploy_cpu ran with),
sequential execution, on a random f32 input of the file's shape; timed as bench_deploy_cpu times
the engine: 3 warm-up calls, then as many calls as fit in ~2 s (at least 5), median. Prints a
table of cutrain / ONNX Runtime per row; --out writes the rows as JSON.
"""
import argparse
import json
import time

import numpy as np
import onnxruntime as ort


def median_ms(fn):
    for _ in range(3):
        fn()
    ms = []
    start = time.perf_counter()
    while len(ms) < 5 or (time.perf_counter() - start < 2.0 and len(ms) < 200):
        t0 = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(ms))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cutrain")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--out")
    a = ap.parse_args()
    with open(a.cutrain) as f:
        ours = json.load(f)
    if a.threads is None:
        a.threads = ours.get("threads", 1)
    rows = []
    print(f"ONNX Runtime {ort.__version__} CPUExecutionProvider, {a.threads} thread(s), f32, median ms per call")
    print(f"{'model':<20} {'batch':>5} {'cutrain':>10} {'onnxruntime':>12} {'ratio':>7}")
    for m in ours["models"]:
        for r in m["rows"]:
            so = ort.SessionOptions()
            so.intra_op_num_threads = a.threads
            so.inter_op_num_threads = a.threads
            so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            sess = ort.InferenceSession(r["onnx"], so, providers=["CPUExecutionProvider"])
            inp = sess.get_inputs()[0]
            x = np.random.default_rng(1).standard_normal(inp.shape, dtype=np.float32)
            ms = median_ms(lambda: sess.run(None, {inp.name: x}))
            ratio = r["engine_ms"] / ms
            print(f"{m['model']:<20} {r['batch']:>5} {r['engine_ms']:>10.3f} {ms:>12.3f} {ratio:>7.2f}")
            rows.append({"model": m["model"], "batch": r["batch"], "cutrain_ms": r["engine_ms"], "ort_ms": ms,
                         "ratio": ratio})
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"onnxruntime": ort.__version__, "threads": a.threads,
                       "cutrain_gemm": ours.get("gemm", "Eigen"), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
