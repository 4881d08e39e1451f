#!/usr/bin/env bash
# The race's whole table (docs/benchmarks.md "The race"): bench/vs_torch.sh for each seed,
# worker count, model and rate, in that order, into one results directory, then its summary.
# The dense systems (DDP, DDP + fp16) stop after --dense-steps steps on the limited links and
# are extrapolated from their no-limit run (bench/race/summarize.py). Needs root; hours.
#
#   bench/race_matrix.sh [--results DIR] [--workers "4 16"] [--models "mlp gpt"]
#                        [--seeds "1 2"] [--rates "none 10mbit 1mbit"]
#                        [--systems "ddp powersgd fp16 adacomp adacomp-colo"]
#                        [--dense-steps N (20)]
#                        [--local "mlp=4 gpt=10"]  (then, for each model named, the
#                         AdaComp systems among --systems again, exchanging every H steps:
#                         --local-steps H, the MLP in local mode; "" for none)
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
results="${ADAPS_RESULTS_DIR:-$repo/build/bench-results}/race-matrix"
workers="4 16" models="mlp gpt" seeds="1 2" rates="none 10mbit 1mbit"
systems="ddp powersgd fp16 adacomp adacomp-colo" dense_steps=20 local="mlp=4 gpt=10"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --results) results=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --systems) systems=$2; shift 2 ;;
    --dense-steps) dense_steps=$2; shift 2 ;;
    --local) local=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "race_matrix: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
failed=0
for s in $seeds; do
  for w in $workers; do
    for m in $models; do
      # The MLP's shard per worker shrinks with the workers: at 16 the whole training set,
      # so that a run is about as many steps (234) as at 4 (250).
      extra=(--eval-every 25)
      [[ $m == mlp && $w -gt 4 ]] && extra+=(--train-size 60000)
      for r in $rates; do
        cap=()
        [[ $r != none ]] && cap=(--max-steps-dense "$dense_steps")
        echo "== race_matrix: seed $s, $w workers, $m, $r ($(date -u +%H:%M:%S))" >&2
        bash "$repo/bench/vs_torch.sh" --workers "$w" --model "$m" --seed "$s" --rate "$r" \
          --systems "$systems" --results "$results" "${cap[@]}" -- "${extra[@]}" \
          >/dev/null || failed=1
        h=$(tr ' ' '\n' <<<"$local" | sed -n "s/^$m=//p")
        lsys=$(tr ' ' '\n' <<<"$systems" | grep '^adacomp' | tr '\n' ' ')
        if [[ -n $h && -n $lsys ]]; then
          mode=()
          [[ $m != gpt ]] && mode=(--adaps-mode local)
          bash "$repo/bench/vs_torch.sh" --workers "$w" --model "$m" --seed "$s" --rate "$r" \
            --systems "$lsys" --local-steps "$h" "${mode[@]}" \
            --results "$results" -- "${extra[@]}" >/dev/null || failed=1
        fi
      done
    done
  done
done
bash "$repo/bench/vs_torch.sh" --summarize --results "$results"
exit $failed
