#!/usr/bin/env python3
"""Checks an ONNX file that deploy::export_onnx wrote: onnx.checker (full check, with shape
inference), then a run in ONNX Runtime's CPU provider on input.npy, compared with expected.npy
(cutrain's own forward) to within 1e-4 of max |expected|.

  tests/onnx_check.py model.onnx input.npy expected.npy

Exit 0: pass; 1: fail; 77: onnx, onnxruntime or numpy is not importable (prints SKIPPED).
"""
import sys


def main(argv):
    if len(argv) != 4:
        print(__doc__.strip())
        return 1
    try:
        import numpy as np
        import onnx
        import onnxruntime as ort
    except ImportError as e:
        print(f"onnx_check: SKIPPED ({e}; scripts/setup installs onnx and onnxruntime)")
        return 77
    model_path, input_path, expected_path = argv[1:]
    try:
        model = onnx.load(model_path)
        x = np.load(input_path)
        want = np.load(expected_path)
    except (OSError, ValueError) as e:
        print(f"onnx_check: FAIL {model_path}: cannot read the files: {e}")
        return 1
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as e:  # onnx.checker.ValidationError, shape inference errors
        print(f"onnx_check: FAIL {model_path}: onnx.checker: {e}")
        return 1
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    got = sess.run(None, {name: x})[0]
    if got.shape != want.shape:
        print(f"onnx_check: FAIL {model_path}: output shape {got.shape}, expected {want.shape}")
        return 1
    scale = max(float(np.abs(want).max()), 1e-30)
    err = float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max())
    ops = [n.op_type for n in model.graph.node]
    status = "ok" if err <= 1e-4 * scale else "FAIL"
    print(f"onnx_check: {status} {model_path}: {len(ops)} nodes, opset {model.opset_import[0].version}, "
          f"onnxruntime {ort.__version__}, max |diff| {err:.3g} vs max |expected| {scale:.3g}")
    return 0 if status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
