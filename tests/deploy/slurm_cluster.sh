#!/usr/bin/env bash
# A real Slurm cluster on one machine, from Debian's packages (slurmctld, slurmd, munge):
# every daemon is its own "host", a network namespace with its own address
# (deploy/netns-hosts.sh: namespaces joined by a bridge that lives in a namespace of its own,
# so the machine's own network is never touched). Host 0 runs slurmctld; hosts 1..N each run
# one slurmd as node nI (slurmd -N nI, its own spool, log and pid file). One munged, with
# its own key and socket, serves them all (a Unix socket is reachable from every network
# namespace). Everything lives under DIR; `down` stops every daemon and every process left
# in the namespaces and removes them.
#
#   tests/deploy/slurm_cluster.sh check              exit 0 when a cluster can be made here,
#                                                    else print why and exit 1
#   tests/deploy/slurm_cluster.sh up DIR N [CPUS]    N nodes of CPUS CPUs each (default 4)
#   tests/deploy/slurm_cluster.sh run DIR CMD...     run a client command (sbatch, squeue,
#                                                    scontrol, scancel, srun) against it
#   tests/deploy/slurm_cluster.sh node DIR I CMD...  run a command on node I's host (1..N)
#   tests/deploy/slurm_cluster.sh kill-node DIR I    power node I off: kill every process
#                                                    of its host (slurmd, slurmstepd, tasks)
#   tests/deploy/slurm_cluster.sh start-node DIR I   start node I's slurmd again
#   tests/deploy/slurm_cluster.sh logs DIR           print every daemon's log
#   tests/deploy/slurm_cluster.sh down DIR           stop everything, remove the namespaces
#
# Needs root (namespaces; the daemons run as root, SlurmUser=root), iproute2, slurm-wlm and
# munge (deploy/install-deps.sh installs them).
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
netns="$repo/deploy/netns-hosts.sh"
SBIN=${ADAPS_SLURM_SBIN:-/usr/sbin}

die() { echo "slurm_cluster: $*" >&2; exit 1; }

# wait_for SECONDS DESCRIPTION COMMAND...: polls COMMAND every 0.2 s until it succeeds or
# SECONDS pass (then fails, naming DESCRIPTION).
wait_for() {
  local secs=$1 what=$2 deadline
  shift 2
  deadline=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    if [[ $(date +%s) -ge $deadline ]]; then
      echo "slurm_cluster: timed out after ${secs}s waiting for $what" >&2
      return 1
    fi
    sleep 0.2
  done
}

load() {
  dir=${1:?cluster dir}
  [[ -f $dir/cluster.env ]] || die "$dir/cluster.env missing (not a cluster made by 'up')"
  # shellcheck disable=SC1091
  source "$dir/cluster.env"  # prefix, nodes, ctl_addr
}

client() {
  ip netns exec "$prefix-h0" env SLURM_CONF="$dir/slurm.conf" "$@"
}

start_slurmd() {
  local i=$1
  mkdir -p "$dir/nodes/n$i/spool"
  # -D: in the foreground of a background shell, so `down` knows its pid; -N: the node name.
  ip netns exec "$prefix-h$i" "$SBIN/slurmd" -D -N "n$i" -f "$dir/slurm.conf" \
    >>"$dir/nodes/n$i/slurmd.out" 2>&1 &
  echo $! >"$dir/nodes/n$i/slurmd.shellpid"
}

