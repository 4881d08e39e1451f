"""Runs N copies of a training script against a local adaps cluster.

    /usr/bin/python3 -m adaps.launch -n 2 [--servers 1 | --colocate] [--server-optimizer sgd]
        [--compression adacomp] [--pull recompressed] [--lr 0.1] script.py [script args...]

Starts adaps-scheduler (OS-assigned port, read back from its --port_file) and the
servers on 127.0.0.1, then N copies of `script.py` with this environment:

  ADAPS_SCHEDULER         tcp://127.0.0.1:<port>   (adaps.worker_from_env() reads it)
  ADAPS_SERVER_OPTIMIZER  the servers' --optimizer (adaps.torch picks its mode from it)
  ADAPS_COMPRESSION, ADAPS_PULL, ADAPS_BIN_SIZE, ADAPS_CONV_BIN_SIZE,
  ADAPS_TOPK_FRACTION, ADAPS_LR, ADAPS_EXCHANGE, ADAPS_SECOND_MOMENT, ADAPS_OWN_UPDATES,
  ADAPS_BIN_SCHEDULE, ADAPS_ROW_SPARSE, ADAPS_LOCAL_STEPS, ADAPS_PHASE_BINS
                          --compression, --pull, --bin-size, --conv-bin-size,
                          --topk-fraction, --lr, --exchange, --second-moment, --own-updates,
                          --bin-schedule, --row-sparse, --local-steps, --phase-bins,
                          each only when given: the defaults of
                          adaps.torch.DistributedOptimizer (an argument the script passes
                          explicitly wins, with a warning when it differs)
  ADAPS_LOCAL_RANK, ADAPS_NUM_WORKERS, OMP_NUM_THREADS (cores / N unless set)
  ADAPS_RANK_FILE         where worker_from_env() writes the rank (for the prefix)
  ADAPS_CURVE_SERVER_KEY, ADAPS_CURVE_CLIENT_KEY
                          with --curve DIR: DIR/server.pub and DIR/client.key (the
                          scheduler and servers serve with DIR/server.key, admitting
                          DIR/allowed_clients): the job encrypted with ZeroMQ CURVE

Every output line is forwarded with a prefix: [r<rank>] for a worker once
adaps.worker_from_env() registered it (the scheduler's rank; [w<i>] before, i = start
order), [s<i>] for servers, [sched] for the scheduler. When this output is a terminal, the
workers get ADAPS_PROGRESS=tty and rank 0's adaps.progress line is rewritten in place. When a worker fails
or the scheduler dies, everything is stopped and the exit code is the failure's;
Ctrl-C stops everything (exit 130). Executables: --bin-dir, else $ADAPS_BIN_DIR, else PATH.

Elastic jobs (docs/reliability.md "Workers that join"): --max-workers M lets workers join
the running job while fewer than M are live; `python3 -m adaps.launch --join ADDRESS -n K
--server-optimizer OPT script.py` starts K more copies of the script into the job whose
scheduler is at ADDRESS (the job's launch prints it when started with --max-workers; give
the job's --server-optimizer and torch flags again). A joined worker takes the servers' current
parameters and takes part from the next step on (local mode, --server-optimizer mean: where
the servers keep the model as the running sum of the workers' mean updates, the update
exchange with the average outer step and one H; adaps.torch refuses a joiner otherwise,
saying why, and launch says so at start). The servers' steps average over the live
workers: scaling the learning rate with their number is the script's choice
(adaps.Worker.live_workers says how many there are).

Worker restarts: with --worker-restarts K, every worker gets a stable ADAPS_IDENTITY, and a
worker that exits with an error is started again (up to K times in all, as torchrun's
--max-restarts): it takes its rank back and resumes from the servers' parameters.

Several machines (torchrun's shape): run the same command on every node, with its own
--node-rank:

    python3 -m adaps.launch --nnodes N --node-rank I --rdzv HOST:PORT -n K [flags] script.py

HOST:PORT is where node 0's scheduler listens (on every interface) and what every worker's
ADAPS_SCHEDULER names: an address of node 0 the other nodes reach. Node 0 starts the
scheduler, expecting N*K workers, and the servers (--servers S, default 1); with --colocate
every node runs one server beside its workers instead (N in all). Servers listen on every
interface and advertise HOST (node 0) or --node-addr (default: this node's address on
the route to HOST). Every node starts K workers (ADAPS_NUM_WORKERS is N*K, ADAPS_NODE_RANK
and ADAPS_NNODES say where they run). Nodes I > 0 wait for the scheduler's port up to
--rdzv-timeout seconds (default 600) and fail naming HOST:PORT when it never answers. A
worker's failure stops this node's processes with its exit code, and (unless
--worker-restarts or --max-workers) the scheduler then fails the job on the other nodes
(--on_worker_death=fail). Node 0 keeps the scheduler until every node's workers have left
(up to --rdzv-timeout after its own finished). Without --nnodes, --rdzv-timeout is how long
the job may take to form: the servers and the workers wait that long for the others.

Server restarts: every server runs with --identity=s<i>. With --checkpoint-dir, servers
checkpoint there (every --checkpoint-interval seconds, default 30) and a server that dies
while the workers run is started again with the same flags (up to --server-restarts
times, default 3): it restores its shard and the workers resume it. Without
--checkpoint-dir a dead server ends the job (a fresh server would have lost the model).
"""
import argparse
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

