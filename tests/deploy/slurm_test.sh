#!/usr/bin/env bash
# adaps under a real Slurm cluster (Debian's slurmctld, slurmd and munge), made of network
# namespaces by tests/deploy/slurm_cluster.sh: a controller host and 4 nodes, each slurmd on
# its own host with its own address. Every job is deploy/slurm/adaps.sbatch, submitted with
# sbatch:
#   (a) the main command (3 epochs, 1 scheduler, 2 servers, 4 workers on 3 nodes), encrypted
#       (--curve: keys made by deploy/curve-keys.sh on the shared file system), ends
#       COMPLETED with test accuracy >= 0.85, and a plaintext adaps-worker started on a node
#       while it trains is refused (exit 1, never answered); beside it, on 2 nodes, a PyTorch script
#       (examples/pytorch/train_fashion_mnist.py, one epoch of 4000 images) with a server
#       beside each worker (--colocate) ends COMPLETED with test accuracy >= 0.60 (0.663
#       seen; 62 steps of 32 images per worker); a job whose workers fail (a bad flag) ends
#       FAILED
#   (c) scancel of a job that trains leaves no adaps process on any node, before Slurm's
#       KillWait (60 s here) would SIGKILL them: the executables stopped on SIGTERM
#   (b) a node powered off while a worker there trains (every process of its host killed):
#       Slurm requeues the job (NODE_FAIL), starts it again on the 3 nodes left, and it ends
#       COMPLETED (one epoch: test accuracy >= 0.80)
# Exits 77 (skipped) with the reason when Slurm, munge or namespaces are not available.
# Takes 3.5 minutes on 2 cores at load 10-20 (5.5 at load 45; docs/slurm.md); every wait has
# a deadline of many minutes.
#
#   tests/deploy/slurm_test.sh [BUILD_DIR]    (default: build)
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cluster="$repo/tests/deploy/slurm_cluster.sh"
bin=$(cd "${1:-$repo/build}" 2>/dev/null && pwd) || { echo "FAILED: build directory ${1:-$repo/build} not found"; exit 1; }

if ! why=$(bash "$cluster" check); then
  echo "SKIPPED: $why"
  exit 77
fi
[[ -d /usr/share/datasets/fashion-mnist ]] || { echo "SKIPPED: dataset-fashion-mnist missing"; exit 77; }
for exe in scheduler/adaps-scheduler server/adaps-server worker/adaps-worker; do
  [[ -x $bin/$exe ]] || { echo "FAILED: $bin/$exe not built"; exit 1; }
done
with_python=1
if ! /usr/bin/python3 -c "import torch" 2>/dev/null || [[ ! -d $bin/python/adaps ]]; then
  with_python=0
  echo "== no torch in /usr/bin/python3 or no adaps module in $bin/python: the PyTorch job is left out"
fi

dir=$(mktemp -d /tmp/adaps-slurm-test.XXXXXX)
start=$(date +%s)
cleanup() {
  local t0
  t0=$(date +%s)
  bash "$cluster" down "$dir"
  rm -rf "$dir"
  echo "== cluster stopped and removed in $(( $(date +%s) - t0 ))s"
}
trap cleanup EXIT
trap 'echo "FAILED: interrupted"; exit 1' INT TERM

sl() { bash "$cluster" run "$dir" "$@"; }
elapsed() { echo "$(( $(date +%s) - start ))s"; }
fail() {
  echo "FAILED: $*"
  for f in "$dir"/job-*.out; do
    [[ -f $f ]] || continue
    echo "----- $f (last 40 lines)"
    tail -40 "$f"
  done
  sl squeue 2>&1
  sl sinfo -N 2>&1
  bash "$cluster" logs "$dir"
  exit 1
}

