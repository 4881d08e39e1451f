"""How adaps.worker_from_env() finds its job when a general launcher started the script.

torchrun, Slurm's srun and Open MPI's mpirun start one process per rank and tell each its
rank and the job's size in the environment; none of them starts an adaps scheduler. Without
ADAPS_SCHEDULER, the job is found from the first launcher whose variables are present:

  torchrun     RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
  Open MPI     OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
               (OMPI_COMM_WORLD_LOCAL_SIZE)
  Slurm        SLURM_PROCID, SLURM_STEP_NUM_TASKS / SLURM_NTASKS / SLURM_NPROCS,
               SLURM_LOCALID, SLURM_STEP_NODELIST / SLURM_JOB_NODELIST / SLURM_NODELIST,
               SLURM_JOB_ID

(torchrun first: it may run inside a Slurm allocation; then Open MPI, whose ranks inherit
the Slurm variables of the allocation's batch step when mpirun runs in one.)

The rendezvous is torch's TCPStore's: the process of launcher rank 0 starts an
adaps-scheduler expecting WORLD_SIZE workers and ADAPS_NUM_SERVERS servers (default 1,
with --optimizer=ADAPS_SERVER_OPTIMIZER, default mean) as its own child processes, and
every rank, rank 0 included, registers with that scheduler at tcp://HOST:PORT:

  HOST   MASTER_ADDR when set; else Slurm: the first host of the step's node list (task 0
         runs there); Open MPI: 127.0.0.1 when every rank is on one node, else an error
         (give MASTER_ADDR, e.g. `mpirun -x MASTER_ADDR=node0`)
  PORT   ADAPS_SCHEDULER_PORT when set; else MASTER_PORT + 1 (torchrun's store keeps
         MASTER_PORT); else Slurm: 20000 + 100 * (SLURM_JOB_ID mod 300), the port
         deploy/slurm/adaps.sbatch uses; Open MPI: 29501

The scheduler listens on every interface (0.0.0.0); the servers listen on every interface
at a free port and advertise tcp://HOST:port. They are stopped when rank 0's interpreter
exits (it first waits, up to the register timeout, for the other ranks to leave: the
scheduler ends once every worker has left) and, through PR_SET_PDEATHSIG, when the process
dies any other way. The other ranks wait for the scheduler's port with a deadline
(ADAPS_REGISTER_TIMEOUT_S, default 300 s here: ranks start minutes apart on a busy
cluster) and fail naming HOST:PORT when it never answers.

The adaps rank (Worker.rank) is the scheduler's: the order in which the workers
registered, not the launcher's RANK; the launcher's rank 0 only decides who hosts the
scheduler. The executables are found as adaps.launch finds them: ADAPS_BIN_DIR, else PATH.
"""
import atexit
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref

# The register timeout under a general launcher, when ADAPS_REGISTER_TIMEOUT_S is unset:
# the ranks of a job start minutes apart on a loaded machine or a busy cluster, and the
# cluster forms only when the last one registered.
DEFAULT_TIMEOUT_S = 300.0

# Slurm's port for the scheduler, as deploy/slurm/adaps.sbatch computes it.
_SLURM_PORT_BASE, _SLURM_PORT_STEP, _SLURM_PORT_SLOTS = 20000, 100, 300
_MPI_DEFAULT_PORT = 29501


class EnvError(ValueError):
    """A launcher's environment that does not describe one job (the message says why)."""


class Job:
    """Where this process stands in its job, from its launcher's environment."""

    def __init__(self, launcher, rank, world_size, local_rank, host, port):
        self.launcher = launcher      # "torchrun", "slurm" or "mpi"
        self.rank = rank              # the launcher's global rank
        self.world_size = world_size  # workers the scheduler waits for
        self.local_rank = local_rank
        self.host = host              # where rank 0 hosts the scheduler
        self.port = port

    @property
    def address(self):
        return "tcp://%s:%d" % (self.host, self.port)

    def __repr__(self):
        return ("Job(launcher=%r, rank=%d, world_size=%d, local_rank=%d, host=%r, port=%d)"
                % (self.launcher, self.rank, self.world_size, self.local_rank, self.host,
                   self.port))


def expand_nodelist(text):
    """Slurm's compressed host list as a list of names, in order:
    "node[01-03,07],gpu5" -> node01, node02, node03, node07, gpu5; "r[1-2]-n[1,3]" is the
    product r1-n1, r1-n3, r2-n1, r2-n3. Zero padding follows the range's lower bound."""
    text = text.strip()
    if not text:
        raise EnvError("empty Slurm node list")
    hosts = []
    for item in _split_top_level(text):
        hosts.extend(_expand_item(item, text))
    return hosts


