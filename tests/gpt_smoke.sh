#!/usr/bin/env bash
# The gpt example end to end on the CPU with the tiny preset: writes byte-level token shards of a
# text (llm.c's .bin format, train and val), trains 40 steps with a checkpoint, stops at step 20,
# resumes, and checks that the resumed run ends where an uninterrupted one does; then a run with
# --recompute and two micro-batches; then 2 and 4 ranks through scripts/launch, and a ZeRO-1
# checkpoint resumed at other world sizes. Exit 77 (skipped) when the fortunes package is missing.
#   tests/gpt_smoke.sh BUILD_DIR/examples/gpt WORK_DIR
set -euo pipefail
exe=$1 work=$2
here=$(cd "$(dirname "$0")/.." && pwd)
[[ -d /usr/share/games/fortunes ]] || { echo "gpt smoke: SKIPPED (no /usr/share/games/fortunes: scripts/setup)"; exit 77; }
mkdir -p "$work/shards"
"$here/scripts/char-corpus" "$work/fortunes.txt" >/dev/null
"${PYTHON:-python3}" "$here/tests/write_byte_shards.py" "$work/fortunes.txt" "$work/shards"
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
# Data-parallel through scripts/launch: 2 ranks of 2 rows and 4 ranks of 1 row train as one
# process of 4 rows (the shards split by rank, gradients averaged on Gloo); the val batches are
# made the same rows. f32 sums in another order: the val loss agrees to its printed 4 decimals,
# or within 2e-4.
if { "$exe" --help 2>&1 || true; } | grep -q "data-parallel"; then
  one=$("$exe" "${flags[@]}" --eval-batches 2 | tail -1)
  for n in 2 4; do
    dp=$("$here/scripts/launch" -n $n "$exe" "${flags[@]}" --batch $((4 / n)) --eval-batches $((2 * n)) | tail -1)
    echo "1 rank: $one"
    echo "$n ranks: $dp"
    awk -v a="$one" -v b="$dp" 'BEGIN { split(a, x, /[ ,]+/); split(b, y, /[ ,]+/); d = x[4] - y[4];
      exit !(y[1] == "final" && (d < 0 ? -d : d) <= 2e-4) }'
  done
  # ZeRO-1 on 2 ranks, stopped at step 20: its checkpoint resumes on 2 ZeRO ranks, in one plain
  # process and on 4 ZeRO ranks, each to the uninterrupted run's val loss.
  rm -f "$work/z.ck"
  "$here/scripts/launch" -n 2 "$exe" "${flags[@]}" --batch 2 --eval-batches 4 --zero --checkpoint "$work/z.ck" \
    --stop-after 20 | tail -1
  for run in "2 2 4 --zero" "1 4 2" "4 1 8 --zero"; do
    read -r n b e z <<<"$run"
    cp "$work/z.ck" "$work/z_$n.ck"
    got=$("$here/scripts/launch" -n "$n" "$exe" "${flags[@]}" --batch "$b" --eval-batches "$e" ${z:-} \
          --checkpoint "$work/z_$n.ck" --resume | tail -1)
    echo "ZeRO checkpoint resumed on $n rank(s)${z:+ with $z}: $got"
    awk -v a="$one" -v b="$got" 'BEGIN { split(a, x, /[ ,]+/); split(b, y, /[ ,]+/); d = x[4] - y[4];
      exit !(y[1] == "final" && (d < 0 ? -d : d) <= 2e-4) }'
  done
else
  echo "gpt smoke: data-parallel part SKIPPED (gpt built without Gloo)"
fi
