#!/usr/bin/env bash
# The gpt example end to end on the CPU with the tiny preset: writes byte-level token shards of a
# text (llm.c's .bin format, train and val), trains 40 steps with a checkpoint, stops at step 20,
# resumes, and checks that the resumed run ends where an uninterrupted one does; then a run with
# --recompute and two micro-batches. Exit 77 (skipped) when the fortunes package is missing.
#   tests/gpt_smoke.sh BUILD_DIR/examples/gpt WORK_DIR
set -euo pipefail
exe=$1 work=$2
here=$(cd "$(dirname "$0")/.." && pwd)
[[ -d /usr/share/games/fortunes ]] || { echo "gpt smoke: SKIPPED (no /usr/share/games/fortunes: scripts/setup)"; exit 77; }
mkdir -p "$work/shards"
"$here/scripts/char-corpus" "$work/fortunes.txt" >/dev/null
"${PYTHON:-python3}" - "$work/fortunes.txt" "$work/shards" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()[:400_000]
cut = len(data) * 9 // 10
for name, part in (("smoke_train_000000.bin", data[:cut]), ("smoke_val_000000.bin", data[cut:])):
    with open(f"{sys.argv[2]}/{name}", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(part), *([0] * 253)))
        f.write(struct.pack(f"<{len(part)}H", *part))
PY
flags=(--data "$work/shards" --device cpu --preset tiny --vocab 256 --steps 40 --eval-every 20 --eval-batches 2
       --batch 4 --context 32 --warmup 5 --lr 3e-3 --sample 16 --log-every 20)
full=$("$exe" "${flags[@]}" | tail -1)
rm -f "$work/ck.bin"
"$exe" "${flags[@]}" --checkpoint "$work/ck.bin" --stop-after 20 | tail -1
resumed=$("$exe" "${flags[@]}" --checkpoint "$work/ck.bin" --resume | tail -1)
echo "uninterrupted: $full"
echo "resumed:       $resumed"
# The loss part of the last line ("final val loss L, median step ...") must agree exactly.
[[ ${full%%, median*} == "${resumed%%, median*}" && $full == "final val loss"* ]]
# Recomputation and gradient accumulation train too (the loss is finite and below ln 256 = 5.55).
last=$("$exe" "${flags[@]}" --recompute --grad-accum 2 --batch 2 | tail -1)
echo "recompute, 2 micro-batches: $last"
awk -v line="$last" 'BEGIN { split(line, f, /[ ,]+/); exit !(f[4] + 0 > 0 && f[4] + 0 < 5.55) }'
