"""Runs N copies of a training script against a local adaps cluster.

    /usr/bin/python3 -m adaps.launch -n 2 [--servers 1 | --colocate] [--server-optimizer sgd]
        [--compression adacomp] [--pull recompressed] [--lr 0.1] script.py [script args...]

Starts adaps-scheduler (OS-assigned port, read back from its --port_file) and the
servers on 127.0.0.1, then N copies of `script.py` with this environment:

  ADAPS_SCHEDULER         tcp://127.0.0.1:<port>   (adaps.worker_from_env() reads it)
  ADAPS_SERVER_OPTIMIZER  the servers' --optimizer (adaps.torch picks its mode from it)
  ADAPS_COMPRESSION, ADAPS_PULL, ADAPS_BIN_SIZE, ADAPS_CONV_BIN_SIZE,
  ADAPS_TOPK_FRACTION, ADAPS_LR, ADAPS_EXCHANGE, ADAPS_SECOND_MOMENT, ADAPS_OWN_UPDATES,
  ADAPS_BIN_SCHEDULE, ADAPS_ROW_SPARSE
                          --compression, --pull, --bin-size, --conv-bin-size,
                          --topk-fraction, --lr, --exchange, --second-moment, --own-updates,
                          --bin-schedule, --row-sparse,
                          each only when given: the defaults of
                          adaps.torch.DistributedOptimizer (an argument the script passes
                          explicitly wins, with a warning when it differs)
  ADAPS_LOCAL_RANK, ADAPS_NUM_WORKERS, OMP_NUM_THREADS (cores / N unless set)
  ADAPS_RANK_FILE         where worker_from_env() writes the rank (for the prefix)

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
parameters and takes part from the next step on. The servers' steps average over the live
workers: scaling the learning rate with their number is the script's choice
(adaps.Worker.live_workers says how many there are).

Worker restarts: with --worker-restarts K, every worker gets a stable ADAPS_IDENTITY, and a
worker that exits with an error is started again (up to K times in all, as torchrun's
--max-restarts): it takes its rank back and resumes from the servers' parameters.

Server restarts: every server runs with --identity=s<i>. With --checkpoint-dir, servers
checkpoint there (every --checkpoint-interval seconds, default 30) and a server that dies
while the workers run is started again with the same flags (up to --server-restarts
times, default 3): it restores its shard and the workers resume it. Without
--checkpoint-dir a dead server ends the job (a fresh server would have lost the model).
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from adaps import _COMPRESSIONS, _LAYER_TYPES, _parse_compression


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


# Flags that reach adaps.torch.DistributedOptimizer's defaults through the environment.
_TORCH_FLAGS = (
    ("--compression", "ADAPS_COMPRESSION", "dense, adacomp, topk or sign, or per layer type "
     "as TYPE:NAME,... (types conv, linear, recurrent, embedding, other; adacomp for a type "
     "left out) (default adacomp; an embedding under plain SGD: topk)",
     dict(type=_compression_arg)),
    ("--pull", "ADAPS_PULL", "sparse, dense or recompressed (default: sparse where the "
     "servers' step allows it, else dense; recompressed in local mode: the servers "
     "recompress the running sum of the workers' mean updates at the bin size / (2.5 W): "
     "fewer bytes for a little delay; not the default)",
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
    ("--bin-schedule", "ADAPS_BIN_SCHEDULE", "Adam/AdamW in the update exchange: auto (the "
     "default: AdaComp bins 2x smaller at 3/4 of the peak learning rate, 4x at 3/8, and "
     "while the rate stays at its peak 2x, 4x, 8x after 5, 10, 20/(1-beta1) steps there; "
     "after 10/(1-beta1) steps) or off (the declared sizes "
     "throughout)", dict(choices=("auto", "off"))),
    ("--row-sparse", "ADAPS_ROW_SPARSE", "update exchange: exact (the default: an embedding of "
     ">= 4096 rows sends its gradient's nonzero elements exactly and steps on their mean, as "
     "DDP) or off (AdaComp's update exchange like every tensor)",
     dict(choices=("exact", "off"))),
    ("--local-steps", "ADAPS_LOCAL_STEPS", "update exchange: exchange every H steps, each "
     "worker stepping on its own between (default 1; ADAPS_OUTER=nesterov for DiLoCo's outer "
     "step)", dict(type=int)),
)


def _find_bin(name, bin_dir):
    for d in (bin_dir, os.environ.get("ADAPS_BIN_DIR")):
        if d:
            for sub in ("", "scheduler", "server", "worker", "bin"):
                p = os.path.join(d, sub, name)
                if os.path.isfile(p) and os.access(p, os.X_OK):
                    return p
    p = shutil.which(name)
    if p:
        return p
    sys.exit("adaps.launch: %s not found (use --bin-dir, ADAPS_BIN_DIR or PATH)" % name)


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


def _start_scheduler(a, scheduler_bin, port_file, env, lock, procs, interrupted):
    """Starts the job's scheduler; its address, or None when it did not start."""
    argv = [scheduler_bin, "--num_servers=%d" % a.servers, "--num_workers=%d" % a.workers,
            "--port_file=" + port_file, "--log_level=" + a.log_level]
    if a.max_workers is not None:
        argv.append("--max_workers=%d" % a.max_workers)
    procs.append(_Proc("sched", argv, env, lock))
    end = time.time() + 15
    port = ""
    while not port and time.time() < end and procs[0].poll() is None and not interrupted:
        if os.path.exists(port_file):
            with open(port_file) as f:
                port = f.read().strip()
        time.sleep(0.02)
    if not port:
        sys.stderr.write("adaps.launch: the scheduler did not start\n")
        return None
    return "tcp://127.0.0.1:" + port


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m adaps.launch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--workers", type=int, required=True, help="training processes")
    ap.add_argument("--servers", type=int, default=None, help="server shards (default 1)")
    ap.add_argument("--colocate", action="store_true",
                    help="one server per worker, BytePS-style (deploy/launch.sh --colocate "
                         "places them on the workers' hosts; here every process is local)")
    ap.add_argument("--max-workers", type=int, default=None,
                    help="elastic: the scheduler's --max_workers (workers may join the "
                         "running job, with --join, while fewer than this many are live)")
    ap.add_argument("--join", default=None, metavar="ADDRESS",
                    help="start the workers into the running job whose scheduler is at "
                         "ADDRESS (tcp://host:port); starts no scheduler or server")
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
    ap.add_argument("--bin-dir", default=None, help="where adaps-scheduler/-server are")
    ap.add_argument("--log-level", default="warn", help="scheduler and server log level")
    ap.add_argument("--python", default=sys.executable, help="interpreter for the script")
    ap.add_argument("script")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    if a.colocate and a.servers is not None:
        ap.error("--colocate runs one server per worker: drop --servers")
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
    if a.server_optimizer is None:
        # Local mode: any torch optimizer, per-group settings, clipping and AMP work, and it
        # is at least as accurate and as small on the wire as server mode on the SGD models
        # too (docs/accuracy.md, the zoo); server mode refuses all but SGD and Adam.
        a.server_optimizer = "mean"
    if a.max_workers is not None and a.max_workers < a.workers:
        ap.error("--max-workers (%d) must be at least -n (%d)" % (a.max_workers, a.workers))
    if a.worker_restarts < 0:
        ap.error("--worker-restarts must be 0 or more")
    if a.servers is None:
        a.servers = 0 if a.join else a.workers if a.colocate else 1
    if a.workers < 1 or (a.servers < 1 and not a.join):
        ap.error("-n and --servers must be at least 1")

    scheduler_bin = None if a.join else _find_bin("adaps-scheduler", a.bin_dir)
    server_bin = None if a.join else _find_bin("adaps-server", a.bin_dir)
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
        else:
            address = _start_scheduler(a, scheduler_bin, port_file, env, lock, procs,
                                       interrupted)
            if address is None:
                return 1
            if a.max_workers is not None:
                sys.stderr.write("adaps.launch: scheduler at %s; up to %d workers (add some "
                                 "with: python3 -m adaps.launch --join %s -n K "
                                 "--server-optimizer %s SCRIPT)\n"
                                 % (address, a.max_workers, address, a.server_optimizer))
                sys.stderr.flush()
        if a.checkpoint_dir:
            os.makedirs(a.checkpoint_dir, exist_ok=True)
        server_argv = []
        for s in range(a.servers):
            argv_s = [server_bin, "--scheduler=" + address, "--identity=s%d" % s,
                      "--optimizer=" + a.server_optimizer, "--mode=" + a.mode,
                      "--log_level=" + a.log_level]
            if a.checkpoint_dir:
                argv_s += ["--checkpoint_dir=" + a.checkpoint_dir,
                           "--checkpoint_interval_s=%g" % a.checkpoint_interval]
            server_argv.append(argv_s + a.server_arg)
            procs.append(_Proc("s%d" % s, server_argv[s], env, lock))
        server_env = env  # (`env` is reused below)
        threads = str(max(1, (os.cpu_count() or 1) // a.workers))
        # A stable identity per worker when it may be restarted (it takes its rank back).
        job_tag = "launch%d-%x" % (os.getpid(), int(time.time() * 1000) & 0xffffff)
        workers, worker_argv = [], []
        for r in range(a.workers):
            wenv = dict(os.environ)
            wenv.update({"ADAPS_SCHEDULER": address,
                         "ADAPS_SERVER_OPTIMIZER": a.server_optimizer,
                         "ADAPS_LOCAL_RANK": str(r),
                         "ADAPS_NUM_WORKERS": str(a.workers),
                         "ADAPS_RANK_FILE": os.path.join(tmp, "rank%d" % r),
                         "PYTHONUNBUFFERED": "1"})
            if a.worker_restarts > 0:
                wenv.setdefault("ADAPS_IDENTITY", "%s-w%d" % (job_tag, r))
            for flag, env, _, _ in _TORCH_FLAGS:
                value = getattr(a, flag[2:].replace("-", "_"))
                if value is not None:
                    wenv[env] = str(value)
            wenv.setdefault("OMP_NUM_THREADS", threads)
            if sys.stdout.isatty():
                # adaps.progress draws its live line for a terminal; the pipe is not one.
                wenv.setdefault("ADAPS_PROGRESS", "tty")
            worker_argv.append(([a.python, a.script] + a.args, wenv))
            w = _Proc("w%d" % r, worker_argv[r][0], wenv, lock,
                      rank_file=wenv["ADAPS_RANK_FILE"])
            workers.append(w)
            procs.append(w)
        worker_restarts_left = a.worker_restarts
        infra = [] if a.join else procs[:1 + a.servers]
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
                # The scheduler and servers shut down once every worker left.
                end = time.time() + 10
                while time.time() < end and any(p.poll() is None for p in infra):
                    time.sleep(0.05)
                break
            # Exit 0 is the orderly shutdown once every worker left (a worker process may
            # still be exiting); anything else is a crash.
            dead = [p for p in infra if p.poll() not in (None, 0)]
            if dead and dead[0] is not infra[0] and restarts_left > 0:
                p = dead[0]
                i = infra.index(p) - 1
                restarts_left -= 1
                sys.stderr.write("adaps.launch: %s exited with %d; restarting it from its "
                                 "checkpoint (%d restart(s) left)\n"
                                 % (p.tag, p.poll(), restarts_left))
                p.join_output()
                fresh = _Proc("s%d" % i, server_argv[i], server_env, lock)
                infra[i + 1] = fresh
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