cmd=${1:-}
case "$cmd" in
  check)
    for exe in slurmctld slurmd munged; do
      [[ -x $SBIN/$exe ]] || { echo "$SBIN/$exe missing (apt-get install slurm-wlm munge)"; exit 1; }
    done
    for exe in sbatch srun squeue scontrol scancel mungekey; do
      command -v "$exe" >/dev/null || { echo "$exe missing (apt-get install slurm-wlm munge)"; exit 1; }
    done
    why=$(bash "$netns" check) || { echo "$why"; exit 1; }
    exit 0
    ;;

  up)
    dir=${2:?cluster dir} nodes=${3:?node count} cpus=${4:-4}
    [[ $nodes =~ ^[1-9][0-9]?$ ]] || die "node count must be 1..99"
    mkdir -p "$dir"/{ctld/state,munge,nodes} || die "cannot create $dir"
    chmod 700 "$dir" "$dir/munge"
    prefix="aslurm$$"
    ctl_addr=$(bash "$netns" addr "$prefix" 0)
    printf 'prefix=%s\nnodes=%s\nctl_addr=%s\n' "$prefix" "$nodes" "$ctl_addr" >"$dir/cluster.env"

    # munge: its own key, socket, pid, log and seed; -f because it runs as root here.
    mungekey -c -k "$dir/munge/munge.key" >/dev/null 2>&1 ||
      dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$dir/munge/munge.key"
    "$SBIN/munged" -f --socket="$dir/munge/munge.sock" --key-file="$dir/munge/munge.key" \
      --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
      --seed-file="$dir/munge/munged.seed" >"$dir/munge/munged.out" 2>&1 ||
      die "munged did not start: $(cat "$dir/munge/munged.out" "$dir/munge/munged.log" 2>/dev/null)"
    wait_for 30 "munged's socket" test -S "$dir/munge/munge.sock" || exit 1

    bash "$netns" up "$prefix" $((nodes + 1)) || die "could not create the namespaces"

    # The controller's name must be this machine's short host name (slurmctld checks it);
    # its address is host 0's. Nodes: nI at host I's address, 4 CPUs each whatever the
    # machine has (config_overrides). No cgroups (proctrack/linuxproc, task/none) and no
    # accounting daemon: job states come from `scontrol show job` (kept for MinJobAge) and
    # jobcomp/filetxt. A lost node is noticed in about 30 s (SlurmdTimeout=10 and the
    # controller's pings) and its batch jobs are requeued (JobRequeue=1); a requeued job
    # waits cred_expire (default 120 s) before it starts again, 30 s here. KillWait=60 (the
    # SIGKILL after scancel's SIGTERM) is longer than the test's bound on processes left
    # after scancel, so only SIGTERM can pass it.
    {
      cat <<EOF
ClusterName=adaps
SlurmctldHost=$(hostname -s)($ctl_addr)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.sock,cred_expire=30
StateSaveLocation=$dir/ctld/state
SlurmctldPidFile=$dir/ctld/slurmctld.pid
SlurmctldLogFile=$dir/ctld/slurmctld.log
SlurmdSpoolDir=$dir/nodes/%n/spool
SlurmdPidFile=$dir/nodes/%n/slurmd.pid
SlurmdLogFile=$dir/nodes/%n/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SlurmdParameters=config_overrides
JobRequeue=1
SlurmctldTimeout=60
SlurmdTimeout=10
MessageTimeout=10
InactiveLimit=0
KillWait=60
MinJobAge=3600
TmpFS=$dir
EOF
      for ((i = 1; i <= nodes; i++)); do
        echo "NodeName=n$i NodeHostname=n$i NodeAddr=$(bash "$netns" addr "$prefix" "$i") CPUs=$cpus State=UNKNOWN"
      done
      echo "PartitionName=main Nodes=n[1-$nodes] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
    } >"$dir/slurm.conf"
    # slurmd loads a cgroup plugin at start even with task/none and proctrack/linuxproc
    # (it then creates no cgroup); name the version, since autodetection fails where
    # /sys/fs/cgroup is a tmpfs of v1 hierarchies (containers).
    if [[ $(stat -f -c %T /sys/fs/cgroup 2>/dev/null) == cgroup2fs ]]; then
      echo "CgroupPlugin=cgroup/v2" >"$dir/cgroup.conf"
    else
      echo "CgroupPlugin=cgroup/v1" >"$dir/cgroup.conf"
    fi
    echo "CgroupMountpoint=/sys/fs/cgroup" >>"$dir/cgroup.conf"

    ip netns exec "$prefix-h0" "$SBIN/slurmctld" -D -i -f "$dir/slurm.conf" \
      >"$dir/ctld/slurmctld.out" 2>&1 &
    echo $! >"$dir/ctld/slurmctld.shellpid"
    wait_for 60 "slurmctld to answer" client scontrol ping || exit 1
    for ((i = 1; i <= nodes; i++)); do start_slurmd "$i"; done
    # Every node idle: each slurmd registered.
    idle() { [[ $(client sinfo -h -N -t idle -o %N | sort -u | wc -l) -eq $nodes ]]; }
    wait_for 120 "all $nodes nodes to register idle" idle || { client sinfo -N >&2; exit 1; }
    ;;

  run)
    load "${2:-}"; shift 2
    client "$@"
    ;;

  node)
    load "${2:-}"; i=${3:?node index}; shift 3
    ip netns exec "$prefix-h$i" env SLURM_CONF="$dir/slurm.conf" "$@"
    ;;

  kill-node)
    load "${2:-}"; i=${3:?node index}
    # Power off: every process of the host at once (slurmd, slurmstepd, the tasks).
    ip netns pids "$prefix-h$i" | xargs -r kill -9 2>/dev/null
    true
    ;;

  start-node)
    load "${2:-}"; i=${3:?node index}
    start_slurmd "$i"
    ;;

  logs)
    load "${2:-}"
    for f in "$dir/munge/munged.log" "$dir/ctld/slurmctld.log" "$dir/ctld/slurmctld.out" \
             "$dir"/nodes/*/slurmd.log "$dir"/nodes/*/slurmd.out; do
      [[ -s $f ]] || continue
      echo "----- $f (last 60 lines)"
      tail -60 "$f"
    done
    ;;

  down)
    dir=${2:?cluster dir}
    [[ -f $dir/cluster.env ]] || exit 0
    # shellcheck disable=SC1091
    source "$dir/cluster.env"
    # The daemons first (SIGTERM: slurmctld saves its state), then whatever is left in the
    # namespaces (slurmstepd and job processes) is killed with them.
    for f in "$dir"/ctld/slurmctld.shellpid "$dir"/nodes/*/slurmd.shellpid; do
      [[ -f $f ]] && kill -TERM "$(cat "$f")" 2>/dev/null
    done
    for ((t = 0; t < 25; t++)); do
      left=0
      for f in "$dir"/ctld/slurmctld.shellpid "$dir"/nodes/*/slurmd.shellpid; do
        [[ -f $f ]] && kill -0 "$(cat "$f")" 2>/dev/null && left=1
      done
      [[ $left == 0 ]] && break
      sleep 0.2
    done
    bash "$netns" down "$prefix"
    if [[ -f $dir/munge/munged.pid ]]; then
      mpid=$(cat "$dir/munge/munged.pid")
      kill -TERM "$mpid" 2>/dev/null
      for ((t = 0; t < 25; t++)); do kill -0 "$mpid" 2>/dev/null || break; sleep 0.2; done
      kill -KILL "$mpid" 2>/dev/null
    fi
    true
    ;;

  *)
    sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'
    [[ -z $cmd ]] && exit 2
    die "unknown command '$cmd'"
    ;;
esac
