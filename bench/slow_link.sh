#!/usr/bin/env bash
# Slow-network benchmark: 7 hosts in network namespaces (deploy/netns-hosts.sh) whose links
# are limited to RATE by tc tbf in both directions; the scheduler, 2 servers and 4 workers
# run on different hosts. Trains the Fashion-MNIST MLP with dense (dense pulls) and with
# AdaComp (recompressed pulls), same seed and cosine learning rate, and prints the time per
# step and the time to reach TARGET test accuracy (rank 0 evaluates every 25 steps; the
# evaluation time is not counted). Needs root. Run by hand; the figures go to docs/benchmarks.md.
#
#   bench/slow_link.sh [BUILD_DIR] [RATE] [TARGET]     defaults: build 100mbit 0.80
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=$(cd "${1:-$repo/build}" && pwd)
rate=${2:-100mbit}
target=${3:-0.80}
why=$(bash "$repo/deploy/netns-hosts.sh" check) || { echo "slow_link: $why" >&2; exit 1; }
prefix="adapsbw$$"
trap 'bash "$repo/deploy/netns-hosts.sh" down "$prefix"' EXIT
bash "$repo/deploy/netns-hosts.sh" up "$prefix" 7 "$rate"
hosts=$(for i in $(seq 0 6); do bash "$repo/deploy/netns-hosts.sh" addr "$prefix" "$i"; done | paste -sd,)
out=$(mktemp -d)

run() {  # name compressor pull
  local name=$1
  echo "== $name over $rate links" >&2
  bash "$repo/deploy/launch.sh" --bin "$bin" --servers 2 --workers 4 --hosts "$hosts" \
    --via "ip netns exec $prefix-h{index}" --timeout 1800 \
    --scheduler-args --log_level=warn --server-args "--optimizer=momentum --log_level=warn" \
    -- --mode=train --model=mlp --compressor="$2" --pull="$3" --train_limit=16000 --epochs=4 \
       --eval_every=25 --seed=1 --log_level=warn --request_timeout_ms=120000 \
    >"$out/$name.log" 2>&1 || { tail -20 "$out/$name.log"; echo "slow_link: $name failed" >&2; exit 1; }
  grep -E "\] (epoch|final|step)" "$out/$name.log" | sed 's/^\[worker [0-9]*\] //' >&2
}
run dense dense dense
run adacomp adacomp recompressed

/usr/bin/python3 - "$out" "$target" "$rate" <<'PY'
import re, sys
out, target, rate = sys.argv[1], float(sys.argv[2]), sys.argv[3]
rows = {}
for name in ("dense", "adacomp"):
    text = open(f"{out}/{name}.log").read()
    epochs = [(float(a), float(s), float(e)) for a, s, e in re.findall(
        r"test_acc ([0-9.]+)\s+step ([0-9.]+) ms.*elapsed ([0-9.]+) s", text)]
    pushed = re.search(r"final: .*pushed ([0-9.]+) MB per worker.*pulled ([0-9.]+) MB", text)
    evals = [(float(a), float(e)) for a, e in re.findall(
        r"step \d+  test_acc ([0-9.]+)  elapsed ([0-9.]+) s", text)]
    reach = next((e for a, e in evals if a >= target), None)
    rows[name] = dict(step=sum(s for _, s, _ in epochs) / len(epochs), final=epochs[-1][0],
                      reach=reach, pushed=float(pushed.group(1)), pulled=float(pushed.group(2)))
print(f"\nlinks {rate}, MLP, 4 workers, 2 servers, 500 steps of 32 per worker")
print(f"{'':10} {'step ms':>9} {'final acc':>10} {'time to ' + str(target):>14} {'pushed MB':>10} {'pulled MB':>10}")
for name, r in rows.items():
    reach = f"{r['reach']:.1f} s" if r["reach"] is not None else "not reached"
    print(f"{name:10} {r['step']:9.1f} {r['final']:10.4f} {reach:>14} {r['pushed']:10.2f} {r['pulled']:10.2f}")
d, a = rows["dense"], rows["adacomp"]
print(f"step time ratio dense/adacomp: {d['step'] / a['step']:.1f}x")
if d["reach"] and a["reach"]:
    print(f"time-to-accuracy ratio dense/adacomp: {d['reach'] / a['reach']:.1f}x")
PY
rm -rf "$out"