from adaps import _COMPRESSIONS, _LAYER_TYPES, _parse_compression
from adaps import rendezvous


def _local_steps_arg(text):
    """--local-steps: H >= 1, or phases H@END,...,H (adaps.torch checks the rest)."""
    end = r"([1-9][0-9]*|lr/[0-9]*\.?[0-9]+)"
    if not re.fullmatch(r"[1-9][0-9]*|([1-9][0-9]*@%s,)+[1-9][0-9]*" % end, text):
        raise argparse.ArgumentTypeError(
            "%r: give H >= 1 (exchange every H steps) or phases H@END,...,H (every H steps "
            "until END, a step or lr/K: where the learning rate is at most its peak / K; the "
            "last H to the end), e.g. 4@lr/2,64" % (text,))
    return text


def _compression_arg(text):
    """--compression: a compressor's name, or TYPE:NAME,... per layer type."""
    try:
        parsed = _parse_compression(text)
    except ValueError:
        parsed = None
    names = parsed.values() if isinstance(parsed, dict) else [parsed]
    if parsed is None or any(n not in _COMPRESSIONS for n in names):
        raise argparse.ArgumentTypeError(
            "%r: give one of %s, or TYPE:NAME,... with TYPE one of %s"
            % (text, ", ".join(_COMPRESSIONS), ", ".join(_LAYER_TYPES)))
    return text


def _local_joins_refused(a):
    """Whether adaps.torch would refuse this elastic job's joiners: local mode whose servers
    do not keep the model, i.e. the gradient exchange (--exchange, else ADAPS_EXCHANGE, else
    the default: gradient when every layer is sent dense) or DiLoCo's outer momentum
    (ADAPS_OUTER=nesterov, each worker's own), and local_steps phases (a joiner's steps
    count from its own first)."""
    if a.server_optimizer != "mean":
        return False
    exchange = getattr(a, "exchange", None) or os.environ.get("ADAPS_EXCHANGE")
    if exchange is None:
        parsed = _parse_compression(getattr(a, "compression", None) or
                                    os.environ.get("ADAPS_COMPRESSION") or "adacomp")
        names = list(parsed.values()) if isinstance(parsed, dict) else [parsed]
        every_layer = not isinstance(parsed, dict) or len(parsed) == len(_LAYER_TYPES)
        exchange = "gradient" if every_layer and all(n == "dense" for n in names) else "update"
    return exchange == "gradient" or os.environ.get("ADAPS_OUTER", "average") == "nesterov" \
        or "@" in str(getattr(a, "local_steps", None) or os.environ.get("ADAPS_LOCAL_STEPS", ""))


