#!/bin/bash
# A straggler against --backup_workers (docs/benchmarks.md "Stragglers"): 1 server, 4
# workers training the MLP (WORKERS=N for another count), the last one sleeping DELAY_MS
# before each exchange.
#   [WORKERS=4] [EPOCHS=3] bench/cluster/straggler.sh BACKUP DELAY_MS [SEED] [MAX_STEPS: 0 = 3 epochs]
# LAST_BATCH=B gives the last worker --batch=B instead (with no delay: the data a
# straggler at half speed produces, without the straggler; give MAX_STEPS so every worker
# runs the same steps).
# Prints the final test accuracy, train time and step time of the workers.
set -u
cd "$(dirname "$0")/../.."
b=${ADAPS_BUILD_DIR:-build}
tmp=$(mktemp -d); pids=()
"$b"/scheduler/adaps-scheduler --num_servers=1 --num_workers=${WORKERS:-4} --port_file=$tmp/port --log_level=warn --dead_timeout_ms=60000 & pids+=($!)
for _ in $(seq 100); do [[ -s $tmp/port ]] && break; sleep 0.05; done
addr="tcp://127.0.0.1:$(cat $tmp/port)"
"$b"/server/adaps-server --scheduler=$addr --log_level=warn --optimizer=sgd --backup_workers=$1 & pids+=($!)
w=()
n=${WORKERS:-4}
for i in $(seq 0 $((n - 1))); do
  d=0; batch=32
  if [[ $i == $((n - 1)) ]]; then d=$2; batch=${LAST_BATCH:-32}; fi
  "$b"/worker/adaps-worker --scheduler=$addr --mode=train --model=mlp --compressor=adacomp --pull=sparse --local_momentum=0.9 --compress_bias --bin_size_bias=100 --epochs=${EPOCHS:-3} --max_steps=${4:-0} --seed=${3:-1} --step_delay_ms=$d --batch=$batch --log_level=warn > $tmp/w$i.out 2>&1 & w+=($!)
done
rc=0; for p in "${w[@]}"; do wait $p || rc=1; done
grep -h "final:" $tmp/w*.out | sed 's/.*test_acc \([0-9.]*\).*train time \([0-9.]*\) s.*/test_acc \1 train_time \2 s/'; grep -h "epoch" $tmp/w*.out | tail -1 | grep -o "step [0-9.]* ms"
echo "rc=$rc"
for p in "${pids[@]}"; do kill $p 2>/dev/null; done; wait 2>/dev/null; rm -rf $tmp
