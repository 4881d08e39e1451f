#!/usr/bin/env bash
# Starts a whole adaps cluster -- 1 scheduler, S servers, W workers -- on this machine or on
# a list of hosts over ssh, streams every process's output with a role/index prefix, and
# stops them all on Ctrl-C, when one fails, or when the workers are done.
#
#   deploy/launch.sh [options] [-- worker flags...]
#     --servers S          servers (default 2)
#     --workers W          workers (default 4)
#     --hosts h1,h2,...    run over ssh on these hosts (scheduler on the first, servers and
#                          workers round-robin); default: everything local, no ssh
#     --via PREFIX         how to run a command on a host: a command prefix where {host} is
#                          the host and {index} its position in --hosts (default:
#                          "ssh -tt -o BatchMode=yes -o ConnectTimeout=10 {host}"; the
#                          namespace test uses "ip netns exec adaps-h{index}")
#     --bin DIR            directory holding scheduler/ server/ worker/ executables as built
#                          (default: build, relative to the repository); on remote hosts the
#                          same path must exist (same checkout or image)
#     --port P             scheduler port (default: local 0 = chosen by the OS; hosts: 5510,
#                          and server i listens on P+1+i)
#     --scheduler-args A   extra flags for adaps-scheduler (one string)
#     --server-args A      extra flags for every adaps-server (one string)
#     --timeout SECONDS    stop everything after this long (default 3600)
#     --checkpoint-dir D   servers checkpoint to D (--checkpoint_interval_s 30 unless given
#                          in --server-args) and a server that dies while workers run is
#                          started again with the same flags and --identity (it restores its
#                          shard; the workers resume it); without it a dead server ends the job
#     --restarts N         at most N server restarts in all (default 3)
#     --colocate           one server beside the workers on every host, BytePS-style, so no
#                          single host's link carries every worker's traffic: worker i on
#                          host i mod H, one server on each host that has a worker (the
#                          number of servers follows; --servers is then refused). Without
#                          --hosts: one server per worker on this machine
#   Everything after -- goes to every adaps-worker, e.g. -- --mode=train --model=mlp.
#
# Exit status: 0 when every worker finished with 0; 1 otherwise (the failing process is named).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
servers=2 workers=4 hosts="" bin="$repo/build" port="" sched_args="" server_args="" timeout=3600
ckpt_dir="" restarts=3 colocate=0 servers_given=0
# -tt gives the remote command a terminal, so it dies when the connection drops.
via="ssh -tt -o BatchMode=yes -o ConnectTimeout=10 {host}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --servers) servers=$2; servers_given=1; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --via) via=$2; shift 2 ;;
    --bin) bin=$(cd "$2" && pwd) || exit 1; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --scheduler-args) sched_args=$2; shift 2 ;;
    --server-args) server_args=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --checkpoint-dir) ckpt_dir=$2; shift 2 ;;
    --restarts) restarts=$2; shift 2 ;;
    --colocate) colocate=1; shift ;;
    -h|--help) sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) echo "launch: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
worker_args=("$@")
[[ $servers =~ ^[1-9][0-9]*$ && $workers =~ ^[1-9][0-9]*$ ]] ||
  { echo "launch: --servers and --workers must be positive integers" >&2; exit 2; }
for exe in scheduler/adaps-scheduler server/adaps-server worker/adaps-worker; do
  [[ -x "$bin/$exe" ]] || { echo "launch: $bin/$exe not found; build first (deploy/build.sh)" >&2; exit 2; }
done