# field JOB NAME: a field of `scontrol show job` (JobState, Restarts, ExitCode, NodeList).
field() { sl scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1; }
# wait_state JOB SECONDS STATE: until the job is in a final state; fails unless it is STATE.
wait_state() {
  local job=$1 secs=$2 want=$3 deadline state
  deadline=$(( $(date +%s) + secs ))
  while true; do
    state=$(field "$job" JobState)
    case "$state" in
      COMPLETED|FAILED|CANCELLED|TIMEOUT|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED|NODE_FAIL)
        [[ $state == "$want" ]] && return 0
        fail "job $job ended $state (exit code $(field "$job" ExitCode)), expected $want" ;;
    esac
    [[ $(date +%s) -lt $deadline ]] || fail "job $job still $state after ${secs}s (expected $want)"
    sleep 1
  done
}
# wait_line FILE SECONDS REGEX: until a line of FILE matches.
wait_line() {
  local deadline=$(( $(date +%s) + $2 ))
  until grep -qE "$3" "$1" 2>/dev/null; do
    [[ $(date +%s) -lt $deadline ]] || fail "no line matching '$3' in $1 after $2s"
    sleep 0.2
  done
}
# submit ARGS...: sbatch from the repository (adaps.sbatch finds its wrapper there); prints
# the job id.
submit() {
  (cd "$repo" && ADAPS_BIN_DIR=$bin sl sbatch --parsable --output="$dir/job-%j.out" "$@") |
    cut -d';' -f1
}
# adaps_pids: the adaps processes on every node (each node is a namespace).
adaps_pids() {
  local i pid prefix nodes
  # shellcheck disable=SC1091
  source "$dir/cluster.env"  # prefix, nodes
  for ((i = 1; i <= nodes; i++)); do
    for pid in $(ip netns pids "$prefix-h$i" 2>/dev/null); do
      [[ $(cat "/proc/$pid/comm" 2>/dev/null) == adaps-* ||
         $( { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null) == *train_fashion_mnist* ]] && echo "$pid"
    done
  done
}
# acc JOB PATTERN: the last accuracy the job's output reports.
acc() { sed -n "$2" "$dir/job-$1.out" | tail -1; }
at_least() { /usr/bin/python3 -c "import sys; sys.exit(0 if float('$1') >= $2 else 1)" 2>/dev/null; }

echo "== cluster: slurmctld and 4 slurmd nodes, each in its own network namespace"
bash "$cluster" up "$dir" 4 >"$dir/up.log" 2>&1 || { cat "$dir/up.log"; fail "the Slurm cluster did not come up"; }
sl sinfo -N

echo "== (a) the main command as one sbatch job (3 nodes, 4 workers, 2 servers), encrypted (CURVE)"
ADAPS_KEYGEN=$bin/scheduler/adaps-keygen bash "$repo/deploy/curve-keys.sh" "$dir/curve" ||
  fail "deploy/curve-keys.sh could not make the keys"
main_job=$(submit -N3 -n4 "$repo/deploy/slurm/adaps.sbatch" --curve "$dir/curve")
[[ $main_job =~ ^[0-9]+$ ]] || fail "sbatch did not give a job id: '$main_job'"
py_job=""
if [[ $with_python == 1 ]]; then
  echo "== (a) beside it: a PyTorch script, a server beside each worker (2 nodes)"
  py_job=$(submit -N2 -n2 "$repo/deploy/slurm/adaps.sbatch" --colocate \
    --python "$repo/examples/pytorch/train_fashion_mnist.py" --epochs 1 --train-size 4000 \
    --test-size 1000 --log-every 1000)
  [[ $py_job =~ ^[0-9]+$ ]] || fail "sbatch did not give a job id: '$py_job'"
fi
echo "== (a) and a job whose workers fail at once (a bad flag): the job must end FAILED"
bad_job=$(submit -N1 -n1 "$repo/deploy/slurm/adaps.sbatch" -- --epochs=-1)
[[ $bad_job =~ ^[0-9]+$ ]] || fail "sbatch did not give a job id: '$bad_job'"
wait_state "$bad_job" 600 FAILED
grep -q -- "--epochs=-1" "$dir/job-$bad_job.out" || fail "job $bad_job: the failing flag is not named in its output"
echo "job $bad_job FAILED (exit code $(field "$bad_job" ExitCode)) ($(elapsed))"
# A worker without keys, on a node, while the encrypted job trains: its handshake fails, so
# the scheduler never answers it (not a refusal the scheduler sends, such as a full job).
wait_line "$dir/job-$main_job.out" 600 "epoch 1/3 +step"
grep -q "encrypted (CURVE keys in $dir/curve)" "$dir/job-$main_job.out" || fail "job $main_job: not encrypted"
sched=$(sed -n 's/.* scheduler \(tcp:[^,]*\),.*/\1/p' "$dir/job-$main_job.out" | head -1)
[[ -n $sched ]] || fail "job $main_job: no scheduler address in its output"
bash "$cluster" node "$dir" 1 timeout 300 "$bin/worker/adaps-worker" --scheduler="$sched" --mode=synthetic \
  --register_timeout_ms=5000 >"$dir/plaintext.log" 2>&1
rc=$?
# shellcheck disable=SC2015  # either failing is the failure
grep -qE "adaps-worker: [A-Z_]+: (scheduler at [^ ]+ unreachable|no cluster view from the scheduler)" "$dir/plaintext.log" &&
  [[ $rc -eq 1 ]] || { tail -3 "$dir/plaintext.log"; fail "a plaintext worker was not refused by job $main_job (exit $rc)"; }
echo "a plaintext worker was refused by the encrypted job $main_job ($(elapsed))"
wait_state "$main_job" 1200 COMPLETED
[[ $(field "$main_job" ExitCode) == 0:0 ]] || fail "job $main_job exit code $(field "$main_job" ExitCode)"
a=$(acc "$main_job" 's/.*final: .* test_acc \([0-9.]*\) .*/\1/p')
[[ -n $a ]] || fail "job $main_job printed no final accuracy"
at_least "$a" 0.85 || fail "job $main_job: test accuracy $a < 0.85"
echo "job $main_job (encrypted) COMPLETED: test_acc $a ($(elapsed))"
if [[ -n $py_job ]]; then
  wait_state "$py_job" 1200 COMPLETED
  p=$(acc "$py_job" 's/.*final test accuracy \([0-9.]*\).*/\1/p')
  [[ -n $p ]] || fail "job $py_job printed no final accuracy"
  at_least "$p" 0.60 || fail "job $py_job: test accuracy $p < 0.60"
  grep -q "server s1 on" "$dir/job-$py_job.out" || fail "job $py_job: no second (colocated) server"
  echo "job $py_job (PyTorch, colocated servers) COMPLETED: test accuracy $p ($(elapsed))"
fi

echo "== (c) scancel of a training job stops every process"
cancel_job=$(submit -N3 -n4 "$repo/deploy/slurm/adaps.sbatch")
[[ $cancel_job =~ ^[0-9]+$ ]] || fail "sbatch did not give a job id: '$cancel_job'"
wait_line "$dir/job-$cancel_job.out" 600 "epoch 1/3 +step"
[[ -n $(adaps_pids) ]] || fail "no adaps process seen while job $cancel_job trains"
t0=$(date +%s)
sl scancel "$cancel_job"
# Before Slurm's KillWait (60 s) ends in SIGKILL: only SIGTERM can have stopped them.
deadline=$(( t0 + 45 ))
while [[ -n $(adaps_pids) ]]; do
  [[ $(date +%s) -lt $deadline ]] ||
    fail "adaps processes left 45 s after scancel: $(adaps_pids | xargs -r ps -o pid=,args= -p)"
  sleep 0.2
done
echo "no adaps process left $(( $(date +%s) - t0 ))s after scancel"
wait_state "$cancel_job" 300 CANCELLED
echo "job $cancel_job CANCELLED ($(elapsed))"

echo "== (b) a node powered off while its worker trains: Slurm requeues the job, it completes"
loss_job=$(submit -N3 -n4 "$repo/deploy/slurm/adaps.sbatch" -- --epochs=1)
[[ $loss_job =~ ^[0-9]+$ ]] || fail "sbatch did not give a job id: '$loss_job'"
wait_line "$dir/job-$loss_job.out" 600 "epoch 1/1 +step"
# A node of the job other than the first (the batch script's), with a worker on it.
victim=$(sed -n 's/.*adaps-task: worker w[0-9]* on n\([0-9]*\)$/\1/p' "$dir/job-$loss_job.out" |
         sort -u | grep -vx "$(sed -n 's/.*adaps-task: scheduler on n\([0-9]*\) .*/\1/p' "$dir/job-$loss_job.out" | head -1)" | head -1)
[[ -n $victim ]] || fail "job $loss_job: no worker on a node other than the first"
bash "$cluster" kill-node "$dir" "$victim"
echo "node n$victim powered off while job $loss_job trains ($(elapsed))"
wait_state "$loss_job" 1200 COMPLETED
restarts=$(field "$loss_job" Restarts)
[[ ${restarts:-0} -ge 1 ]] || fail "job $loss_job completed without a restart (Restarts=$restarts)"
grep -q "restart 1) on" "$dir/job-$loss_job.out" || fail "job $loss_job: no second run in its output"
[[ $(field "$loss_job" NodeList) != *"n$victim"* ]] || fail "job $loss_job ran again on the lost node"
b=$(acc "$loss_job" 's/.*final: .* test_acc \([0-9.]*\) .*/\1/p')
[[ -n $b ]] || fail "job $loss_job printed no final accuracy"
at_least "$b" 0.80 || fail "job $loss_job: test accuracy $b < 0.80"
echo "job $loss_job COMPLETED after $restarts requeue(s) on $(field "$loss_job" NodeList): test_acc $b ($(elapsed))"

echo "PASSED: Slurm: main job (encrypted; a plaintext worker refused) test_acc $a${p:+, PyTorch job $p}; scancel stops every process; a lost node's job requeued and completed (test_acc $b); $(elapsed)"
