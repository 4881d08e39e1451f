#!/usr/bin/env bash
# Multi-host test on one machine: 7 network namespaces joined by a bridge, each a host with
# its own address; the scheduler, 2 servers and 4 workers run on different hosts, started by
# deploy/launch.sh exactly as across machines (--via "ip netns exec ..." instead of ssh).
# The Fashion-MNIST MLP must train to the same accuracy as the same run on loopback.
# Exits 77 (ctest: skipped) with a reason when namespaces cannot be made here.
# Each run's deadline (launch.sh --timeout) is for a hang: a run takes well under a minute
# idle and several at load 20 on 2 cores.
#
#   tests/deploy/netns_cluster_test.sh BUILD_DIR
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(cd "${1:?build dir}" && pwd)
if ! why=$(bash "$repo/deploy/netns-hosts.sh" check); then
  echo "SKIPPED: $why"
  exit 77
fi
[[ -d /usr/share/datasets/fashion-mnist ]] || { echo "SKIPPED: dataset-fashion-mnist missing"; exit 77; }

prefix="adaps$$"
trap 'bash "$repo/deploy/netns-hosts.sh" down "$prefix"' EXIT
bash "$repo/deploy/netns-hosts.sh" up "$prefix" 7 || { echo "FAILED: could not create the hosts"; exit 1; }
hosts=$(for i in $(seq 0 6); do bash "$repo/deploy/netns-hosts.sh" addr "$prefix" "$i"; done | paste -sd,)

train=(--mode=train --model=mlp --compressor=adacomp --pull=recompressed --train_limit=16000
       --epochs=3 --log_level=warn)
quiet=(--scheduler-args --log_level=warn --server-args "--optimizer=momentum --log_level=warn")

run_timeout=900
acc_of() { sed -n 's/.*final: .* test_acc \([0-9.]*\) .*/\1/p' "$1" | head -1; }

echo "== namespaces: hosts $hosts"
bash "$repo/deploy/launch.sh" --bin "$bin" --servers 2 --workers 4 --hosts "$hosts" \
  --via "ip netns exec $prefix-h{index}" --timeout "$run_timeout" "${quiet[@]}" -- "${train[@]}" \
  >"/tmp/$prefix-netns.log" 2>&1
rc=$?
grep -E "final:|launch:" "/tmp/$prefix-netns.log"
[[ $rc -eq 0 ]] || { tail -30 "/tmp/$prefix-netns.log"; echo "FAILED: the namespace cluster failed"; exit 1; }

echo "== loopback: same run"
bash "$repo/deploy/launch.sh" --bin "$bin" --servers 2 --workers 4 --timeout "$run_timeout" "${quiet[@]}" \
  -- "${train[@]}" >"/tmp/$prefix-loop.log" 2>&1 || { tail -30 "/tmp/$prefix-loop.log"; echo "FAILED: loopback run"; exit 1; }
grep -E "final:" "/tmp/$prefix-loop.log"

a=$(acc_of "/tmp/$prefix-netns.log") b=$(acc_of "/tmp/$prefix-loop.log")
rm -f "/tmp/$prefix-netns.log" "/tmp/$prefix-loop.log"
[[ -n $a && -n $b ]] || { echo "FAILED: no final accuracy line"; exit 1; }
if /usr/bin/python3 -c "import sys; a,b=float('$a'),float('$b'); sys.exit(0 if a>=0.80 and abs(a-b)<=0.02 else 1)"; then
  echo "PASSED: namespaces test_acc $a, loopback $b"
else
  echo "FAILED: namespaces test_acc $a vs loopback $b (need >= 0.80 and within 0.02)"
  exit 1
fi