# Flags that reach adaps.torch.DistributedOptimizer's defaults through the environment.
_TORCH_FLAGS = (
    ("--compression", "ADAPS_COMPRESSION", "dense, adacomp, topk or sign, or per layer type "
     "as TYPE:NAME,... (types conv, linear, recurrent, embedding, other; adacomp for a type "
     "left out) (default adacomp; an embedding under plain SGD: topk)",
     dict(type=_compression_arg)),
    ("--pull", "ADAPS_PULL", "sparse, dense or recompressed (default: sparse where the "
     "servers' step allows it, else dense; recompressed in local mode: the servers "
     "recompress the running sum of the workers' mean updates at the bin size / 10: about "
     "two pushes' bytes at any worker count, for a little delay; the default of local "
     "mode's compressed updates from 8 workers on, and from 2 with --local-steps)",
     dict(choices=("sparse", "dense", "recompressed"))),
    ("--bin-size", "ADAPS_BIN_SIZE", "AdaComp bin size of non-conv layers (default 500)",
     dict(type=int)),
    ("--conv-bin-size", "ADAPS_CONV_BIN_SIZE", "AdaComp bin size of conv layers (default 50)",
     dict(type=int)),
    ("--topk-fraction", "ADAPS_TOPK_FRACTION", "for --compression topk (default 0.001)",
     dict(type=float)),
    ("--lr", "ADAPS_LR", "replaces every param group's learning rate", dict(type=float)),
    ("--exchange", "ADAPS_EXCHANGE", "what local mode sends: update (each worker's own "
     "optimizer step, the default with a compressor) or gradient (the default when dense)",
     dict(choices=("gradient", "update"))),
    ("--second-moment", "ADAPS_SECOND_MOMENT", "Adam/AdamW in the update exchange: global (the "
     "default: the step divides by the global batch's estimated second moment) or local "
     "(torch's own)", dict(choices=("global", "local"))),
    ("--own-updates", "ADAPS_OWN_UPDATES", "update exchange: how much of its own residue each "
     "worker's model holds: share (1/W, the default for Adam/AdamW), all, estimate (1/W plus "
     "the others' estimated where the workers' updates agree), or off (the default for other "
     "optimizers; every replica identical)", dict(choices=("share", "all", "estimate", "off"))),
    ("--bin-schedule", "ADAPS_BIN_SCHEDULE", "optimizers with a second moment in the update "
     "exchange: auto (the default: AdaComp bins 2x smaller while the learning rate is at "
     "most 3/4 of its mean over the residues' last three measured delays, 4x at 3/8, back "
     "up as it recovers; not before 10/(1-beta1) steps; convolutions keep theirs) or off "
     "(the declared sizes throughout)", dict(choices=("auto", "off"))),
    ("--row-sparse", "ADAPS_ROW_SPARSE", "update exchange: exact (the default: an embedding of "
     ">= 4096 rows sends its gradient's nonzero elements exactly and steps on their mean, as "
     "DDP) or off (AdaComp's update exchange like every tensor)",
     dict(choices=("exact", "off"))),
    ("--local-steps", "ADAPS_LOCAL_STEPS", "update exchange: exchange every H steps, each "
     "worker stepping on its own between (default 1; ADAPS_OUTER=nesterov for DiLoCo's outer "
     "step), or phases H@END,...,H: every H steps until END, a step or lr/K (the learning "
     "rate at most its peak / K); at 16 workers 4@lr/1.12,16 with --bin-size 2200 held "
     "every zoo model at about 1,000x fewer bytes (docs/local-steps.md)",
     dict(type=_local_steps_arg)),
    ("--phase-bins", "ADAPS_PHASE_BINS", "with --local-steps phases: scale (the default: each "
     "phase pushes at the AdaComp bins times the first phase's H / its own, down to 25) or "
     "keep (every phase at the first phase's bins)", dict(choices=("scale", "keep"))),
)


def _find_bin(name, bin_dir):
    p = rendezvous.find_executable(name, bin_dir)
    if p:
        return p
    sys.exit("adaps.launch: %s not found (use --bin-dir, ADAPS_BIN_DIR or PATH)" % name)


def _rdzv_endpoint(text):
    """--rdzv: HOST:PORT (a tcp:// prefix is allowed) -> (host, port)."""
    rest = text[len("tcp://"):] if text.startswith("tcp://") else text
    host, sep, port = rest.rpartition(":")
    try:
        port = int(port)
    except ValueError:
        port = 0
    if not sep or not host or not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError("%r: expected HOST:PORT (port 1 to 65535), the "
                                         "address of node 0 the other nodes reach" % text)
    return host, port


