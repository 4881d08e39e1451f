#!/usr/bin/env bash
# The executables encrypted with CURVE, as an operator runs them: keys from adaps-keygen, an
# adaps-scheduler and an adaps-server serving only the listed keys, and two adaps-worker
# processes with --curve_server_key (the cluster's .pub) and --curve_client_key (their own
# pair) train a few synthetic steps: both exit 0, the scheduler and the server exit 0. A
# worker with an unlisted key, and a plaintext one, are refused (exit 1, nothing registered);
# a worker given the server key without a pair of its own is a usage error (exit 2).
# Usage: curve_executables_test.sh BUILD_DIR.
#
# Deadlines are minutes (a loaded machine runs all of this many times slower than an idle
# one); only the refused workers' --register_timeout_ms is short, because they fail anyway.
set -uo pipefail
build=$(cd "${1:?build dir}" && pwd)
dir=$(mktemp -d /tmp/adaps-curve-exe.XXXXXX)
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  local f
  for f in "$dir"/*.log; do echo "== $f"; cut -c1-300 "$f" | tail -20; done
  exit 1
}
cd "$dir" || exit 1
for name in cluster server0 worker0 worker1 intruder; do
  "$build/scheduler/adaps-keygen" "$name" >/dev/null || fail "adaps-keygen $name"
done
cat server0.pub worker0.pub worker1.pub >allowed

"$build/scheduler/adaps-scheduler" --num_servers=1 --num_workers=2 --port=0 --port_file=port \
  --curve_server_key=cluster.key --curve_allowed_clients=allowed >scheduler.log 2>&1 &
scheduler=$!
pids+=("$scheduler")
end=$((SECONDS + 120))
while [[ ! -s port && $SECONDS -lt $end ]]; do
  kill -0 "$scheduler" 2>/dev/null || fail "the scheduler exited"
  sleep 0.1
done
[[ -s port ]] || fail "the scheduler wrote no port file within 120 s"
address=tcp://127.0.0.1:$(cat port)
"$build/server/adaps-server" --scheduler="$address" --curve_server_key=cluster.key \
  --curve_allowed_clients=allowed --curve_client_key=server0.key >server.log 2>&1 &
server=$!
pids+=("$server")

worker=("$build/worker/adaps-worker" --scheduler="$address" --mode=synthetic --tensors=200K
        --layers=2 --steps=5 --warmup=1)
# Refused before the job formed (it waits for two workers, so nothing else could answer).
timeout 300 "${worker[@]}" --curve_server_key=cluster.pub --curve_client_key=intruder.key \
  --register_timeout_ms=3000 >intruder.log 2>&1
rc=$?
[[ $rc -eq 1 ]] || fail "a worker with an unlisted key exited $rc, not 1"
timeout 300 "${worker[@]}" --register_timeout_ms=3000 >plaintext.log 2>&1
rc=$?
[[ $rc -eq 1 ]] || fail "a plaintext worker exited $rc, not 1"
timeout 300 "${worker[@]}" --curve_server_key=cluster.pub >nopair.log 2>&1
rc=$?
[[ $rc -eq 2 ]] && grep -q -- "--curve_client_key" nopair.log ||
  fail "a worker with --curve_server_key and no pair of its own exited $rc, not 2 naming --curve_client_key"
grep -qE "Worker [0-9]+ registered" scheduler.log && fail "the scheduler registered a refused worker"

for w in 0 1; do
  timeout 300 "${worker[@]}" --curve_server_key=cluster.pub --curve_client_key="worker$w.key" \
    >"worker$w.log" 2>&1 &
  pids+=($!)
  workers[w]=$!
done
for w in 0 1; do
  wait "${workers[w]}"
  rc=$?
  [[ $rc -eq 0 ]] || fail "encrypted worker $w exited $rc"
done
grep -q "^SUMMARY " worker0.log worker1.log || fail "no SUMMARY line from the encrypted workers"
for role in scheduler server; do
  end=$((SECONDS + 120))
  while kill -0 "${!role}" 2>/dev/null && [[ $SECONDS -lt $end ]]; do sleep 0.1; done
  kill -0 "${!role}" 2>/dev/null && fail "the $role did not exit within 120 s of the job's end"
  wait "${!role}"
  rc=$?
  [[ $rc -eq 0 ]] || fail "the $role exited $rc"
done
grep -q "cluster complete: 1 servers, 2 workers" scheduler.log || fail "the cluster did not form"
echo "PASS: two encrypted adaps-worker processes trained; unlisted and plaintext workers refused"