IFS=, read -r -a host_list <<<"${hosts:-}"
remote=$([[ ${#host_list[@]} -gt 0 ]] && echo 1 || echo 0)
if [[ $colocate == 1 ]]; then
  [[ $servers_given == 0 ]] ||
    { echo "launch: --colocate places one server on every worker host; drop --servers" >&2; exit 2; }
  if [[ $remote == 1 ]]; then
    servers=$(( workers < ${#host_list[@]} ? workers : ${#host_list[@]} ))
  else
    servers=$workers
  fi
fi
run_dir=$(mktemp -d /tmp/adaps-launch.XXXXXX)
pids=() names=()

# start NAME HOST_INDEX COMMAND...: runs the command (locally, or on host HOST_INDEX through
# the --via prefix) with prefixed output.
start() {
  local name=$1 idx=$2
  shift 2
  if [[ $remote == 1 ]]; then
    local host=${host_list[$idx]} prefix
    prefix=${via//\{host\}/$host}
    prefix=${prefix//\{index\}/$idx}
    read -r -a prefix_words <<<"$prefix"
    if [[ ${prefix_words[0]} == ssh ]]; then
      # One quoted string: ssh hands it to the remote shell.
      "${prefix_words[@]}" "$(printf '%q ' "$@")" > >(sed -u "s/^/[$name] /") 2>&1 &
    else
      "${prefix_words[@]}" "$@" > >(sed -u "s/^/[$name] /") 2>&1 &
    fi
  else
    "$@" > >(sed -u "s/^/[$name] /") 2>&1 &
  fi
  pids+=($!)
  names+=("$name")
}

# restart IDX: starts process IDX (a server) again with the command it was started with.
declare -A cmds=() cmd_hosts=()
restart() {
  local idx=$1 n=${#pids[@]}
  eval "local cmd=(${cmds[$idx]})"
  start "${names[$idx]}" "${cmd_hosts[$idx]}" "${cmd[@]}"
  pids[$idx]=${pids[$n]}
  unset "pids[$n]" "names[$n]"
}

stop_all() {
  trap - INT TERM EXIT
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  sleep 1
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$run_dir"
}
trap 'echo "launch: interrupted, stopping everything" >&2; stop_all; exit 130' INT TERM
trap stop_all EXIT

sched_host=${host_list[0]:-127.0.0.1}
if [[ $remote == 1 ]]; then
  port=${port:-5510}
  # shellcheck disable=SC2086
  start scheduler 0 "$bin/scheduler/adaps-scheduler" --host=0.0.0.0 --port="$port" \
    --num_servers="$servers" --num_workers="$workers" $sched_args
else
  port_file="$run_dir/scheduler.port"
  # shellcheck disable=SC2086
  start scheduler 0 "$bin/scheduler/adaps-scheduler" --host=127.0.0.1 --port="${port:-0}" \
    --port_file="$port_file" --num_servers="$servers" --num_workers="$workers" $sched_args
  for _ in $(seq 100); do [[ -s $port_file ]] && break; sleep 0.1; done
  [[ -s $port_file ]] || { echo "launch: the scheduler did not start listening" >&2; exit 1; }
  port=$(cat "$port_file")
fi
scheduler="tcp://$sched_host:$port"
echo "launch: scheduler at $scheduler, $servers servers, $workers workers" >&2

nhosts=${#host_list[@]}
[[ $restarts =~ ^[0-9]+$ ]] || { echo "launch: --restarts must be a number" >&2; exit 2; }
ckpt_flags=""
if [[ -n $ckpt_dir ]]; then
  mkdir -p "$ckpt_dir" || exit 1
  ckpt_flags="--checkpoint_dir=$ckpt_dir"
  [[ $server_args == *checkpoint_interval_s* ]] || ckpt_flags+=" --checkpoint_interval_s=30"
else
  restarts=0
fi
for ((i = 0; i < servers; i++)); do
  if [[ $remote == 1 ]]; then
    hi=$(( (i + 1) % nhosts ))
    [[ $colocate == 1 ]] && hi=$i  # the hosts of workers 0..servers-1 (worker i: host i mod H)
    h=${host_list[$hi]}
    sport=$((port + 1 + i))
    # shellcheck disable=SC2206
    cmd=("$bin/server/adaps-server" --scheduler="$scheduler" --identity="s$i" --host=0.0.0.0
         --port="$sport" --advertise="tcp://$h:$sport" $ckpt_flags $server_args)
  else
    hi=0
    # shellcheck disable=SC2206
    cmd=("$bin/server/adaps-server" --scheduler="$scheduler" --identity="s$i" --port=0
         $ckpt_flags $server_args)
  fi
  cmds[${#pids[@]}]=$(printf '%q ' "${cmd[@]}")
  cmd_hosts[${#pids[@]}]=$hi
  [[ $remote == 1 ]] && echo "launch: server $i on ${host_list[$hi]}" >&2
  start "server $i" "$hi" "${cmd[@]}"
done
first_worker=${#pids[@]}
for ((i = 0; i < workers; i++)); do
  hi=0
  if [[ $remote == 1 ]]; then
    hi=$(( (servers + 1 + i) % nhosts ))
    [[ $colocate == 1 ]] && hi=$(( i % nhosts ))
    echo "launch: worker $i on ${host_list[$hi]}" >&2
  fi
  start "worker $i" "$hi" "$bin/worker/adaps-worker" --scheduler="$scheduler" "${worker_args[@]}"
done

# Wait: the first process to fail stops everything; all workers done is success.
deadline=$(( $(date +%s) + timeout ))
declare -A done_ok=()
while true; do
  for idx in "${!pids[@]}"; do
    pid=${pids[$idx]}
    [[ -n ${done_ok[$idx]:-} ]] && continue
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid"; rc=$?
      if [[ $rc -ne 0 && -n ${cmds[$idx]:-} && $restarts -gt 0 ]]; then
        restarts=$((restarts - 1))
        echo "launch: ${names[$idx]} exited with status $rc; restarting it from its checkpoint ($restarts restart(s) left)" >&2
        restart "$idx"
        continue
      fi
      if [[ $rc -ne 0 ]]; then
        echo "launch: ${names[$idx]} exited with status $rc; stopping everything" >&2
        exit 1
      fi
      done_ok[$idx]=1
    fi
  done
  finished=0
  for ((i = first_worker; i < ${#pids[@]}; i++)); do [[ -n ${done_ok[$i]:-} ]] && ((finished++)); done
  if [[ $finished -eq $workers ]]; then
    echo "launch: all $workers workers finished" >&2
    exit 0
  fi
  if [[ $(date +%s) -ge $deadline ]]; then
    echo "launch: timed out after ${timeout}s; stopping everything" >&2
    exit 1
  fi
  sleep 0.2
done
