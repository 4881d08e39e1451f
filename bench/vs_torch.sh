#!/usr/bin/env bash
# The race: adaps against torch DDP, DDP + PowerSGD and DDP + fp16 compression.
# W workers (--workers, default 4), each on its own simulated host (network namespaces on a
# bridge, deploy/netns-hosts.sh) whose link is limited to RATE by tc tbf in both directions;
# adaps's scheduler and server(s) on host W (and W+1, ...). Every system trains the same model on the
# same shards with the same seed, batches, initial values and torch optimizer (SGD, momentum
# 0.9, cosine learning rate): bench/race/train.py. --model gpt: the accuracy zoo's character
# transformer with its AdamW recipe (adaps always in local mode, at adaps.torch's defaults). adaps runs adaps.torch in local mode (the
# servers run --optimizer=mean and answer each step's mean gradient): dense pushes and pulls
# ("adaps"), or AdaComp pushes and recompressed pulls ("adacomp"). Rank 0 evaluates every
# --eval-every steps with the clock stopped. Results: one JSON and log per run in --results
# (default $ADAPS_RESULTS_DIR/race, ADAPS_RESULTS_DIR defaulting to build/bench-results: run
# outputs stay out of the source tree), then a table (step time, bytes per step per worker,
# time to --target, final accuracy) and a plot of test accuracy against training time per
# model and rate in --results/plots. Needs root. Run by hand, under `nice -n 10`.
#
#   bench/vs_torch.sh [--rate 100mbit|10mbit|1mbit|1gbit|none] [--model mlp|cnn|gpt] [--seed S]
#                     [--workers W]  (2-32; results are named and grouped by W)
#                     [--systems "ddp powersgd fp16 adaps adacomp adacomp-colo"] [--target ACC]
#                     [--max-steps-dense N]  (ddp, fp16, adaps: stop after N steps; the
#                      summary extrapolates their time to the target from another rate's run)
#                     [--build DIR] [--results DIR] [--servers N] [--timeout S]
#                     [--adacomp-recipe dgc|plain]  (dgc: the main command's, docs/accuracy.md)
#                     [--local-steps H]  (adacomp, adacomp-colo in local mode: exchange every
#                      H steps, adaps.torch's local_steps; named adacomp-hH, adacomp-colo-hH)
#                     [-- trainer flags, e.g. --epochs 2 --train-size 16000 --eval-every 25]
#   bench/vs_torch.sh --summarize [--results DIR] [--target ACC]   table + plots only
# adacomp-colo is adacomp with one server beside every worker (BytePS-style, as
# deploy/launch.sh --colocate): server i on worker i's host, so no link carries every
# worker's traffic; the scheduler stays on host W.
# ADAPS_SERVER_FLAGS: extra adaps-server flags for the adaps systems (e.g. --engine_threads=1).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
rate=100mbit model=mlp seed=1 systems="ddp powersgd fp16 adaps adacomp" target=""
bin="$repo/build" results="${ADAPS_RESULTS_DIR:-$repo/build/bench-results}/race" servers=1 timeout=900 summarize_only=0
adaps_mode=server adacomp_recipe=dgc max_steps_dense=0 nworkers=4 local_steps=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rate) rate=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --workers) nworkers=$2; shift 2 ;;
    --systems) systems=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    --build) bin=$(cd "$2" && pwd) || exit 2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    --servers) servers=$2; shift 2 ;;
    --adaps-mode) adaps_mode=$2; shift 2 ;;
    --adacomp-recipe) adacomp_recipe=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --max-steps-dense) max_steps_dense=$2; shift 2 ;;
    --local-steps) local_steps=$2; shift 2 ;;
    --summarize) summarize_only=1; shift ;;
    -h|--help) sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) echo "vs_torch: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
extra=("$@")
py=/usr/bin/python3
summarize() {
  local t=()
  [[ -n $target ]] && t=(--target "$target")
  "$py" "$repo/bench/race/summarize.py" table --results "$results" "${t[@]}"
  "$py" "$repo/bench/race/summarize.py" plot --results "$results" "${t[@]}" \
    --plots "$results/plots"
}
if [[ $summarize_only == 1 ]]; then summarize; exit $?; fi

[[ $model == mlp || $model == cnn || $model == gpt ]] ||
  { echo "vs_torch: --model is mlp, cnn or gpt" >&2; exit 2; }
[[ $nworkers =~ ^[0-9]+$ && $nworkers -ge 2 && $nworkers -le 32 ]] ||
  { echo "vs_torch: --workers is 2-32" >&2; exit 2; }
