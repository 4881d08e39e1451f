#!/usr/bin/env bash
# One task of an adaps job under Slurm: deploy/slurm/adaps.sbatch runs it through srun as
#
#   srun ... deploy/slurm/adaps-task.sh scheduler|server|worker|python [ARGS...]
#
# and it runs the scheduler, a server, an adaps-worker or `/usr/bin/python3 SCRIPT ARGS...` with adaps.torch. The task's
# identity is its SLURM_PROCID within its step: server i is `s<i>`, worker i is `w<i>`, so a
# task started again (a requeued job, a new step) takes its rank back. ARGS are the role's
# flags (or, for python, the script and its arguments).
#
# The scheduler and the servers are exec'd: they stop within a second of SIGTERM. A worker
# that gets SIGTERM finishes its step and leaves, pushing its residues to the servers; when
# the whole job is cancelled the servers and the scheduler are stopping too, and that leave
# would wait for them until its request deadlines (about a minute) and Slurm's KillWait. So
# a worker runs as a child of this script, which on SIGTERM gives it ADAPS_SLURM_STOP_S
# seconds (default 10) to leave and then kills it.
#
# The batch script passes the cluster's shape in the environment (names outside the
# executables' ADAPS_<FLAG> variables, so none of them is read as a flag):
#   ADAPS_SLURM_BIN       directory holding scheduler/ server/ worker/ (and python/)
#   ADAPS_SLURM_SCHED     the scheduler's address, tcp://HOST:PORT
#   ADAPS_SLURM_PORT      the scheduler's port; server i listens on PORT+1+i
#   ADAPS_SLURM_SERVERS   number of servers; ADAPS_SLURM_WORKERS number of workers
#   ADAPS_SLURM_ADDRS     "node=address ..." for every node of the job (Slurm's NodeAddr)
#   ADAPS_SLURM_REGISTER_MS  how long servers and workers wait for the cluster to form
#   ADAPS_SLURM_CURVE     a directory of CURVE keys (deploy/curve-keys.sh), or empty: each
#                         role gets the keys it needs (docs/reliability.md, "Access")
set -euo pipefail
role=${1:-}
[[ -n $role ]] || { echo "adaps-task: usage: adaps-task.sh scheduler|server|worker|python [ARGS...]" >&2; exit 2; }
shift
for v in ADAPS_SLURM_BIN ADAPS_SLURM_SCHED ADAPS_SLURM_PORT ADAPS_SLURM_SERVERS ADAPS_SLURM_WORKERS SLURM_PROCID; do
  [[ -n ${!v:-} ]] || { echo "adaps-task: $v is not set (run me from deploy/slurm/adaps.sbatch through srun)" >&2; exit 2; }
done
bin=$ADAPS_SLURM_BIN
register_ms=${ADAPS_SLURM_REGISTER_MS:-300000}
node=${SLURMD_NODENAME:-$(hostname -s)}
curve=()
if [[ -n ${ADAPS_SLURM_CURVE:-} ]]; then
  keys=$ADAPS_SLURM_CURVE
  case "$role" in
    scheduler) curve=(--curve_server_key="$keys/server.key" --curve_allowed_clients="$keys/allowed_clients") ;;
    server) curve=(--curve_server_key="$keys/server.key" --curve_allowed_clients="$keys/allowed_clients"
                   --curve_client_key="$keys/client.key") ;;
    worker) curve=(--curve_server_key="$keys/server.pub" --curve_client_key="$keys/client.key") ;;
  esac
fi

# This node's address as the other nodes reach it: its NodeAddr in the job's map, else its name.
# supervise COMMAND...: runs COMMAND as a child; SIGTERM/SIGINT are passed on, and a child
# still running ADAPS_SLURM_STOP_S seconds later is killed. Exits with the child's status.
stop_s=${ADAPS_SLURM_STOP_S:-10}
alive() { [[ -r /proc/$1/status ]] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }
on_stop() {
  local t
  kill -TERM "$child" 2>/dev/null
  for ((t = 0; t < stop_s * 5; t++)); do
    alive "$child" || return 0
    sleep 0.2
  done
  echo "adaps-task: $role w$SLURM_PROCID did not stop within ${stop_s}s of SIGTERM; killing it" >&2
  kill -KILL "$child" 2>/dev/null
}
supervise() {
  local rc again
  set +e  # the child's failure is the status to hand on, not a reason to stop here
  trap on_stop TERM INT
  "$@" &
  child=$!
  while true; do
    wait "$child"
    rc=$?
    if ! alive "$child"; then
      # A wait cut short by the signal left the exit status to a second one.
      wait "$child" 2>/dev/null
      again=$?
      [[ $again != 127 ]] && rc=$again
      break
    fi
  done
  exit "$rc"
}

node_addr() {
  local pair
  for pair in ${ADAPS_SLURM_ADDRS:-}; do
    [[ ${pair%%=*} == "$node" ]] && { echo "${pair#*=}"; return; }
  done
  echo "$node"
}

case "$role" in
  scheduler)
    echo "adaps-task: scheduler on $node at $ADAPS_SLURM_SCHED (job ${SLURM_JOB_ID:-?}, restart ${SLURM_RESTART_COUNT:-0})"
    exec "$bin/scheduler/adaps-scheduler" --host=0.0.0.0 --port="$ADAPS_SLURM_PORT" \
      --num_servers="$ADAPS_SLURM_SERVERS" --num_workers="$ADAPS_SLURM_WORKERS" "${curve[@]}" "$@"
    ;;
  server)
    port=$((ADAPS_SLURM_PORT + 1 + SLURM_PROCID))
    addr=$(node_addr)
    echo "adaps-task: server s$SLURM_PROCID on $node at tcp://$addr:$port"
    exec "$bin/server/adaps-server" --scheduler="$ADAPS_SLURM_SCHED" --identity="s$SLURM_PROCID" \
      --host=0.0.0.0 --port="$port" --advertise="tcp://$addr:$port" \
      --register_timeout_ms="$register_ms" "${curve[@]}" "$@"
    ;;
  worker)
    echo "adaps-task: worker w$SLURM_PROCID on $node"
    supervise "$bin/worker/adaps-worker" --scheduler="$ADAPS_SLURM_SCHED" --identity="w$SLURM_PROCID" \
      --register_timeout_ms="$register_ms" "${curve[@]}" "$@"
    ;;
  python)
    [[ $# -ge 1 ]] || { echo "adaps-task: python needs a script" >&2; exit 2; }
    echo "adaps-task: python worker w$SLURM_PROCID on $node: $*"
    # What adaps.worker_from_env() and adaps.torch read (python3 -m adaps.launch sets the same).
    export ADAPS_SCHEDULER=$ADAPS_SLURM_SCHED
    export ADAPS_IDENTITY="w$SLURM_PROCID"
    export ADAPS_REGISTER_TIMEOUT_S=$((register_ms / 1000))
    export ADAPS_SERVER_OPTIMIZER=${ADAPS_SLURM_SERVER_OPTIMIZER:-mean}
    export ADAPS_NUM_WORKERS=$ADAPS_SLURM_WORKERS
    export ADAPS_LOCAL_RANK=$SLURM_PROCID
    # torch's threads: the CPUs Slurm gave the task, else one.
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
    [[ -d $bin/python/adaps ]] && export PYTHONPATH="$bin/python${PYTHONPATH:+:$PYTHONPATH}"
    supervise "${ADAPS_SLURM_PYTHON:-/usr/bin/python3}" "$@"
    ;;
  *)
    echo "adaps-task: unknown role '$role' (scheduler, server, worker or python)" >&2
    exit 2
    ;;
esac