def _split_top_level(text):
    items, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "[":
            depth += 1
            if depth > 1:
                raise EnvError("Slurm node list %r: nested brackets" % text)
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise EnvError("Slurm node list %r: ']' without '['" % text)
        elif c == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise EnvError("Slurm node list %r: '[' without ']'" % text)
    items.append(text[start:])
    for item in items:
        if not item:
            raise EnvError("Slurm node list %r: an empty entry" % text)
    return items


def _expand_item(item, whole):
    open_at = item.find("[")
    if open_at < 0:
        return [item]
    close_at = item.index("]", open_at)
    prefix, ranges, rest = item[:open_at], item[open_at + 1:close_at], item[close_at + 1:]
    tails = _expand_item(rest, whole) if rest else [""]
    out = []
    for part in ranges.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if not m:
            raise EnvError("Slurm node list %r: bad range %r" % (whole, part))
        lo, hi = m.group(1), m.group(2) if m.group(2) is not None else m.group(1)
        if int(hi) < int(lo):
            raise EnvError("Slurm node list %r: range %r runs backwards" % (whole, part))
        width = len(lo)
        for n in range(int(lo), int(hi) + 1):
            out.extend(prefix + str(n).zfill(width) + tail for tail in tails)
    return out


def _int(env, name, low=0):
    text = env.get(name, "")
    try:
        value = int(text)
    except ValueError:
        raise EnvError("%s=%r is not an integer" % (name, text)) from None
    if value < low:
        raise EnvError("%s=%d must be at least %d" % (name, value, low))
    return value


def _port(env, fallback, fallback_what):
    if env.get("ADAPS_SCHEDULER_PORT"):
        port, what = _int(env, "ADAPS_SCHEDULER_PORT", 1), "ADAPS_SCHEDULER_PORT"
    elif env.get("MASTER_PORT"):
        port, what = _int(env, "MASTER_PORT", 1) + 1, "MASTER_PORT + 1"
    elif fallback is not None:
        port, what = fallback, fallback_what
    else:
        raise EnvError("no port for the adaps scheduler: set MASTER_PORT (the scheduler "
                       "takes MASTER_PORT + 1) or ADAPS_SCHEDULER_PORT")
    if not 1 <= port <= 65535:
        raise EnvError("the adaps scheduler's port (%s) is %d: not 1 to 65535" % (what, port))
    return port


def _pair(env, rank_var, size_vars, launcher):
    """(rank, size) from a launcher's variables, both or neither: a clear error otherwise."""
    size_var = next((v for v in size_vars if env.get(v)), None)
    has_rank = bool(env.get(rank_var))
    if not has_rank and size_var is None:
        return None
    if not has_rank or size_var is None:
        have, missing = (rank_var, " or ".join(size_vars)) if has_rank else \
            (size_var, rank_var)
        raise EnvError("%s is set but %s is not: the environment is not a complete %s "
                       "launch (set both, or ADAPS_SCHEDULER)" % (have, missing, launcher))
    rank, size = _int(env, rank_var), _int(env, size_var, 1)
    if rank >= size:
        raise EnvError("%s=%d is not below %s=%d" % (rank_var, rank, size_var, size))
    return rank, size