# The transformer trains with AdamW: adaps in local mode (the servers answer the mean).
[[ $model == gpt ]] && adaps_mode=local
[[ $rate == none || $rate =~ ^[0-9]+[kmg]bit$ ]] ||
  { echo "vs_torch: --rate is like 100mbit, 1gbit or none" >&2; exit 2; }
[[ $servers =~ ^[1-9]$ ]] || { echo "vs_torch: --servers is 1-9" >&2; exit 2; }
[[ $max_steps_dense =~ ^[0-9]+$ ]] || { echo "vs_torch: --max-steps-dense is a step count" >&2; exit 2; }
[[ $local_steps =~ ^[1-9][0-9]*$ ]] || { echo "vs_torch: --local-steps is a step count" >&2; exit 2; }
[[ $local_steps == 1 || $adaps_mode == local || $model == gpt ]] ||
  { echo "vs_torch: --local-steps needs --adaps-mode local (or --model gpt)" >&2; exit 2; }
[[ $adacomp_recipe == dgc || $adacomp_recipe == plain ]] ||
  { echo "vs_torch: --adacomp-recipe is dgc or plain" >&2; exit 2; }
[[ $adaps_mode == server || $adaps_mode == local ]] ||
  { echo "vs_torch: --adaps-mode is server or local" >&2; exit 2; }
for s in $systems; do
  [[ " ddp powersgd fp16 adaps adacomp adacomp-colo " == *" $s "* ]] ||
    { echo "vs_torch: unknown system '$s'" >&2; exit 2; }
done
if [[ " $systems " == *" adaps"* ]]; then
  for exe in scheduler/adaps-scheduler server/adaps-server python/adaps/__init__.py; do
    [[ -e "$bin/$exe" ]] || { echo "vs_torch: $bin/$exe missing; build it first:" \
      "ninja -C build adaps-scheduler adaps-server adaps_python" >&2; exit 2; }
  done
fi
why=$(bash "$repo/deploy/netns-hosts.sh" check) || { echo "vs_torch: $why" >&2; exit 1; }
mkdir -p "$results" || exit 1
results=$(cd "$results" && pwd)

prefix="adapsrace$$"
nhosts=$((nworkers + servers))
pids=()
cleanup() {
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  sleep 0.5
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  wait 2>/dev/null
  bash "$repo/deploy/netns-hosts.sh" down "$prefix"
}
trap cleanup EXIT
trap 'echo "vs_torch: interrupted" >&2; exit 130' INT TERM
if [[ $rate == none ]]; then
  bash "$repo/deploy/netns-hosts.sh" up "$prefix" "$nhosts" || exit 1
else
  bash "$repo/deploy/netns-hosts.sh" up "$prefix" "$nhosts" "$rate" || exit 1
fi
addr() { bash "$repo/deploy/netns-hosts.sh" addr "$prefix" "$1"; }
on() { local h=$1; shift; ip netns exec "$prefix-h$h" nice -n 10 "$@"; }
host_bytes() {  # "rx tx" of host $1's eth0
  ip netns exec "$prefix-h$1" awk -F'[: ]+' '$2 == "eth0" {print $3, $11}' /proc/net/dev
}

