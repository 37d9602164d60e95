#!/usr/bin/env bash
# The char_gpt example end to end on the CPU with a tiny model: writes the fortunes corpus,
# trains 40 steps with a checkpoint, stops at step 20, resumes, and checks that the resumed run
# ends where an uninterrupted one does; the resumed run exports the model to ONNX, which
# tests/onnx_check.py runs in ONNX Runtime (a SKIPPED line without onnx). Exit 77 (skipped)
# when the fortunes package is missing.
#   tests/char_gpt_smoke.sh BUILD_DIR/examples/char_gpt WORK_DIR
set -euo pipefail
exe=$1 work=$2
here=$(cd "$(dirname "$0")/.." && pwd)
[[ -d /usr/share/games/fortunes ]] || { echo "char_gpt smoke: SKIPPED (no /usr/share/games/fortunes: scripts/setup)"; exit 77; }
mkdir -p "$work"
"$here/scripts/char-corpus" "$work/fortunes.txt" >/dev/null
flags=(--corpus "$work/fortunes.txt" --device cpu --steps 40 --eval-every 20 --eval-batches 2 --batch 8
       --context 32 --dim 32 --layers 1 --heads 2 --warmup 5 --sample 40)
full=$("$exe" "${flags[@]}" | tail -1)
rm -f "$work/ck.bin"
"$exe" "${flags[@]}" --checkpoint "$work/ck.bin" --stop-after 20 | tail -1
resumed=$("$exe" "${flags[@]}" --checkpoint "$work/ck.bin" --resume --export "$work/gpt.onnx" | tail -1)
# The exported model in ONNX Runtime against cutrain's logits for the same window.
rc=0
"${PYTHON:-python3}" "$here/tests/onnx_check.py" "$work/gpt.onnx" "$work/gpt_input.npy" "$work/gpt_expected.npy" || rc=$?
((rc == 0 || rc == 77)) || exit "$rc"
echo "uninterrupted: $full"
echo "resumed:       $resumed"
# The loss part of the last line ("final val loss L, bpc B, ...") must agree exactly.
[[ ${full%%, median*} == "${resumed%%, median*}" && $full == "final val loss"* ]]
