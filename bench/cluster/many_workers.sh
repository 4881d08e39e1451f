#!/bin/bash
# Runs the main command's job with W workers on this machine RUNS times in a row and counts
# the runs that exit 0 (64 workers, 10 runs of 10). Each run:
#   deploy/launch.sh --servers 1 --workers W --server-args "--optimizer=sgd --pull_bin_size=100"
#     -- --mode=train --model=mlp --compressor=adacomp --pull=recompressed --local_momentum=0.9
#        --compress_bias --bin_size_bias=100 --max_steps=100
#   bash bench/cluster/many_workers.sh [W] [RUNS] [BUILD_DIR]
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
workers=${1:-64}
runs=${2:-10}
bin=${3:-$repo/build}
ok=0
for run in $(seq 1 "$runs"); do
  log=$(mktemp)
  start=$(date +%s)
  bash "$repo/deploy/launch.sh" --bin "$bin" --servers 1 --workers "$workers" --timeout 600 \
      --server-args "--optimizer=sgd --pull_bin_size=100" -- --mode=train --model=mlp \
      --compressor=adacomp --pull=recompressed --local_momentum=0.9 --compress_bias \
      --bin_size_bias=100 --max_steps=100 >"$log" 2>&1
  code=$?
  secs=$(( $(date +%s) - start ))
  [[ $code == 0 ]] && ok=$((ok + 1))
  echo "run $run: exit $code in ${secs}s ($(uptime | sed 's/.*load/load/'))"
  if [[ $code != 0 ]]; then grep -iE "error|deadline|failed" "$log" | head -5; fi
  rm -f "$log"
done
echo "$ok of $runs runs with $workers workers exited 0"