port=29500
run() {  # system
  local sys=$1 lsteps=()
  # Local steps: the AdaComp systems exchange every H steps and carry it in their name.
  if [[ $local_steps -gt 1 && $sys == adacomp* ]]; then
    sys=$sys-h$local_steps lsteps=(--local-steps "$local_steps")
  fi
  local name="$model-$rate-$sys-s$seed"
  [[ $nworkers != 4 ]] && name="$model-w$nworkers-$rate-$sys-s$seed"
  local log="$results/$name.log" json="$results/$name.json"
  port=$((port + 10))
  rm -f "$json"
  echo "== $sys, $model, links $rate, seed $seed ($(uptime | sed 's/.*load/load/'))" >&2
  local tsys=$sys colo=0 nserv=$servers
  [[ $sys == adacomp-h* ]] && tsys=adacomp
  [[ $sys == adacomp-colo* ]] && tsys=adacomp colo=1 nserv=$nworkers
  local common_args=(--system "$tsys" --system-name "$sys" --model "$model" --seed "$seed"
                     --world "$nworkers" --label "$rate" "${lsteps[@]}" "${extra[@]}")
  [[ $max_steps_dense -gt 0 && ($sys == ddp || $sys == fp16 || $sys == adaps) ]] &&
    common_args+=(--max-steps "$max_steps_dense")
  local workers=() infra=() sb=() s0
  : >"$log"
  if [[ $sys == ddp || $sys == powersgd || $sys == fp16 ]]; then
    for ((r = 0; r < nworkers; r++)); do
      on "$r" env GLOO_SOCKET_IFNAME=eth0 PYTHONPATH="$bin/python" "$py" "$repo/bench/race/train.py" "${common_args[@]}" \
        --rank "$r" --master "$(addr 0):$port" --out "$json" > >(sed -u "s/^/[w$r] /" >>"$log") 2>&1 &
      workers+=($!)
    done
  else
    local sched="tcp://$(addr "$nworkers"):$port" server_opt=momentum server_extra=()
    [[ $adaps_mode == local ]] && server_opt=mean
    # The main command's recipe (docs/accuracy.md): momentum on the workers, SGD here, pulls
    # recompressed at bin 100; the CNN's at 25 (docs/benchmarks.md, the race's notes: 0.7 pp
    # better on it, while the MLP loses at 25 and 10).
    if [[ $tsys == adacomp && $adaps_mode == server && $adacomp_recipe == dgc ]]; then
      local pull_bin=100
      [[ $model == cnn ]] && pull_bin=25
      server_opt=sgd server_extra+=(--pull_bin_size=$pull_bin)
    fi
    # Last, so that they can override the recipe's (the last of a repeated flag wins).
    server_extra+=(${ADAPS_SERVER_FLAGS:-})
    s0=$(host_bytes "$nworkers")
    on "$nworkers" "$bin/scheduler/adaps-scheduler" --host=0.0.0.0 --port="$port" --num_servers="$nserv" \
      --num_workers="$nworkers" --log_level=warn > >(sed -u "s/^/[sched] /" >>"$log") 2>&1 &
    infra+=($!)
    for ((i = 0; i < nserv; i++)); do
      local h=$((nworkers + i)) sp=$((port + 1 + i))
      [[ $colo == 1 ]] && h=$i
      on "$h" "$bin/server/adaps-server" --scheduler="$sched" --host=0.0.0.0 --port="$sp" \
        --advertise="tcp://$(addr "$h"):$sp" --optimizer="$server_opt" "${server_extra[@]}" --mode=sync --log_level=warn \
        --register_timeout_ms=600000 \
        > >(sed -u "s/^/[s$i] /" >>"$log") 2>&1 &
      infra+=($!)
    done
    for ((r = 0; r < nworkers; r++)); do
      on "$r" env PYTHONPATH="$bin/python" "$py" "$repo/bench/race/train.py" "${common_args[@]}" \
        --scheduler "$sched" --adaps-mode "$adaps_mode" --adacomp-recipe "$adacomp_recipe" --out "$json" > >(sed -u "s/^/[w$r] /" >>"$log") 2>&1 &
      workers+=($!)
    done
  fi
  pids+=("${workers[@]}" "${infra[@]}")
  local deadline=$(( $(date +%s) + timeout )) rc=0
  while true; do
    local alive=0
    for pid in "${workers[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [[ $alive == 0 ]] && break
    for pid in "${workers[@]}"; do
      if ! kill -0 "$pid" 2>/dev/null; then wait "$pid" || rc=1; fi
    done
    [[ $rc != 0 || $(date +%s) -ge $deadline ]] && { rc=1; break; }
    sleep 0.5
  done
  for pid in "${workers[@]}"; do wait "$pid" 2>/dev/null || rc=1; done
  local s1=""
  [[ ${#infra[@]} -gt 0 ]] && s1=$(host_bytes "$nworkers")
  for pid in "${workers[@]}" "${infra[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  sleep 0.5
  for pid in "${workers[@]}" "${infra[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  for pid in "${workers[@]}" "${infra[@]}"; do wait "$pid" 2>/dev/null; done
  pids=()
  if [[ $rc != 0 || ! -s $json ]]; then
    tail -30 "$log" >&2
    echo "vs_torch: $name failed (log: $log)" >&2
    return 1
  fi
  grep -E "^\[w[0-9]+\] step " "$log" | sed -E "s/^\[w[0-9]+\] /  /" >&2
  "$py" "$repo/bench/race/summarize.py" merge --json "$json" --log "$log" \
    --server-before "${s0:-}" --server-after "$s1" --load "$(cut -d' ' -f1-3 /proc/loadavg)"
}

failed=0
for s in $systems; do run "$s" || failed=1; done
summarize
exit $failed
