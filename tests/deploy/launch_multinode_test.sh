#!/usr/bin/env bash
# `python3 -m adaps.launch --nnodes 2` across two machines: two network namespaces, each a
# host with its own address (deploy/netns-hosts.sh), each running the launch of its node
# rank with --rdzv at host 0's address, 2 workers of tests/python/checksum_worker.py each
# and --colocate (one server per node, node 1's advertised at its own address). Both nodes
# must exit 0, the 4 workers agree on their parameters' checksum, and the scheduler must
# have registered node 1's server at node 1's address.
# Exits 77 (ctest: skipped) with a reason when namespaces cannot be made here or the
# Python package or torch is missing. Needs root.
#
#   tests/deploy/launch_multinode_test.sh BUILD_DIR
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(cd "${1:?build dir}" && pwd)
python=/usr/bin/python3
if ! why=$(bash "$repo/deploy/netns-hosts.sh" check); then
  echo "SKIPPED: $why"
  exit 77
fi
compgen -G "$bin/python/adaps/_core*.so" >/dev/null || { echo "SKIPPED: the Python package is not built ($bin/python)"; exit 77; }
"$python" -c "import torch" 2>/dev/null || { echo "SKIPPED: $python has no torch"; exit 77; }

prefix="admn$$"
work=$(mktemp -d /tmp/adaps-launch-multinode.XXXXXX)
pids=()
cleanup() {
  # The launches first (each stops its own processes), then whatever is left in the
  # namespaces (netns-hosts.sh down kills it).
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
  done
  bash "$repo/deploy/netns-hosts.sh" down "$prefix"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
bash "$repo/deploy/netns-hosts.sh" up "$prefix" 2 || { echo "FAILED: could not create the hosts"; exit 1; }
a0=$(bash "$repo/deploy/netns-hosts.sh" addr "$prefix" 0)
a1=$(bash "$repo/deploy/netns-hosts.sh" addr "$prefix" 1)
port=29400  # the namespaces are fresh: nothing else listens there

# Minutes, not seconds: at load 20, 4 torch processes take long to start.
deadline_s=600
run_node() {
  local node=$1
  ip netns exec "$prefix-h$node" env PYTHONPATH="$bin/python" ADAPS_BIN_DIR="$bin" \
    PYTHONDONTWRITEBYTECODE=1 timeout "$deadline_s" "$python" -m adaps.launch \
    --bin-dir "$bin" --nnodes 2 --node-rank "$node" --rdzv "$a0:$port" \
    --rdzv-timeout "$deadline_s" -n 2 --colocate --log-level info \
    "$repo/tests/python/checksum_worker.py" >"$work/node$node.log" 2>&1
}
echo "== node 0 at $a0, node 1 at $a1, rendezvous $a0:$port"
run_node 1 & pids+=($!)  # node 1 first: it waits for node 0's scheduler
run_node 0 & pids+=($!)
wait "${pids[0]}"; rc1=$?
wait "${pids[1]}"; rc0=$?
pids=()
grep -hE "CHECKSUM|adaps.launch|error" "$work/node0.log" "$work/node1.log"
fail() {
  echo "--- node 0"; tail -40 "$work/node0.log"; echo "--- node 1"; tail -40 "$work/node1.log"
  echo "FAILED: $*"
  exit 1
}
[[ $rc0 -eq 0 && $rc1 -eq 0 ]] || fail "node 0 exited with $rc0, node 1 with $rc1"
sums=$(cat "$work/node0.log" "$work/node1.log" | sed -n 's/.*CHECKSUM rank \([0-9]*\) of 4 .* sha256 \([0-9a-f]*\)$/\1 \2/p')
[[ $(echo "$sums" | awk '{print $1}' | sort | paste -sd,) == "0,1,2,3" ]] || fail "not one checksum from each of ranks 0-3 of 4: $sums"
[[ $(echo "$sums" | awk '{print $2}' | sort -u | wc -l) -eq 1 ]] || fail "the replicas differ: $sums"
[[ $(grep -c "CHECKSUM" "$work/node1.log") -eq 2 ]] || fail "node 1 did not run 2 workers"
grep -q "registered at tcp://$a1:" "$work/node0.log" || fail "no server registered at node 1's address $a1"
echo "PASSED: 2 nodes x 2 workers, every replica $(echo "$sums" | awk 'NR==1{print $2}')"
