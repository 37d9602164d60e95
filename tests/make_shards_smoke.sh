#!/usr/bin/env bash
# make_shards end to end on the first 20,000 lines of the fortunes corpus: trains a 512-piece BPE
# model, writes train and val shards and checks that they decode to the text (--check); then
# encodes the same bytes given as two files with the saved model and checks that the shards are
# the same bytes. Exit 77 (skipped) when the fortunes package is missing.
#   tests/make_shards_smoke.sh BUILD_DIR/examples/make_shards WORK_DIR
set -euo pipefail
exe=$1 work=$2
here=$(cd "$(dirname "$0")/.." && pwd)
[[ -d /usr/share/games/fortunes ]] || { echo "make_shards smoke: SKIPPED (no /usr/share/games/fortunes: scripts/setup)"; exit 77; }
rm -rf "$work"
mkdir -p "$work/a" "$work/b"
"$here/scripts/char-corpus" "$work/fortunes.txt" >/dev/null
head -n 20000 "$work/fortunes.txt" >"$work/corpus.txt"
head -n 7000 "$work/corpus.txt" >"$work/part1.txt"
tail -n +7001 "$work/corpus.txt" >"$work/part2.txt"

"$exe" --input "$work/corpus.txt" --out "$work/a" --name smoke --vocab 512 --shard-tokens 100000 --check
"$exe" --input "$work/part1.txt" --input "$work/part2.txt" --out "$work/b" --name smoke --model "$work/a/smoke" \
       --shard-tokens 100000 --check

shards=("$work"/a/smoke_*.bin)
((${#shards[@]} >= 3)) || { echo "make_shards smoke: expected several train shards and a val shard, got ${shards[*]}"; exit 1; }
[[ -f $work/a/smoke_val_000000.bin && -f $work/a/smoke_train_000001.bin ]]
[[ $(cd "$work/a" && ls smoke_*.bin) == $(cd "$work/b" && ls smoke_*.bin) ]]
for f in "${shards[@]}"; do cmp "$f" "$work/b/$(basename "$f")"; done
echo "make_shards smoke: ${#shards[@]} shards round-trip, and the saved model encodes them again byte for byte"
