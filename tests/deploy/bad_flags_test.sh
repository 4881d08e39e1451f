#!/usr/bin/env bash
# Every executable refuses bad flags at once, before any network activity: it exits with 2
# (usage error), with one line on stderr naming the flag, and no scheduler running (a
# process that got as far as the network would wait for the scheduler and exit 1, or hang).
# --help exits 0 and shows no build paths.
#
# A hang is caught by a deadline of $limit seconds per process: generous, because a process
# that exits at once can still take seconds to start and exit on a loaded machine (load 20 on
# 2 cores); the slowest exit is printed at the end.
#   tests/deploy/bad_flags_test.sh BUILD_DIR
set -uo pipefail
build=$(cd "${1:?build dir}" && pwd)
failures=0
limit=60
slowest_ms=0 slowest=""
sched="--scheduler=tcp://127.0.0.1:1"  # nothing listens there
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# run_timed ROLE ARGS...: runs adaps-ROLE with a deadline of $limit s (exit 124 past it),
# records the slowest run, and sets rc and ms.
run_timed() {
  local role=$1
  shift
  local start_ns
  start_ns=$(date +%s%N)
  timeout -k 5 "$limit" "$build/$role/adaps-$role" "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  ms=$((($(date +%s%N) - start_ns) / 1000000))
  if [[ $ms -gt $slowest_ms ]]; then slowest_ms=$ms slowest="adaps-$role $*"; fi
}

# expect ROLE FLAG_NAMED ARGS...: exit 2, stderr one line naming --FLAG_NAMED.
expect() {
  local role=$1 flag=$2
  shift 2
  run_timed "$role" "$@"
  if [[ $rc -ne 2 ]] || ! grep -q -- "--$flag" "$tmp/err" || [[ $(wc -l <"$tmp/err") -ne 1 ]]; then
    echo "FAILED: adaps-$role $* -> exit $rc after $ms ms (124: still running after $limit s), stderr: $(head -3 "$tmp/err")"
    failures=$((failures + 1))
  else
    echo "ok: adaps-$role $* -> $(cat "$tmp/err")"
  fi
}

for role in scheduler server; do
  extra=()
  [[ $role == server ]] && extra=("$sched")
  expect $role port "${extra[@]}" --port=-1
  expect $role port "${extra[@]}" --port=70000
  expect $role host "${extra[@]}" --host=no-such-host.invalid
  expect $role host "${extra[@]}" --host=256.1.1.1
  expect $role port "${extra[@]}" --port=abc
  expect $role bogus "${extra[@]}" --bogus=1
done
ADAPS_PORT=99999 expect scheduler port  # a function call passes the variable on (no subshell: its failure counts)
expect scheduler num_workers --num_workers=0
expect scheduler num_servers --num_servers=-1
expect scheduler heartbeat_ms --heartbeat_ms=0
expect scheduler dead_timeout_ms --dead_timeout_ms=0
expect scheduler reform_timeout_ms --reform_timeout_ms=0
expect server scheduler --scheduler=tcp://127.0.0.1:70000
expect server register_timeout_ms "$sched" --register_timeout_ms=0
expect server max_slice_elements "$sched" --max_slice_elements=0
expect server pull_bin_size "$sched" --pull_bin_size=-1
expect worker scheduler
expect worker scheduler --scheduler=127.0.0.1:5510
expect worker bin_size "$sched" --bin_size=0
expect worker layers "$sched" --layers=0
expect worker steps "$sched" --steps=0
expect worker tensors "$sched" --tensors=0
expect worker gradients "$sched" --gradients=bogus
expect worker request_timeout_ms "$sched" --request_timeout_ms=0
expect worker register_timeout_ms "$sched" --register_timeout_ms=-5
expect worker topk_fraction "$sched" --topk_fraction=2
expect worker data_dir "$sched" --mode=train --data_dir="$tmp/no-such-dir"
expect worker batch "$sched" --mode=train --batch=0
expect worker bin_size_fc "$sched" --mode=train --bin_size_fc=0
expect worker bin_size_bias "$sched" --mode=train --bin_size_bias=-1
expect worker local_momentum "$sched" --mode=train --local_momentum=1
expect worker local_momentum "$sched" --mode=train --local_momentum=-0.5
# CURVE: the cluster's public key without a key pair of the worker's own.
if "$build/scheduler/adaps-keygen" "$tmp/cluster" >/dev/null; then
  expect worker curve_client_key "$sched" --curve_server_key="$tmp/cluster.pub"
else
  echo "FAILED: adaps-keygen $tmp/cluster"
  failures=$((failures + 1))
fi

for role in scheduler server worker; do
  run_timed "$role" --help
  cat "$tmp/out" "$tmp/err" >"$tmp/help"
  if [[ $rc -ne 0 ]] || grep -qE '\.cc\b|\.\./' "$tmp/help" || ! grep -q -- '--port\|--scheduler' "$tmp/help" ||
     ! grep -q "Exit codes" "$tmp/help"; then
    echo "FAILED: adaps-$role --help -> exit $rc: $(grep -m1 -E '\.cc|\.\./' "$tmp/help")"
    failures=$((failures + 1))
  else
    echo "ok: adaps-$role --help exits 0, $(grep -c -- '^  --' "$tmp/help") flags, no build path"
  fi
done

echo "slowest: $slowest in $slowest_ms ms"
[[ $failures -eq 0 ]] || { echo "FAILED: $failures checks"; exit 1; }
echo PASSED
