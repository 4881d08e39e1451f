#!/usr/bin/env bash
# deploy/launch.sh --checkpoint-dir: the server is killed (SIGKILL) mid-training; launch.sh
# starts it again with the same flags, it restores its checkpoint, the adaps-worker processes
# resume it and the job ends with exit 0. Usage: launch_restart_test.sh BUILD_DIR.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin=${1:-$repo/build}
data=/usr/share/datasets/fashion-mnist
[[ -d $data ]] || { echo "SKIP: Fashion-MNIST is not installed"; exit 77; }
dir=$(mktemp -d /tmp/adaps-launch-restart.XXXXXX)
trap 'rm -rf "$dir"' EXIT
out=$dir/out.log
bash "$repo/deploy/launch.sh" --bin "$bin" --servers 1 --workers 2 --timeout 240 \
  --checkpoint-dir "$dir/ckpt" --server-args "--checkpoint_interval_s=1" -- \
  --mode=train --model=mlp --train_limit=16000 --epochs=3 --log_level=warn \
  --data_dir="$data" >"$out" 2>&1 &
launch=$!
# Wait for a checkpoint of the model (6 tensors; 3 slices with fusion of small tensors, the
# default), then kill the job's server.
for _ in $(seq 600); do grep -qE "checkpoint of (6|3) slices" "$out" && break; sleep 0.1; done
pid=""
for p in /proc/[0-9]*; do
  if { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -q -- "adaps-server .*--checkpoint_dir=$dir/ckpt"; then
    pid=${p#/proc/}
  fi
done
[[ -n $pid ]] || { echo "FAIL: no server of this job found"; cat "$out"; exit 1; }
kill -KILL "$pid"
wait "$launch"; rc=$?
fail=0
[[ $rc -eq 0 ]] || { echo "FAIL: launch.sh exited $rc"; fail=1; }
grep -q "restarting it from its checkpoint" "$out" || { echo "FAIL: the server was not restarted"; fail=1; }
grep -q "restored at step" "$out" || { echo "FAIL: the restarted server did not restore"; fail=1; }
grep -q "final: .*test_acc" "$out" || { echo "FAIL: training did not finish"; fail=1; }
if [[ $fail -ne 0 ]]; then cat "$out"; exit 1; fi
grep "final:" "$out"
echo "PASS: killed server restarted from its checkpoint, job finished with exit 0"