def _address_towards(host, port):
    """This machine's address on the route to host (no packet is sent), for servers the
    other nodes must reach; None when there is no route."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return s.getsockname()[0]
    except OSError:
        return None


# Whether a forwarded progress line is open (no newline yet); guarded by the output lock.
_open_progress = [False]


class _Proc:
    def __init__(self, tag, argv, env, out_lock, rank_file=None):
        self.tag = tag
        self._rank_file = rank_file
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        self._lock = out_lock
        self._thread = threading.Thread(target=self._forward, daemon=True)
        self._thread.start()

    def _forward(self):
        # Lines end at "\n"; adaps.progress rewrites its line with "\r...\x1b[K" and no
        # newline, so the output is split at "\r" too and such a line is forwarded as it comes.
        fd = self.proc.stdout.fileno()
        buf = b""
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            buf += chunk
            while True:
                ends = [i for i in (buf.find(b"\n"), buf.find(b"\r")) if i >= 0]
                if not ends:
                    break
                i = min(ends)
                self._emit(buf[:i], buf[i:i + 1])
                buf = buf[i + 1:]
        if buf:
            self._emit(buf, b"\n")

    def _emit(self, raw, end):
        if not raw and end == b"\r":
            return
        if self._rank_file and os.path.exists(self._rank_file):
            # The scheduler's rank, written by adaps.worker_from_env() once registered.
            with open(self._rank_file) as f:
                rank = f.read().strip()
            if rank:
                self.tag = "r" + rank
                self._rank_file = None
        line = raw.decode("utf-8", "replace")
        with self._lock:
            if line.endswith("\x1b[K"):  # a progress line: rewrite it in place
                sys.stdout.write("\r[%s] %s" % (self.tag, line))
                _open_progress[0] = end != b"\n"
                if end == b"\n":
                    sys.stdout.write("\n")
            else:
                if _open_progress[0]:
                    sys.stdout.write("\r\x1b[K")  # the next redraw brings it back
                    _open_progress[0] = False
                sys.stdout.write("[%s] %s\n" % (self.tag, line))
            sys.stdout.flush()

    def poll(self):
        return self.proc.poll()

    def signal(self, sig):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def join_output(self, timeout=2.0):
        self._thread.join(timeout)


def _stop_all(procs, grace=3.0):
    for p in procs:
        p.signal(signal.SIGTERM)
    end = time.time() + grace
    for p in procs:
        while p.poll() is None and time.time() < end:
            time.sleep(0.05)
        p.signal(signal.SIGKILL)
        p.proc.wait()


def _curve_files(ap, key_dir):
    """--curve DIR: the key files by name and the serving flags (scheduler and servers), or
    None without --curve; a usage error naming what is missing."""
    if key_dir is None:
        return None
    files = {name: os.path.abspath(os.path.join(key_dir, name))
             for name in ("server.key", "server.pub", "client.key", "allowed_clients")}
    missing = [n for n, path in files.items() if not os.path.isfile(path)]
    if missing:
        ap.error("--curve %s: no %s there (deploy/curve-keys.sh DIR makes the keys)"
                 % (key_dir, ", ".join(missing)))
    files["serve"] = ["--curve_server_key=" + files["server.key"],
                      "--curve_allowed_clients=" + files["allowed_clients"]]
    return files


def _start_scheduler(a, scheduler_bin, port_file, env, lock, procs, interrupted, serve_args):
    """Starts the job's scheduler; its address, or None when it did not start."""
    argv = [scheduler_bin, "--num_servers=%d" % a.servers,
            "--num_workers=%d" % (a.workers * a.nodes), "--port_file=" + port_file,
            "--log_level=" + a.log_level] + serve_args
    if a.max_workers is not None:
        argv.append("--max_workers=%d" % a.max_workers)
    if a.nnodes is not None:
        # Every interface at the rendezvous port: the other nodes connect to HOST:PORT.
        argv += ["--host=0.0.0.0", "--port=%d" % a.rdzv[1]]
        if a.worker_restarts == 0 and a.max_workers is None:
            # Another node's failed worker fails the job here too, as one launch would.
            argv.append("--on_worker_death=fail")
    procs.append(_Proc("sched", argv, env, lock))
    # Stops as soon as the scheduler exits; a long wait only while it runs and is slow.
    end = time.time() + 120
    port = ""
    while not port and time.time() < end and procs[0].poll() is None and not interrupted:
        if os.path.exists(port_file):
            with open(port_file) as f:
                port = f.read().strip()
        time.sleep(0.02)
    if not port:
        sys.stderr.write("adaps.launch: the scheduler did not start%s\n"
                         % (" (could it listen on port %d? its output is above)" % a.rdzv[1]
                            if a.nnodes is not None else ""))
        return None
    if a.nnodes is not None:
        return "tcp://%s:%d" % a.rdzv
    return "tcp://127.0.0.1:" + port


