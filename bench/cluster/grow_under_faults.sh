#!/bin/bash
# Growth under faults (docs/benchmarks.md "Growing from 4 to 8 workers with a
# server killed"): the main command's job (MLP, AdaComp pushes, momentum correction,
# recompressed pulls at bin 100, SGD on the servers) on this machine, 1 server with an
# identity and checkpoints, rank 0 evaluating every EVAL steps. Two runs to compare:
#   bench/cluster/grow_under_faults.sh steady [SEED]   8 workers from the start, undisturbed
#   bench/cluster/grow_under_faults.sh grow [SEED]     4 workers; 4 more join after JOIN_S
#       seconds (adaps-scheduler --max_workers=8); the server is killed (SIGKILL) every KILL_S
#       seconds and started again with the same flags (it restores its checkpoint)
# Environment: STEPS (steps per worker, 600), EVAL (20), JOIN_S (5), KILL_S (8; whole seconds), TARGET
# (0.85), CKPT_S (the server's --checkpoint_interval_s, 1), ADAPS_BUILD_DIR (build), KEEP_LOGS
# (a folder to copy the logs into). Prints rank 0's evaluations, the time to TARGET (rank 0's
# elapsed time at the first evaluation at or above it), the final accuracy, the kills, and
# every worker's exit status.
set -u
cd "$(dirname "$0")/../.."
mode=${1:-}; seed=${2:-1}
[[ $mode == steady || $mode == grow ]] || { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
b=${ADAPS_BUILD_DIR:-build}
steps=${STEPS:-600} eval_every=${EVAL:-20} join_s=${JOIN_S:-5} kill_s=${KILL_S:-8}
target=${TARGET:-0.85}
tmp=$(mktemp -d); pids=() server=""
cleanup() {
  for p in "${pids[@]}" $server; do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
  [[ -n ${KEEP_LOGS:-} ]] && { mkdir -p "$KEEP_LOGS"; cp -r "$tmp"/*.log "$tmp"/*.out "$KEEP_LOGS"/; }
  rm -rf "$tmp"
}
trap cleanup EXIT
start_n=8; [[ $mode == grow ]] && start_n=4
"$b"/scheduler/adaps-scheduler --num_servers=1 --num_workers=$start_n --max_workers=8 \
  --port_file="$tmp/port" --log_level=warn --heartbeat_ms=200 --dead_timeout_ms=2000 &
pids+=($!)
for _ in $(seq 100); do [[ -s $tmp/port ]] && break; sleep 0.05; done
addr="tcp://127.0.0.1:$(cat "$tmp/port")"
mkdir -p "$tmp/ckpt"
server_cmd=("$b"/server/adaps-server --scheduler="$addr" --log_level=info --optimizer=sgd
            --pull_bin_size=100 --identity=s0 --checkpoint_dir="$tmp/ckpt"
            --checkpoint_interval_s="${CKPT_S:-1}" --register_timeout_ms=30000)
"${server_cmd[@]}" >>"$tmp/server.log" 2>&1 & server=$!
worker() {  # index
  "$b"/worker/adaps-worker --scheduler="$addr" --mode=train --model=mlp --compressor=adacomp \
    --pull=recompressed --local_momentum=0.9 --compress_bias --bin_size_bias=100 --epochs=100 \
    --max_steps="$steps" --eval_every="$eval_every" --seed="$seed" --log_level=warn \
    --request_timeout_ms=60000 --register_timeout_ms=60000 >"$tmp/w$1.out" 2>&1 &
  w+=($!)
}
w=()
ms() { echo $(( $(date +%s%N) / 1000000 )); }
t0=$(ms)
for i in $(seq 0 $((start_n - 1))); do worker "$i"; done
kills=0 joined=0 next_kill=$((kill_s * 1000))
alive() { for p in "${w[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
while alive; do
  sleep 0.2
  now=$(( $(ms) - t0 ))  # ms
  at=$(printf '%d.%d' $((now / 1000)) $((now % 1000 / 100)))
  if [[ $mode == grow && $joined == 0 ]] && (( now >= join_s * 1000 )); then
    for i in 4 5 6 7; do worker "$i"; done
    joined=1
    echo "$at s: 4 workers join"
  fi
  if [[ $mode == grow ]] && (( now >= next_kill )); then
    kill -KILL "$server" 2>/dev/null; wait "$server" 2>/dev/null
    "${server_cmd[@]}" >>"$tmp/server.log" 2>&1 & server=$!
    kills=$((kills + 1)); next_kill=$((next_kill + kill_s * 1000))
    echo "$at s: server killed and started again"
  fi
done
codes=()
for p in "${w[@]}"; do wait "$p"; codes+=($?); done
grep -h "test_acc" "$tmp"/w*.out | grep -E "^step [0-9]+ " | sed 's/^/  /'
first=$(grep -h -E "^step [0-9]+  test_acc" "$tmp"/w*.out |
        awk -v t="$target" '$4 >= t {print $6; exit}')
final=$(grep -h "final:" "$tmp"/w*.out | grep -o "test_acc [0-9.]*" | head -1)
echo "mode $mode seed $seed: time to $target: ${first:-not reached} s; final $final;" \
     "server kills $kills; worker exits ${codes[*]}"
grep -h -i "restored\|error" "$tmp/server.log" | head -5
for i in $(seq 0 $((${#codes[@]} - 1))); do
  [[ ${codes[$i]} == 0 ]] || { echo "worker $i:"; tail -3 "$tmp/w$i.out"; }
done
