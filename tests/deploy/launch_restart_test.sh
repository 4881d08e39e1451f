#!/usr/bin/env bash
# deploy/launch.sh --checkpoint-dir: the server is killed (SIGKILL) mid-training; launch.sh
# starts it again with the same flags, it restores its checkpoint, the adaps-worker processes
# resume it and the job ends with exit 0. Usage: launch_restart_test.sh BUILD_DIR.
#
# The kill must come after a checkpoint that holds the model. The training takes a few
# seconds and a checkpoint's fsync can take longer than that on a loaded disk, so the test
# does not race them: once training has started it stops the job's workers (SIGSTOP), waits
# for a checkpoint of the model (the server is idle then), continues the workers (SIGCONT)
# and kills the server at once.
#
# Every wait has a wall-clock deadline of minutes (a loaded machine, load 20 on 2 cores, runs
# all of this many times slower than an idle one), and the scheduler gets a dead timeout
# longer than the longest wait, so that stopped workers are not declared dead meanwhile (at
# the default 30 s they were, once the test's own steps took that long under load).
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin=${1:-$repo/build}
data=/usr/share/datasets/fashion-mnist
[[ -d $data ]] || { echo "SKIP: Fashion-MNIST is not installed"; exit 77; }
dir=$(mktemp -d /tmp/adaps-launch-restart.XXXXXX)
out=$dir/out.log
workers=()
cleanup() {
  [[ ${#workers[@]} -gt 0 ]] && kill -CONT "${workers[@]}" 2>/dev/null
  [[ -n ${launch:-} ]] && kill "$launch" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail_now() { echo "FAIL: $*"; cat "$out"; exit 1; }
# The pids whose command line matches the extended regex $1. Bash builtins only, no process
# per pid: with hundreds of processes on a loaded machine a fork per pid took tens of seconds.
pids_of() {
  local p args
  for p in /proc/[0-9]*; do
    mapfile -d '' -t args 2>/dev/null <"$p/cmdline" || continue
    [[ "${args[*]}" =~ $1 ]] && echo "${p#/proc/}"
  done
}
# Waits up to $2 seconds for the extended regex $1 in the log; fails early when launch.sh has
# ended.
wait_for() {
  local end=$((SECONDS + $2))
  while [[ $SECONDS -lt $end ]]; do
    grep -qE -- "$1" "$out" && return 0
    kill -0 "$launch" 2>/dev/null || fail_now "launch.sh ended before the log said /$1/"
    sleep 0.1
  done
  grep -qE -- "$1" "$out" || fail_now "no /$1/ in the log after $2 s"
}
# Longest wait for one thing to happen; the scheduler's dead timeout is longer.
wait_s=240

bash "$repo/deploy/launch.sh" --bin "$bin" --servers 1 --workers 2 --timeout 600 \
  --scheduler-args "--dead_timeout_ms=$(((wait_s + 60) * 1000))" \
  --checkpoint-dir "$dir/ckpt" --server-args "--checkpoint_interval_s=1" -- \
  --mode=train --model=mlp --train_limit=16000 --epochs=3 --log_level=warn \
  --data_dir="$data" >"$out" 2>&1 &
launch=$!
# Training has started once a worker reports progress (every tensor is declared by then).
wait_for "step [0-9]+/[0-9]+ " "$wait_s"
sched=$(grep -oE "launch: scheduler at tcp://[0-9.]+:[0-9]+" "$out" | head -1 | sed 's/.* at //')
[[ -n $sched ]] || fail_now "launch.sh did not say where the scheduler is"
mapfile -t workers < <(pids_of "adaps-worker --scheduler=$sched ")
[[ ${#workers[@]} -eq 2 ]] || fail_now "found ${#workers[@]} workers of this job, not 2"
mapfile -t server < <(pids_of "adaps-server .*--checkpoint_dir=$dir/ckpt")
[[ ${#server[@]} -eq 1 ]] || fail_now "found ${#server[@]} servers of this job, not 1"
kill -STOP "${workers[@]}"
# The model's checkpoint: 6 tensors, or 2 slices with fusion of small tensors (the default;
# 3 with a 64 KiB threshold).
before=$(grep -cE "checkpoint of (6|3|2) slices" "$out")
end=$((SECONDS + wait_s))
while [[ $(grep -cE "checkpoint of (6|3|2) slices" "$out") -le $before && $SECONDS -lt $end ]]; do
  kill -0 "$launch" 2>/dev/null || fail_now "launch.sh ended while the workers were stopped"
  sleep 0.1
done
[[ $(grep -cE "checkpoint of (6|3|2) slices" "$out") -gt $before ]] ||
  fail_now "no checkpoint of the model within $wait_s s of stopping the workers"
kill -CONT "${workers[@]}"
kill -KILL "${server[0]}"
wait "$launch"; rc=$?
launch=""
fail=0
[[ $rc -eq 0 ]] || { echo "FAIL: launch.sh exited $rc"; fail=1; }
grep -q "restarting it from its checkpoint" "$out" || { echo "FAIL: the server was not restarted"; fail=1; }
grep -q "restored at step" "$out" || { echo "FAIL: the restarted server did not restore"; fail=1; }
grep -q "final: .*test_acc" "$out" || { echo "FAIL: training did not finish"; fail=1; }
if [[ $fail -ne 0 ]]; then cat "$out"; exit 1; fi
grep "final:" "$out"
echo "PASS: killed server restarted from its checkpoint, job finished with exit 0"
