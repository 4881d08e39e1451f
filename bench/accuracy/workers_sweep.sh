#!/bin/bash
# Accuracy and push bytes against the worker count at a fixed global batch:
# adaps-train-sim (W simulated workers in one process, the real codec), the Fashion-MNIST
# MLP, 3 epochs, global batch 256 (per-worker batch 256/W), dense against AdaComp with the
# main command's recipe (the workers' momentum correction 0.9, plain SGD on the servers, lr
# 0.05 cosine, biases compressed), seeds 1 and 2. Prints one row per run and a Markdown
# table of means.
#   bash bench/accuracy/workers_sweep.sh [BUILD_DIR] [WORKER_COUNTS...]
# MODEL=cnn (default mlp), TRAIN_LIMIT=N (default 0: all 60000 images) and LR (default 0.05)
# in the environment.
set -euo pipefail
build=${1:-build}
shift || true
counts=${*:-"4 16 32 64"}
model=${MODEL:-mlp}
limit=${TRAIN_LIMIT:-0}
lr=${LR:-0.05}
images=$(( limit > 0 ? limit : 60000 ))
sim="$build/worker/trainer/adaps-train-sim"
[[ -x "$sim" ]] || { echo "no $sim: ninja -C $build adaps-train-sim" >&2; exit 2; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for w in $counts; do
  batch=$((256 / w))
  for comp in dense adacomp; do
    for seed in 1 2; do
      line=$("$sim" --model="$model" --train_limit="$limit" --lr="$lr" --workers="$w" --batch="$batch" --epochs=3 --seed="$seed" \
               --compressor="$comp" --momentum=0 --local_momentum=0.9 --compress_bias 2>&1 |
               grep '^final:')
      acc=$(sed -E 's/.*test_acc ([0-9.]+).*/\1/' <<<"$line")
      mb=$(sed -E 's/.*pushed ([0-9.]+) MB instead.*/\1/' <<<"$line")
      steps=$((3 * (images / w / batch)))
      kb=$(awk -v mb="$mb" -v w="$w" -v s="$steps" 'BEGIN{printf "%.1f", mb*1000/(w*s)}')
      echo "workers $w batch $batch $comp seed $seed test_acc $acc push_kb_per_worker_step $kb ($(uptime | sed 's/.*load/load/'))"
      echo "$w $comp $acc $kb" >>"$out"
    done
  done
done
echo
echo "| workers | batch/worker | dense acc | AdaComp acc | gap (pp) | push KB/worker/step dense | AdaComp |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
for w in $counts; do
  awk -v w="$w" '$1==w {n[$2]++; a[$2]+=$3; k[$2]+=$4}
    END {printf "| %d | %d | %.4f | %.4f | %+.2f | %.1f | %.1f |\n", w, 256/w, a["dense"]/n["dense"],
         a["adacomp"]/n["adacomp"], 100*(a["adacomp"]/n["adacomp"]-a["dense"]/n["dense"]),
         k["dense"]/n["dense"], k["adacomp"]/n["adacomp"]}' "$out"
done