def _wait_for_other_nodes(a, infra, scheduler, interrupted):
    """This node's workers all finished: waits (up to --rdzv-timeout) for the scheduler (node
    0) or this node's servers to end the job once the other nodes' workers have left; the
    exit code."""
    sys.stderr.write("adaps.launch: this node's workers finished; waiting up to %gs for the "
                     "other nodes' workers to leave\n" % a.rdzv_timeout)
    sys.stderr.flush()
    end = time.time() + a.rdzv_timeout
    while any(p.poll() is None for p in infra):
        if interrupted:
            sys.stderr.write("adaps.launch: interrupted, stopping everything\n")
            return 130
        if time.time() >= end:
            sys.stderr.write("adaps.launch: the other nodes' workers did not leave within "
                             "%gs of this node's; stopping\n" % a.rdzv_timeout)
            return 1
        time.sleep(0.1)
    if scheduler is not None and scheduler.poll() != 0:
        sys.stderr.write("adaps.launch: the scheduler ended with %d (a worker on another node "
                         "failed; its node's output says why)\n" % scheduler.poll())
        return 1
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m adaps.launch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--workers", type=int, required=True, help="training processes")
    ap.add_argument("--servers", type=int, default=None, help="server shards (default 1)")
    ap.add_argument("--colocate", action="store_true",
                    help="one server per worker, BytePS-style (deploy/launch.sh --colocate "
                         "places them on the workers' hosts; here every process is local); "
                         "with --nnodes, one server per node, beside its workers")
    ap.add_argument("--max-workers", type=int, default=None,
                    help="elastic: the scheduler's --max_workers (workers may join the "
                         "running job, with --join, while fewer than this many are live)")
    ap.add_argument("--join", default=None, metavar="ADDRESS",
                    help="start the workers into the running job whose scheduler is at "
                         "ADDRESS (tcp://host:port); starts no scheduler or server")
    ap.add_argument("--nnodes", type=int, default=None,
                    help="several machines: the number of nodes, each running this command "
                         "with its own --node-rank (torchrun's shape; see above)")
    ap.add_argument("--node-rank", type=int, default=None,
                    help="with --nnodes: this node's index, 0 to N-1; node 0 runs the "
                         "scheduler and the servers (default 0)")
    ap.add_argument("--rdzv", "--rdzv-endpoint", type=_rdzv_endpoint, default=None,
                    metavar="HOST:PORT",
                    help="with --nnodes: where node 0's scheduler listens, an address of "
                         "node 0 every node reaches (required with --nnodes > 1)")
    ap.add_argument("--node-addr", default=None,
                    help="with --nnodes: this node's address as the other nodes reach it, "
                         "advertised by its servers (default: HOST on node 0, else this "
                         "node's address on the route to HOST)")
    ap.add_argument("--rdzv-timeout", type=float, default=600,
                    help="seconds the job may take to form (the servers and workers wait "
                         "that long for the others to register); with --nnodes also how "
                         "long a node waits for node 0's scheduler, and node 0 for the "
                         "other nodes' workers to leave after its own finished (default 600)")
    ap.add_argument("--worker-restarts", type=int, default=0,
                    help="restart a worker that exits with an error, up to this many times in "
                         "all; it rejoins with its rank (default 0)")
    ap.add_argument("--server-optimizer", default=None,
                    help="servers' --optimizer: mean (local mode, the default: every "
                         "worker runs the torch optimizer, whatever it is, and exchanges its "
                         "update), or sgd, momentum, nesterov, adam (server mode: the servers "
                         "run it; torch.optim.SGD or Adam only); with --join, the job's, "
                         "required")
    for flag, env, what, kind in _TORCH_FLAGS:
        ap.add_argument(flag, *(["--compressor"] if flag == "--compression" else []),
                        default=None, help="exported as %s: %s" % (env, what), **kind)
    ap.add_argument("--mode", default="sync", help="servers' --mode: sync or async")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="extra adaps-server flag, e.g. --server-arg=--learning_rate=0.1")
    ap.add_argument("--checkpoint-dir", default=None,
                    help="servers' --checkpoint_dir; enables restarting a dead server")
    ap.add_argument("--checkpoint-interval", type=float, default=30,
                    help="servers' --checkpoint_interval_s with --checkpoint-dir, in seconds "
                         "(fractions too; default 30)")
    ap.add_argument("--server-restarts", type=int, default=3,
                    help="how many times a dead server is restarted in all (default 3)")
    ap.add_argument("--curve", default=None, metavar="DIR",
                    help="run the job encrypted with ZeroMQ CURVE, keys from DIR "
                         "(deploy/curve-keys.sh DIR makes them: server.key, server.pub, "
                         "client.key, allowed_clients); every node of the job gives its own "
                         "copy")
    ap.add_argument("--bin-dir", default=None, help="where adaps-scheduler/-server are")
    ap.add_argument("--log-level", default="warn", help="scheduler and server log level")
    ap.add_argument("--python", default=sys.executable, help="interpreter for the script")
    ap.add_argument("script")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    if a.colocate and a.servers is not None:
        ap.error("--colocate runs one server per worker: drop --servers")
    if a.nnodes is None:
        for flag, value in (("--node-rank", a.node_rank), ("--rdzv", a.rdzv),
                            ("--node-addr", a.node_addr)):
            if value is not None:
                ap.error("%s belongs to a launch over several nodes: give --nnodes too" % flag)
        a.nodes, a.node_rank = 1, 0
    else:
        if a.join is not None:
            ap.error("--join adds workers to a running job; it does not go with --nnodes "
                     "(run the job's launch over the nodes, and --join on its own)")
        if a.nnodes < 1:
            ap.error("--nnodes must be at least 1")
        if a.node_rank is None:
            a.node_rank = 0
        if not 0 <= a.node_rank < a.nnodes:
            ap.error("--node-rank %d is not below --nnodes %d (nodes are 0 to %d)"
                     % (a.node_rank, a.nnodes, a.nnodes - 1))
        if a.rdzv is None:
            if a.nnodes > 1:
                ap.error("--nnodes %d needs --rdzv HOST:PORT: where node 0's scheduler "
                         "listens, an address every node reaches" % a.nnodes)
            a.rdzv = ("127.0.0.1", rendezvous.free_port())
        if a.rdzv_timeout <= 0:
            ap.error("--rdzv-timeout must be positive")
        a.nodes = a.nnodes
    if a.join is not None:
        for flag, value in (("--servers", a.servers), ("--colocate", a.colocate or None),
                            ("--max-workers", a.max_workers),
                            ("--checkpoint-dir", a.checkpoint_dir)):
            if value is not None:
                ap.error("--join starts workers into a running job: %s belongs to the job's "
                         "own launch" % flag)
        if a.server_optimizer is None:
            ap.error("--join needs the job's --server-optimizer (adaps.torch picks its mode "
                     "from it)")
        if not a.join.startswith("tcp://"):
            ap.error("--join takes the scheduler's address, tcp://host:port")
    curve = _curve_files(ap, a.curve)
    if a.server_optimizer is None:
        # Local mode: any torch optimizer, per-group settings, clipping and AMP work, and it
        # is at least as accurate and as small on the wire as server mode on the SGD models
        # too (docs/accuracy.md, the zoo); server mode refuses all but SGD and Adam.
        a.server_optimizer = "mean"
    if a.max_workers is not None and a.max_workers < a.workers * a.nodes:
        ap.error("--max-workers (%d) must be at least -n (%d)%s"
                 % (a.max_workers, a.workers * a.nodes,
                    " times --nnodes" if a.nodes > 1 else ""))
    if a.worker_restarts < 0:
        ap.error("--worker-restarts must be 0 or more")
    if a.servers is None:
        # With --nnodes, --colocate is one server per node (beside that node's workers).
        a.servers = 0 if a.join else (a.nodes if a.nnodes is not None else a.workers) \
            if a.colocate else 1
    if a.workers < 1 or (a.servers < 1 and not a.join):
        ap.error("-n and --servers must be at least 1")
    # What this node starts: the scheduler on node 0 (none with --join); its servers
    # (their indices: all on node 0, or this node's one with --colocate over nodes).
    starts_scheduler = not a.join and a.node_rank == 0
    if a.join:
        local_servers = []
    elif a.nnodes is not None and a.colocate:
        local_servers = [a.node_rank]
    else:
        local_servers = list(range(a.servers)) if a.node_rank == 0 else []
    if a.nnodes is not None:
        advertise = a.node_addr or (a.rdzv[0] if a.node_rank == 0 else
                                    _address_towards(*a.rdzv))
        if advertise is None and local_servers:
            ap.error("no route from this node to %s: give --node-addr (this node's address "
                     "as the others reach it)" % a.rdzv[0])

    scheduler_bin = _find_bin("adaps-scheduler", a.bin_dir) if starts_scheduler else None
    server_bin = _find_bin("adaps-server", a.bin_dir) if local_servers else None
    tmp = tempfile.mkdtemp(prefix="adaps-launch-")
    port_file = os.path.join(tmp, "port")
    lock = threading.Lock()
    procs = []
    interrupted = []

    def on_signal(signum, frame):
        interrupted.append(signum)

    old_int = signal.signal(signal.SIGINT, on_signal)
    old_term = signal.signal(signal.SIGTERM, on_signal)
    code = 0
    try:
        env = dict(os.environ)
        if a.join:
            address = a.join
        elif not starts_scheduler:
            address = "tcp://%s:%d" % a.rdzv
            sys.stderr.write("adaps.launch: node %d of %d: waiting up to %gs for node 0's "
                             "scheduler at %s\n" % (a.node_rank, a.nnodes, a.rdzv_timeout,
                                                    address))
            sys.stderr.flush()
            if not rendezvous.wait_for_port(a.rdzv[0], a.rdzv[1], a.rdzv_timeout,
                                            alive=lambda: not interrupted):
                if interrupted:
                    return 130
                sys.stderr.write("adaps.launch: no scheduler answered at %s:%d within %gs "
                                 "(is node 0 started with --rdzv %s:%d, and is the port "
                                 "reachable from this node?)\n"
                                 % (a.rdzv[0], a.rdzv[1], a.rdzv_timeout, a.rdzv[0],
                                    a.rdzv[1]))
                return 1
        else:
            address = _start_scheduler(a, scheduler_bin, port_file, env, lock, procs,
                                       interrupted, curve["serve"] if curve else [])
            if address is None:
                return 1
            if a.max_workers is not None:
                sys.stderr.write("adaps.launch: scheduler at %s; up to %d workers (add some "
                                 "with: python3 -m adaps.launch --join %s -n K "
                                 "--server-optimizer %s SCRIPT)\n"
                                 % (address, a.max_workers, address, a.server_optimizer))
                if _local_joins_refused(a):
                    sys.stderr.write(
                        "adaps.launch: note: in local mode (--server-optimizer mean) "
                        "adaps.torch lets a worker join only the update exchange (the "
                        "default with a compressor) with the average outer step: its "
                        "servers then keep the model; with --exchange gradient (the "
                        "default when dense), ADAPS_OUTER=nesterov or --local-steps "
                        "phases (H@END,...), joiners are refused\n")
                sys.stderr.flush()
        if a.checkpoint_dir:
            os.makedirs(a.checkpoint_dir, exist_ok=True)
        server_argv, servers = [], []
        for s in local_servers:
            # The launcher watches the workers (one that fails stops the job), so the
            # servers wait for slow starters (torch 2.x imports on a busy machine take
            # minutes) as long as the rendezvous does, not adaps-server's default minute.
            argv_s = [server_bin, "--scheduler=" + address, "--identity=s%d" % s,
                      "--optimizer=" + a.server_optimizer, "--mode=" + a.mode,
                      "--log_level=" + a.log_level,
                      "--register_timeout_ms=%d" % int(a.rdzv_timeout * 1000)]
            if a.nnodes is not None:
                # Every interface, advertised at this node's address the others reach.
                port = rendezvous.free_port()
                argv_s += ["--host=0.0.0.0", "--port=%d" % port,
                           "--advertise=tcp://%s:%d" % (advertise, port)]
            if curve:
                argv_s += curve["serve"] + ["--curve_client_key=" + curve["client.key"]]
            if a.checkpoint_dir:
                argv_s += ["--checkpoint_dir=" + a.checkpoint_dir,
                           "--checkpoint_interval_s=%g" % a.checkpoint_interval]
            server_argv.append(argv_s + a.server_arg)
            servers.append(_Proc("s%d" % s, server_argv[-1], env, lock))
            procs.append(servers[-1])
        scheduler = procs[0] if starts_scheduler else None
        server_env = env  # (`env` is reused below)
        threads = str(max(1, (os.cpu_count() or 1) // a.workers))
        # A stable identity per worker when it may be restarted (it takes its rank back).
        job_tag = "launch%d-%x" % (os.getpid(), int(time.time() * 1000) & 0xffffff)
        if a.nnodes is not None:
            job_tag += "-n%d" % a.node_rank
        workers, worker_argv = [], []
        for r in range(a.workers):
            wenv = dict(os.environ)
            wenv.update({"ADAPS_SCHEDULER": address,
                         "ADAPS_SERVER_OPTIMIZER": a.server_optimizer,
                         "ADAPS_LOCAL_RANK": str(r),
                         "ADAPS_NUM_WORKERS": str(a.workers * a.nodes),
                         "ADAPS_RANK_FILE": os.path.join(tmp, "rank%d" % r),
                         "PYTHONUNBUFFERED": "1"})
            if a.nnodes is not None:
                wenv.update({"ADAPS_NODE_RANK": str(a.node_rank),
                             "ADAPS_NNODES": str(a.nnodes)})
            if curve:
                wenv.update({"ADAPS_CURVE_SERVER_KEY": curve["server.pub"],
                             "ADAPS_CURVE_CLIENT_KEY": curve["client.key"]})
            if a.worker_restarts > 0:
                wenv.setdefault("ADAPS_IDENTITY", "%s-w%d" % (job_tag, r))
            for flag, env, _, _ in _TORCH_FLAGS:
                value = getattr(a, flag[2:].replace("-", "_"))
                if value is not None:
                    wenv[env] = str(value)
            wenv.setdefault("OMP_NUM_THREADS", threads)
            wenv.setdefault("ADAPS_REGISTER_TIMEOUT_S", "%g" % a.rdzv_timeout)
            if sys.stdout.isatty():
                # adaps.progress draws its live line for a terminal; the pipe is not one.
                wenv.setdefault("ADAPS_PROGRESS", "tty")
            worker_argv.append(([a.python, a.script] + a.args, wenv))
            w = _Proc("w%d" % r, worker_argv[r][0], wenv, lock,
                      rank_file=wenv["ADAPS_RANK_FILE"])
            workers.append(w)
            procs.append(w)
        worker_restarts_left = a.worker_restarts
        infra = ([scheduler] if scheduler else []) + servers
        restarts_left = a.server_restarts if a.checkpoint_dir else 0
        while True:
            if interrupted:
                sys.stderr.write("adaps.launch: interrupted, stopping everything\n")
                code = 130
                break
            failed = [w for w in workers if w.poll() not in (None, 0)]
            if failed and worker_restarts_left > 0:
                w = failed[0]
                r = workers.index(w)
                worker_restarts_left -= 1
                sys.stderr.write("adaps.launch: %s exited with %d; starting it again, it rejoins "
                                 "with its rank (%d restart(s) left)\n"
                                 % (w.tag, w.poll(), worker_restarts_left))
                w.join_output()
                fresh = _Proc("w%d" % r, worker_argv[r][0], worker_argv[r][1], lock,
                              rank_file=worker_argv[r][1]["ADAPS_RANK_FILE"])
                workers[r] = fresh
                procs[procs.index(w)] = fresh
                continue
            if failed:
                w = failed[0]
                sys.stderr.write("adaps.launch: %s exited with %d, stopping everything\n"
                                 % (w.tag, w.poll()))
                code = w.poll() if w.poll() > 0 else 128 - w.poll()
                break
            if all(w.poll() == 0 for w in workers):
                # The scheduler and servers shut down once every worker left: the other
                # nodes' workers too, which may finish later.
                if a.nnodes is not None and a.nnodes > 1 and \
                        any(p.poll() is None for p in infra):
                    code = _wait_for_other_nodes(a, infra, scheduler, interrupted)
                    break
                # Every worker's goodbye was answered; once the servers have their Shutdown
                # (they exit), the scheduler's shutdown grace has nothing left to deliver:
                # _stop_all ends it.
                end = time.time() + 10
                while time.time() < end and any(p.poll() is None for p in servers):
                    time.sleep(0.05)
                break
            # Exit 0 is the orderly shutdown once every worker left (a worker process may
            # still be exiting); anything else is a crash.
            dead = [p for p in infra if p.poll() not in (None, 0)]
            if dead and dead[0] is not scheduler and restarts_left > 0:
                p = dead[0]
                i = servers.index(p)
                restarts_left -= 1
                sys.stderr.write("adaps.launch: %s exited with %d; restarting it from its "
                                 "checkpoint (%d restart(s) left)\n"
                                 % (p.tag, p.poll(), restarts_left))
                p.join_output()
                fresh = _Proc(p.tag, server_argv[i], server_env, lock)
                servers[i] = fresh
                infra[infra.index(p)] = fresh
                procs[procs.index(p)] = fresh
                continue
            if dead:
                sys.stderr.write("adaps.launch: %s exited with %d while workers ran, "
                                 "stopping everything\n" % (dead[0].tag, dead[0].poll()))
                code = 1
                break
            time.sleep(0.05)
    finally:
        _stop_all(procs)
        for p in procs:
            p.join_output()
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
        shutil.rmtree(tmp, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