def job_from_env(env=None):
    """The Job the launcher's variables describe, or None when none are set (EnvError for a
    contradictory or incomplete set). ADAPS_SCHEDULER is not looked at here."""
    env = os.environ if env is None else env
    pair = _pair(env, "RANK", ("WORLD_SIZE",), "torchrun")
    if pair is not None:
        rank, size = pair
        local = _int(env, "LOCAL_RANK") if env.get("LOCAL_RANK") else 0
        host = env.get("MASTER_ADDR", "")
        if not host:
            if size > 1:
                raise EnvError("RANK and WORLD_SIZE are set but MASTER_ADDR is not (torchrun "
                               "sets it: the host of rank 0)")
            host = "127.0.0.1"
        return Job("torchrun", rank, size, local, host,
                   _port(env, None if size > 1 else _MPI_DEFAULT_PORT, "the default"))
    pair = _pair(env, "OMPI_COMM_WORLD_RANK", ("OMPI_COMM_WORLD_SIZE",), "Open MPI")
    if pair is not None:
        rank, size = pair
        local = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK") \
            if env.get("OMPI_COMM_WORLD_LOCAL_RANK") else 0
        host = env.get("MASTER_ADDR", "")
        if not host:
            local_size = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1) \
                if env.get("OMPI_COMM_WORLD_LOCAL_SIZE") else None
            if local_size != size:
                raise EnvError("Open MPI does not say which host runs rank 0: set MASTER_ADDR "
                               "to it for every rank (mpirun -x MASTER_ADDR=HOST), or "
                               "ADAPS_SCHEDULER")
            host = "127.0.0.1"
        return Job("mpi", rank, size, local, host,
                   _port(env, _MPI_DEFAULT_PORT, "the default"))
    pair = _pair(env, "SLURM_PROCID", ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"),
                 "Slurm")
    if pair is not None:
        rank, size = pair
        local = _int(env, "SLURM_LOCALID") if env.get("SLURM_LOCALID") else 0
        host = env.get("MASTER_ADDR", "")
        if not host:
            nodes = next((env[v] for v in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                           "SLURM_NODELIST") if env.get(v)), None)
            if nodes is None:
                raise EnvError("SLURM_PROCID is set but no node list (SLURM_JOB_NODELIST or "
                               "SLURM_NODELIST): set MASTER_ADDR to the host of task 0")
            host = expand_nodelist(nodes)[0]
        fallback = None
        if env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID"):
            job_id = _int(env, "SLURM_JOB_ID" if env.get("SLURM_JOB_ID") else "SLURM_JOBID")
            fallback = _SLURM_PORT_BASE + _SLURM_PORT_STEP * (job_id % _SLURM_PORT_SLOTS)
        return Job("slurm", rank, size, local, host,
                   _port(env, fallback, "from SLURM_JOB_ID"))
    return None


def find_executable(name, bin_dir=None):
    """adaps-scheduler / adaps-server: in bin_dir, else $ADAPS_BIN_DIR (or their scheduler/,
    server/, worker/, bin/ folders), else on PATH; None when not found."""
    for d in (bin_dir, os.environ.get("ADAPS_BIN_DIR")):
        if d:
            for sub in ("", "scheduler", "server", "worker", "bin"):
                p = os.path.join(d, sub, name)
                if os.path.isfile(p) and os.access(p, os.X_OK):
                    return p
    return shutil.which(name)


