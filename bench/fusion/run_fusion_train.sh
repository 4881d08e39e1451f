#!/usr/bin/env bash
# Fusion of small tensors, measured on the built-in trainer: adaps-worker --mode=train on
# loopback (1 server, WORKERS workers), with fusion on (the default, 256 KiB) and off, printing
# each run's final line (test accuracy and the per-layer-type push compression rates).
#   bench/fusion/run_fusion_train.sh BUILD_DIR [MODEL WORKERS TRAIN_LIMIT EPOCHS] [-- EXTRA WORKER FLAGS]
set -euo pipefail
build=${1:?build dir}
model=${2:-mlp}
workers=${3:-2}
limit=${4:-16000}
epochs=${5:-1}
shift $(( $# < 5 ? $# : 5 ))
[[ ${1:-} == -- ]] && shift
extra=("$@")
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
for threshold in 65536 0; do
  rm -f "$tmp/port"
  "$build/scheduler/adaps-scheduler" --num_servers=1 --num_workers="$workers" \
      --port_file="$tmp/port" --log_level=warn &
  pids+=($!)
  for _ in $(seq 100); do [[ -s $tmp/port ]] && break; sleep 0.05; done
  addr="tcp://127.0.0.1:$(cat "$tmp/port")"
  "$build/server/adaps-server" --scheduler="$addr" --log_level=warn --optimizer=momentum \
      --momentum=0.9 &
  pids+=($!)
  wpids=()
  for w in $(seq "$workers"); do
    "$build/worker/adaps-worker" --scheduler="$addr" --mode=train --model="$model" \
        --train_limit="$limit" --epochs="$epochs" --batch=32 --lr=0.05 --log_level=warn \
        --fusion_threshold="$threshold" "${extra[@]}" > "$tmp/worker$w.out" 2>&1 &
    wpids+=($!)
  done
  for p in "${wpids[@]}"; do wait "$p"; done
  echo "fusion_threshold=$threshold ${extra[*]}"
  grep -h "final:" "$tmp"/worker*.out | head -1
  sleep 0.5
done
