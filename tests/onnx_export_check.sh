#!/usr/bin/env bash
# examples/onnx_export end to end: exports the reference CNN, resnet18_cifar and a model of every
# activation and pool, a model of the norms and softmax, transformer blocks and a small GPT, with cutrain's CPU forward of one batch, then checks each file with
# onnx.checker and ONNX Runtime (tests/onnx_check.py). Exit 77 (skipped) when onnx or
# onnxruntime is not importable.
#   tests/onnx_export_check.sh BUILD_DIR/examples/onnx_export WORK_DIR
set -euo pipefail
exe=$1 work=$2
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
mkdir -p "$work"
"$exe" "$work"
for m in fashion_mnist_cnn resnet18_cifar activations norms transformer gpt; do
  rc=0
  "$python" "$here/tests/onnx_check.py" "$work/$m.onnx" "$work/${m}_input.npy" "$work/${m}_expected.npy" || rc=$?
  ((rc == 0)) || exit "$rc"
done
