#!/usr/bin/env bash
# Cluster benchmark: adaps-worker synthetic mode on loopback beside raw ZeroMQ throughput.
#   bench/cluster/run_cluster_bench.sh BUILD_DIR [SERVERS WORKERS PARAMS LAYERS STEPS]
# Prints one RAW_ZMQ line and one SUMMARY line per configuration (dense, adacomp, topk with
# dense pulls; adacomp with recompressed pulls; adacomp with sparse pulls; CONFIGS picks
# some, e.g. CONFIGS="dense:dense adacomp:sparse"), with `uptime` before and after (the machine
# may be shared: compare only ratios from one run). WORKER_FLAGS: extra adaps-worker flags
# (e.g. WORKER_FLAGS=--compression_threads=0), SERVER_FLAGS extra adaps-server flags (e.g.
# SERVER_FLAGS=--engine_threads=1); the SUMMARY line's compress_ms,
# wire_server_ms and decode_ms are worker 0's per-step breakdown (wire_server_ms: the step
# less compress and decode); server_ms is the servers' engine work on the versions worker 0
# pulled, as the servers reported it in their answers, summed over slices (so over the
# engine threads: it can exceed the step).
set -euo pipefail
build=${1:?build dir}
servers=${2:-1}
workers=${3:-1}
params=${4:-25M}
layers=${5:-10}
steps=${6:-5}
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT

echo "LOAD before: $(uptime)"
# Raw ZeroMQ: one message the size of a layer each way, 10 in flight.
per_layer=$(python3 -c "import sys;s='$params';m={'K':1e3,'M':1e6,'G':1e9};v=float(s[:-1])*m[s[-1]] if s[-1] in m else float(s);print(int(v/$layers*4))")
"$build/worker/adaps-zmq-raw-bench" --bytes="$per_layer" --messages=50 --window="$layers"

for config in ${CONFIGS:-dense:dense adacomp:dense topk:dense adacomp:recompressed adacomp:sparse}; do
  compressor=${config%%:*}
  pull=${config##*:}
  rm -f "$tmp/port"
  "$build/scheduler/adaps-scheduler" --num_servers="$servers" --num_workers="$workers" \
      --port_file="$tmp/port" --log_level=warn --dead_timeout_ms=60000 &
  pids+=($!)
  for _ in $(seq 100); do [[ -s $tmp/port ]] && break; sleep 0.05; done
  addr="tcp://127.0.0.1:$(cat "$tmp/port")"
  for _ in $(seq "$servers"); do
    "$build/server/adaps-server" --scheduler="$addr" --log_level=warn --optimizer=sgd \
        ${SERVER_FLAGS:-} &
    pids+=($!)
  done
  wpids=()
  for w in $(seq "$workers"); do
    "$build/worker/adaps-worker" --scheduler="$addr" --tensors="$params" --layers="$layers" \
        --steps="$steps" --warmup=1 --compressor="$compressor" --pull="$pull" --topk_fraction=0.01 \
        --log_level=warn ${WORKER_FLAGS:-} > "$tmp/worker$w.out" &
    wpids+=($!)
  done
  for p in "${wpids[@]}"; do wait "$p"; done
  grep -h SUMMARY "$tmp"/worker*.out
  sleep 0.5
done
echo "LOAD after: $(uptime)"