def free_port():
    """A TCP port free on every interface now (the OS's pick; the server binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def wait_for_port(host, port, timeout, alive=None):
    """True once a TCP connection to host:port succeeds; False after `timeout` seconds, or
    as soon as alive() says the process that should listen there is gone."""
    end = time.monotonic() + timeout
    delay = 0.05
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(5.0, timeout)):
                return True
        except OSError:
            pass
        if time.monotonic() >= end or (alive is not None and not alive()):
            return False
        time.sleep(delay)
        delay = min(1.0, delay * 2)


# --- Children tied to this process's lifetime --------------------------------------------

_PR_SET_PDEATHSIG = 1
_libc = None


def _die_with_parent(parent_pid):
    """preexec_fn: the child gets SIGTERM when the thread that started it ends."""
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


class _Keeper:
    """A thread that never returns and starts the children. PR_SET_PDEATHSIG fires when the
    *thread* that forked a child ends, so the children are started from this one, which
    lives as long as the process, whatever thread called worker_from_env()."""

    def __init__(self):
        global _libc
        if _libc is None and sys.platform.startswith("linux"):
            try:
                _libc = ctypes.CDLL(None, use_errno=True)  # loaded here, not after fork
            except OSError:
                _libc = None
        self._lock = threading.Lock()
        self._work = []
        self._ready = threading.Condition(self._lock)
        threading.Thread(target=self._run, name="adaps-rendezvous", daemon=True).start()

    def _run(self):
        while True:
            with self._lock:
                while not self._work:
                    self._ready.wait()
                fn, box, done = self._work.pop(0)
            try:
                box.append((True, fn()))
            except BaseException as e:  # handed to the caller
                box.append((False, e))
            done.set()

    def popen(self, argv, **kwargs):
        parent = os.getpid()
        box, done = [], threading.Event()
        fn = lambda: subprocess.Popen(argv, preexec_fn=lambda: _die_with_parent(parent),
                                      **kwargs)
        with self._lock:
            self._work.append((fn, box, done))
            self._ready.notify()
        done.wait()
        ok, value = box[0]
        if not ok:
            raise value
        return value


class HostedJob:
    """The scheduler and servers that launcher rank 0 runs for the job."""

    def __init__(self):
        self.procs = []       # scheduler first
        self.worker = None    # weak reference to rank 0's Worker, stopped at exit
        self.failed = False   # an uncaught exception: stop at once instead of waiting
        self.wait_s = DEFAULT_TIMEOUT_S
        self._keeper = _Keeper()

    def start(self, job, num_servers, optimizer, timeout, log_level="warn"):
        scheduler_bin = find_executable("adaps-scheduler")
        server_bin = find_executable("adaps-server")
        for name, path in (("adaps-scheduler", scheduler_bin), ("adaps-server", server_bin)):
            if path is None:
                raise EnvError("%s not found (rank 0 starts the job's scheduler and servers: "
                               "set ADAPS_BIN_DIR or PATH)" % name)
        self.wait_s = timeout
        tmp = tempfile.mkdtemp(prefix="adaps-rdzv-")
        port_file = os.path.join(tmp, "port")
        common = dict(stdin=subprocess.DEVNULL, env=dict(os.environ))
        sched = self._keeper.popen(
            [scheduler_bin, "--host=0.0.0.0", "--port=%d" % job.port,
             "--num_workers=%d" % job.world_size, "--num_servers=%d" % num_servers,
             "--port_file=" + port_file, "--log_level=" + log_level], **common)
        self.procs.append(sched)
        end = time.monotonic() + timeout
        while not os.path.exists(port_file) and sched.poll() is None and \
                time.monotonic() < end:
            time.sleep(0.02)
        shutil.rmtree(tmp, ignore_errors=True)
        if sched.poll() is not None or time.monotonic() >= end:
            self.stop(at_once=True)
            raise EnvError("the adaps scheduler of this job (rank 0 starts it) could not "
                           "listen on 0.0.0.0:%d (%s; its output is above): is the port in "
                           "use? Set ADAPS_SCHEDULER_PORT to another"
                           % (job.port, "exit code %s" % sched.poll()
                              if sched.poll() is not None else "no answer in %gs" % timeout))
        local = "tcp://127.0.0.1:%d" % job.port
        for i in range(num_servers):
            port = free_port()
            self.procs.append(self._keeper.popen(
                [server_bin, "--scheduler=" + local, "--identity=s%d" % i,
                 "--optimizer=" + optimizer, "--host=0.0.0.0", "--port=%d" % port,
                 "--advertise=tcp://%s:%d" % (job.host, port), "--log_level=" + log_level],
                **common))
        atexit.register(self.at_exit)
        _hook_uncaught(self)

    def adopt(self, worker):
        self.worker = weakref.ref(worker)

    def at_exit(self):
        w = self.worker() if self.worker is not None else None
        if w is not None:
            try:
                w.stop()  # leaves the job: the scheduler ends when every worker has
            except Exception:  # noqa: BLE001 (the process is exiting; nothing to report to)
                pass
        self.stop(at_once=self.failed)

    def stop(self, at_once=False):
        """Waits (unless at_once) for the scheduler to end the job, then stops what is left."""
        if not self.procs:
            return
        sched = self.procs[0]
        if not at_once and sched.poll() is None:
            try:
                sched.wait(timeout=2)
            except subprocess.TimeoutExpired:
                sys.stderr.write("adaps: rank 0 hosts the job's scheduler: waiting up to %gs "
                                 "for the other ranks to leave\n" % self.wait_s)
                sys.stderr.flush()
                try:
                    sched.wait(timeout=self.wait_s)
                except subprocess.TimeoutExpired:
                    pass
        if not at_once:
            # The servers end on the scheduler's shutdown.
            end = time.monotonic() + 30
            for p in self.procs[1:]:
                try:
                    p.wait(timeout=max(0.0, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []


def _hook_uncaught(hosted):
    previous = sys.excepthook

    def hook(kind, value, tb):
        hosted.failed = True  # the others cannot finish without rank 0: no waiting at exit
        previous(kind, value, tb)

    sys.excepthook = hook


def scheduler_for(job, env, timeout):
    """The scheduler's address for this process: rank 0 starts the scheduler and servers
    (a HostedJob, returned too), every other rank waits until the scheduler's port answers.
    EnvError when it cannot start or never answers."""
    hosted = None
    if job.rank == 0:
        servers = _int(env, "ADAPS_NUM_SERVERS", 1) if env.get("ADAPS_NUM_SERVERS") else 1
        hosted = HostedJob()
        hosted.start(job, servers, env.get("ADAPS_SERVER_OPTIMIZER") or "mean", timeout,
                     env.get("ADAPS_LOG_LEVEL") or "warn")
    elif not wait_for_port(job.host, job.port, timeout):
        raise EnvError("no adaps scheduler answered at %s:%d within %gs (%s rank 0 starts "
                       "it there: is rank 0 running, and is that port reachable from this "
                       "host? ADAPS_SCHEDULER_PORT sets the port, ADAPS_REGISTER_TIMEOUT_S "
                       "the wait)" % (job.host, job.port, timeout, job.launcher))
    return job.address, hosted
