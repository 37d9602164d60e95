#!/usr/bin/env bash
# Two simulated hosts: two network namespaces joined by a veth pair (10.231.R.1 and .2), each
# running scripts/launch -n 2 of the gpt example (node 0: ranks 0 and 1, which listen for the
# store on 10.231.R.1; node 1: ranks 2 and 3, whose only way to the others is the veth link). The
# 4 ranks of 1 row must train as one process of 4 rows (the val loss within 2e-4).
# Exit 77 (skipped, with the reason) where namespaces cannot be made (not root, no iproute2,
# no CAP_SYS_ADMIN) or the fortunes package is missing; it never passes without running.
#   tests/two_hosts.sh BUILD_DIR/examples/gpt WORK_DIR
set -euo pipefail
exe=$1 work=$2
here=$(cd "$(dirname "$0")/.." && pwd)
skip() { echo "two hosts: SKIPPED ($1)"; exit 77; }
[[ -d /usr/share/games/fortunes ]] || skip "no /usr/share/games/fortunes: scripts/setup"
command -v ip >/dev/null || skip "no ip command: Debian's iproute2"
[[ $(id -u) -eq 0 ]] || skip "not root: ip netns needs CAP_SYS_ADMIN"
{ "$exe" --help 2>&1 || true; } | grep -q "data-parallel" || skip "gpt was built without Gloo"

tag=$(( $$ % 100000 ))
a=cutrain${tag}a b=cutrain${tag}b subnet=10.231.$(( $$ % 250 + 1 ))
cleanup() { ip netns del "$a" 2>/dev/null || true; ip netns del "$b" 2>/dev/null || true; }
trap cleanup EXIT
ip netns add "$a" 2>/dev/null || skip "ip netns add failed (no CAP_SYS_ADMIN in this sandbox?)"
ip netns add "$b"
ip link add "ct${tag}a" type veth peer name "ct${tag}b"
ip link set "ct${tag}a" netns "$a"
ip link set "ct${tag}b" netns "$b"
ip -n "$a" addr add "$subnet.1/24" dev "ct${tag}a"
ip -n "$b" addr add "$subnet.2/24" dev "ct${tag}b"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "ct${tag}a" up
ip -n "$b" link set "ct${tag}b" up

mkdir -p "$work/shards"
"$here/scripts/char-corpus" "$work/fortunes.txt" >/dev/null
"${PYTHON:-python3}" "$here/tests/write_byte_shards.py" "$work/fortunes.txt" "$work/shards"
flags=(--data "$work/shards" --device cpu --preset tiny --vocab 256 --steps 40 --eval-every 20
       --context 32 --warmup 5 --lr 3e-3 --log-every 20)
one=$("$exe" "${flags[@]}" --batch 4 --eval-batches 2 | tail -1)
launch=("$here/scripts/launch" -n 2 --nnodes 2 --master-addr "$subnet.1" --master-port 29611)
ip netns exec "$a" "${launch[@]}" --node-rank 0 "$exe" "${flags[@]}" --batch 1 --eval-batches 8 >"$work/host_a.log" 2>&1 &
host_a=$!
set +e
ip netns exec "$b" "${launch[@]}" --node-rank 1 "$exe" "${flags[@]}" --batch 1 --eval-batches 8 >"$work/host_b.log" 2>&1
rc_b=$?
wait $host_a
rc_a=$?
set -e
echo "--- host A (ranks 0, 1) ---"; tail -3 "$work/host_a.log"
echo "--- host B (ranks 2, 3) ---"; tail -3 "$work/host_b.log"
[[ $rc_a -eq 0 && $rc_b -eq 0 ]] || { echo "two hosts: launch exited $rc_a (host A), $rc_b (host B)"; exit 1; }
two=$(grep "^final val loss" "$work/host_a.log")
echo "1 process:           $one"
echo "2 hosts x 2 ranks:   $two"
awk -v a="$one" -v b="$two" 'BEGIN { split(a, x, /[ ,]+/); split(b, y, /[ ,]+/); d = x[4] - y[4];
  exit !(y[6] == "ranks)" && y[5] == "(4" && (d < 0 ? -d : d) <= 2e-4) }'
