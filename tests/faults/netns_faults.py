#!/usr/bin/python3
"""Fault harness on network namespaces: partitions and several failures at once.

Every run builds hosts as network namespaces on a bridge (one host each for the scheduler,
2 servers and 3 workers, each with its own address), starts the real executables on them
(build/scheduler/adaps-scheduler, build/server/adaps-server --optimizer=sum, and 3 Python
workers, tests/faults/fault_worker.py, over the adaps module in build/python), and injects
a seeded schedule of 1-3 faults while the job trains:

  link-down    a host's link is down for T seconds (a partition of that host)
  drop-in      everything arriving at a host is dropped (iptables INPUT) for T seconds
  drop-out     everything a host sends is dropped (tc netem loss 100% on egress) for T s
  netem        tc netem loss / delay / reordering on a host's link for T seconds
  flap         a host's link goes down and up every 0.3-1 s for T seconds
  kill-server  kill -9 of a server, restarted (same flags, port, --identity and
               --checkpoint_dir, as deploy/launch.sh does) after a short pause
  kill-sched   kill -9 of the scheduler, restarted on the same port with the same --job_id
  kill-both    a server and the scheduler killed together, both restarted

Workload (exactly checkable): the servers sum pushes; at step j every worker pushes 1 at
elements j and STEPS + j of each of 4 tensors, so element j counts the pushes of step j
that were applied. Each worker records every step whose push_pull was acknowledged.

Invariants checked at the end of every run:
  ends        every process exited before the run's deadline (derived from a fault-free
              calibration run of the same workload on this machine, plus the faults' own
              durations and restart allowances): never a hang
  completes   every worker finished all its steps and every process exited 0 (the faults
              injected are all ones docs/reliability.md says adaps survives); otherwise the
              run's errors are printed
  exact       each element equals the number of acknowledged pushes of its step (no push
              applied twice or lost), except the steps a restarted server lost by
              design: from the step its log says it restored to the step in flight when it
              was killed, where 0 <= value <= acknowledged
  replicas    each worker's last pulled values equal the servers' parameters, and every
              worker sees the same parameters
  restored    every restarted server's log says it restored its slices from its checkpoint

Usage (as root, from the repository root; build/ must be built):

  /usr/bin/python3 tests/faults/netns_faults.py --short          # tests/run-all.sh: 3 seeds, ~70 s
  /usr/bin/python3 tests/faults/netns_faults.py --seed 17        # replay one seed
  /usr/bin/python3 tests/faults/netns_faults.py --runs 10 --seed 100   # seeds 100..109
  /usr/bin/python3 tests/faults/netns_faults.py --minutes 20     # a long run for a person
  options: --keep (keep every run's logs), --build DIR (default build), --steps N

Prints per run: seed, faults injected, outcome, invariants; at the end the totals.
Exit 0 only if every invariant of every run held; 1 otherwise; 77 (skipped) with a reason
when not root or namespaces cannot be made. Every namespace and process it made is removed
on exit, also on Ctrl-C or failure. Logs: /tmp/adaps-faults-<pid>/seed-<S>/ (removed
unless --keep or a run failed).
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER_PY = os.path.join(REPO, "tests", "faults", "fault_worker.py")
SCHED_PORT = 7000
SERVER_PORT = 7100
NUM_SERVERS = 2
NUM_WORKERS = 3
NUM_TENSORS = 4
FAULT_KINDS = ["link-down", "drop-in", "drop-out", "netem", "flap", "kill-server",
               "kill-sched", "kill-both"]
SHORT_SEEDS = [15, 32, 31]  # a partition (link down), netem loss+reordering, a server and the scheduler killed together


def sh(*args, check=False):
    r = subprocess.run(list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stdout.strip()}")
    return r


class Hosts:
    """Namespaces PREFIX-h<i> joined by veth pairs to a bridge in namespace PREFIX-sw."""

    def __init__(self, prefix, subnet, n):
        self.prefix, self.subnet, self.n = prefix, subnet, n
        self.made = []

    def ns(self, i):
        return f"{self.prefix}-h{i}"

    def addr(self, i):
        return f"{self.subnet}.{10 + i}"

    def up(self):
        sw = f"{self.prefix}-sw"
        sh("ip", "netns", "add", sw, check=True)
        self.made.append(sw)
        sh("ip", "-n", sw, "link", "set", "lo", "up", check=True)
        sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge", check=True)
        sh("ip", "-n", sw, "link", "set", "br0", "up", check=True)
        for i in range(self.n):
            h = self.ns(i)
            sh("ip", "netns", "add", h, check=True)
            self.made.append(h)
            sh("ip", "-n", h, "link", "set", "lo", "up", check=True)
            sh("ip", "-n", sw, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0",
               "netns", h, check=True)
            sh("ip", "-n", sw, "link", "set", f"p{i}", "master", "br0", "up", check=True)
            sh("ip", "-n", h, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0", check=True)
            sh("ip", "-n", h, "link", "set", "eth0", "up", check=True)

    def port_link(self, i, up):  # the host's cable: its port on the bridge
        sh("ip", "-n", f"{self.prefix}-sw", "link", "set", f"p{i}", "up" if up else "down")

    def down(self):
        for ns in reversed(self.made):
            r = sh("ip", "netns", "pids", ns)
            for pid in r.stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "del", ns)
        self.made = []


class Proc:
    """A process on a host; restart() runs the same command line again."""

    def __init__(self, name, hosts, host, argv, logdir, env=None):
        self.name, self.hosts, self.host, self.argv = name, hosts, host, argv
        self.logdir, self.env, self.p, self.incarnation = logdir, env, None, 0
        self.logs = []
        # Held by a kill fault from the kill to the restart: a second kill of the same
        # process waits for the first restart and kills the new incarnation.
        self.lock = threading.Lock()

    def start(self):
        log = os.path.join(self.logdir, f"{self.name}.{self.incarnation}.log")
        self.logs.append(log)
        f = open(log, "w")
        self.p = subprocess.Popen(["ip", "netns", "exec", self.hosts.ns(self.host)] + self.argv,
                                  stdout=f, stderr=subprocess.STDOUT, env=self.env,
                                  start_new_session=True)
        f.close()
        self.incarnation += 1

    def kill9(self):
        if self.p and self.p.poll() is None:
            try:
                os.kill(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.p.wait()

    def poll(self):
        return self.p.poll() if self.p else None


def read_events(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                if line.endswith("\n"):
                    out.append(json.loads(line))
    except FileNotFoundError:
        pass
    return out


def max_acked(run):
    m = -1
    for w in run["workers_out"]:
        for e in read_events(w):
            if e["event"] == "ack":
                m = max(m, e["step"])
    return m


def min_acked(run):
    m = None
    for w in run["workers_out"]:
        s = max([e["step"] for e in read_events(w) if e["event"] == "ack"], default=-1)
        m = s if m is None else min(m, s)
    return -1 if m is None else m


def make_schedule(seed):
    """1-3 faults: (kind, start offset s, duration s, target, parameters)."""
    rng = random.Random(seed)
    faults = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(FAULT_KINDS)
        start = round(rng.uniform(0.5, 6.0), 2)
        dur = round(rng.uniform(1.0, 6.0), 2)
        host = rng.randrange(NUM_SERVERS + NUM_WORKERS + 1)  # 0: scheduler, 1-2 servers, 3-5
        params = {}
        if kind == "netem":
            params = {"loss": rng.choice([0, 5, 20, 40]), "delay_ms": rng.choice([0, 20, 100, 300]),
                      "reorder": rng.choice([0, 25, 50])}
            if params["reorder"] and not params["delay_ms"]:
                params["delay_ms"] = 20  # netem reorders only delayed packets
            dur = round(rng.uniform(2.0, 8.0), 2)
        elif kind == "flap":
            params = {"period": round(rng.uniform(0.3, 1.0), 2)}
        elif kind in ("kill-server", "kill-both"):
            host = 1 + rng.randrange(NUM_SERVERS)
            dur = round(rng.uniform(0.2, 2.0), 2)  # until the restart
            params = {"sched_down": round(rng.uniform(0.2, 2.0), 2)} if kind == "kill-both" else {}
        elif kind == "kill-sched":
            host = 0
            dur = round(rng.uniform(0.2, 3.0), 2)
        faults.append({"kind": kind, "start": start, "dur": dur, "host": host, "params": params})
    return sorted(faults, key=lambda f: f["start"])


def describe(f):
    who = {0: "scheduler"}.get(f["host"], f"server s{f['host'] - 1}" if f["host"] <= NUM_SERVERS
                               else f"worker w{f['host'] - NUM_SERVERS - 1}")
    p = "".join(f" {k}={v}" for k, v in f["params"].items())
    return f"{f['kind']}({who} host, at +{f['start']}s, {f['dur']}s{p})"


class Run:
    def __init__(self, args, seed, logdir, calib_s):
        self.args, self.seed, self.logdir, self.calib_s = args, seed, logdir, calib_s
        self.faults = make_schedule(seed) if seed is not None else []
        self.events = []  # what was injected, with the step it was injected at
        self.restarts = {}  # server index -> [(acked step at the kill)]
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.harness_errors = []

    def log(self, msg):
        with self.lock:
            self.events.append(msg)

    # -- faults ----------------------------------------------------------------------------
    def inject(self, f, t_ready):
        try:
            self.inject_one(f, t_ready)
        except Exception as e:  # a fault that could not be injected fails the run
            with self.lock:
                self.harness_errors.append(f"{describe(f)}: could not inject: {e}")
            if f["kind"] == "netem":
                try:
                    self.degrade(f, False)  # what was applied of it
                except Exception:
                    pass

    def inject_one(self, f, t_ready):
        hosts, ns = self.hosts, self.hosts.ns(f["host"])
        delay = t_ready + f["start"] - time.time()
        if delay > 0 and self.stop.wait(delay):
            return
        if self.all_workers_exited():
            self.log(f"{describe(f)}: not injected, the workers had finished")
            return
        step = max_acked(self.state)
        kind, dur = f["kind"], f["dur"]
        if kind == "link-down":
            hosts.port_link(f["host"], False)
            self.stop.wait(dur)
            hosts.port_link(f["host"], True)
        elif kind == "drop-in":
            rule = ["INPUT", "-i", "eth0", "-j", "DROP"]
            sh("ip", "netns", "exec", ns, "iptables", "-I", *rule, check=True)
            self.stop.wait(dur)
            sh("ip", "netns", "exec", ns, "iptables", "-D", *rule)
        elif kind == "drop-out":
            # What the host sends is dropped by every other host as it arrives: the sender
            # sees nothing (no local error), as with a one-way break in the network.
            rule = ["INPUT", "-s", hosts.addr(f["host"]), "-j", "DROP"]
            others = [i for i in range(hosts.n) if i != f["host"]]
            for i in others:
                sh("ip", "netns", "exec", hosts.ns(i), "iptables", "-I", *rule, check=True)
            self.stop.wait(dur)
            for i in others:
                sh("ip", "netns", "exec", hosts.ns(i), "iptables", "-D", *rule)
        elif kind == "netem":
            applied = self.degrade(f, True)
            self.log(f"{describe(f)}: applied {applied}")
            self.stop.wait(dur)
            self.degrade(f, False)
        elif kind == "flap":
            end = time.time() + dur
            while time.time() < end and not self.stop.is_set():
                hosts.port_link(f["host"], False)
                self.stop.wait(f["params"]["period"] / 2)
                hosts.port_link(f["host"], True)
                self.stop.wait(f["params"]["period"] / 2)
            hosts.port_link(f["host"], True)
        elif kind in ("kill-server", "kill-sched", "kill-both"):
            procs = []
            if kind != "kill-sched":
                procs.append((self.servers[f["host"] - 1], dur))
            if kind != "kill-server":
                procs.insert(0, (self.sched, dur if kind == "kill-sched" else f["params"]["sched_down"]))
            for p, _ in procs:  # scheduler first, then the server: one order, no deadlock
                p.lock.acquire()
            if self.all_workers_exited() or any(p.poll() is not None for p, _ in procs):
                for p, _ in procs:  # the job ended meanwhile: a restart would outlive it
                    p.lock.release()
                self.log(f"{describe(f)}: not injected, the job had ended")
                return
            for p, _ in procs:  # together
                p.kill9()
            if kind != "kill-sched":
                with self.lock:
                    self.restarts.setdefault(f["host"] - 1, []).append(max_acked(self.state))
            t_kill = time.time()
            for p, down in sorted(procs, key=lambda x: x[1]):
                wait = t_kill + down - time.time()
                if wait > 0:
                    time.sleep(wait)  # restart even when the run is being stopped: logs
                p.start()
                p.lock.release()
        self.log(f"{describe(f)} injected at step {step}")

    def degrade(self, f, on):
        """netem loss/delay/reordering on both directions of the host's link. Without
        sch_netem (some kernels): loss by iptables' statistic match on both directions and
        delay as the queueing delay of a slow token bucket (tc tbf); no reordering."""
        hosts, ns, p, i = self.hosts, self.hosts.ns(f["host"]), f["params"], f["host"]
        sw = f"{hosts.prefix}-sw"
        if HAVE_NETEM:
            spec = []
            if p["delay_ms"]:
                spec += ["delay", f"{p['delay_ms']}ms", f"{p['delay_ms'] // 2}ms"]
            if p["loss"]:
                spec += ["loss", f"{p['loss']}%"]
            if p["reorder"]:
                spec += ["reorder", f"{p['reorder']}%", "50%"]
            spec = spec or ["delay", "10ms"]
            if on:
                sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root",
                   "netem", *spec, check=True)
                sh("ip", "netns", "exec", sw, "tc", "qdisc", "add", "dev", f"p{i}", "root", "netem", *spec,
                   check=True)
            else:
                sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root")
                sh("ip", "netns", "exec", sw, "tc", "qdisc", "del", "dev", f"p{i}", "root")
            return "netem " + " ".join(spec)
        done = []
        if p["loss"]:
            prob = f"{p['loss'] / 100:.2f}"
            for chain in (["INPUT", "-i", "eth0"], ["OUTPUT", "-o", "eth0"]):
                rule = chain + ["-m", "statistic", "--mode", "random", "--probability", prob,
                                "-j", "DROP"]
                sh("ip", "netns", "exec", ns, "iptables", "-I" if on else "-D", *rule, check=on)
            done.append(f"loss {p['loss']}% each way (iptables statistic)")
        if p["delay_ms"]:
            # A step moves about 10 KB each way per worker: this rate queues it for roughly
            # the delay asked for.
            rate = f"{max(64, int(80000 / p['delay_ms']))}kbit"
            if on:
                tbf = ["tbf", "rate", rate, "burst", "4kb", "latency", "2s"]
                sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", *tbf,
                   check=True)
                sh("ip", "netns", "exec", sw, "tc", "qdisc", "add", "dev", f"p{i}", "root", *tbf, check=True)
            else:
                sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root")
                sh("ip", "netns", "exec", sw, "tc", "qdisc", "del", "dev", f"p{i}", "root")
            done.append(f"rate {rate} each way (tbf: queueing delay)")
        if p["reorder"]:
            done.append("no reordering (no sch_netem in this kernel)")
        return ", ".join(done) or "nothing (no loss or delay drawn)"

    def all_workers_exited(self):
        return all(w.poll() is not None for w in self.workers)

    # -- the run ---------------------------------------------------------------------------
    def execute(self, prefix, subnet):
        a = self.args
        os.makedirs(self.logdir, exist_ok=True)
        self.hosts = Hosts(prefix, subnet, 1 + NUM_SERVERS + NUM_WORKERS)
        self.hosts.up()
        sched_addr = f"tcp://{self.hosts.addr(0)}:{SCHED_PORT}"
        job = f"faults-{self.seed}"
        self.sched = Proc("scheduler", self.hosts, 0, [
            a.bin_sched, f"--host={self.hosts.addr(0)}", f"--port={SCHED_PORT}",
            f"--num_servers={NUM_SERVERS}", f"--num_workers={NUM_WORKERS}",
            f"--job_id={job}", f"--dead_timeout_ms={a.dead_timeout_s * 1000}",
            "--log_level=info"], self.logdir)
        self.servers = []
        for s in range(NUM_SERVERS):
            ck = os.path.join(self.logdir, f"ckpt-s{s}")
            os.makedirs(ck, exist_ok=True)
            self.servers.append(Proc(f"server{s}", self.hosts, 1 + s, [
                a.bin_server, f"--scheduler={sched_addr}", f"--host={self.hosts.addr(1 + s)}",
                f"--port={SERVER_PORT}", "--optimizer=sum", f"--identity=s{s}",
                f"--checkpoint_dir={ck}", "--checkpoint_interval_s=0.5",
                f"--register_timeout_ms={a.register_timeout_s * 1000}",
                f"--scheduler_grace_s={a.grace_s}", "--log_level=info"], self.logdir))
        env = dict(os.environ, PYTHONPATH=os.path.join(a.build, "python"))
        self.workers, outs = [], []
        for w in range(NUM_WORKERS):
            out = os.path.join(self.logdir, f"worker{w}.jsonl")
            outs.append(out)
            self.workers.append(Proc(f"worker{w}", self.hosts, 1 + NUM_SERVERS + w, [
                sys.executable, WORKER_PY, f"--scheduler={sched_addr}", f"--identity=w{w}",
                f"--steps={a.steps}", f"--tensors={NUM_TENSORS}", f"--step_sleep={a.step_sleep}",
                f"--request_timeout={a.request_timeout_s}",
                f"--register_timeout={a.register_timeout_s}", f"--out={out}"],
                self.logdir, env=env))
        self.state = {"workers_out": outs}
        t0 = time.time()
        for p in [self.sched] + self.servers + self.workers:
            p.start()
        # Ready: every worker acknowledged a step (registration, declarations done).
        ready_deadline = t0 + self.ready_deadline_s()
        while min_acked(self.state) < 0:
            if time.time() > ready_deadline or self.all_workers_exited():
                break
            time.sleep(0.1)
        t_ready = time.time()
        threads = [threading.Thread(target=self.inject, args=(f, t_ready), daemon=True)
                   for f in self.faults]
        for t in threads:
            t.start()
        deadline = t_ready + self.run_deadline_s()
        hung = False
        while not self.all_workers_exited():
            if time.time() > deadline:
                hung = True
                break
            time.sleep(0.2)
        # The servers and the scheduler end once every worker left (or lost theirs).
        end_deadline = time.time() + self.end_deadline_s()
        while any(p.poll() is None for p in [self.sched] + self.servers):
            if hung or time.time() > end_deadline:
                hung = True
                break
            time.sleep(0.2)
        self.stop.set()
        for t in threads:
            t.join(timeout=30)
        self.elapsed = time.time() - t0
        self.hung = hung
        for p in self.workers + self.servers + [self.sched]:
            p.kill9()

    def ready_deadline_s(self):
        return self.args.register_timeout_s + 30 + (0 if self.calib_s is None else 5 * self.calib_s)

    def run_deadline_s(self):
        base = 600 if self.calib_s is None else 5 * self.calib_s + 60
        extra = 0
        for f in self.faults:
            extra += f["start"] + f["dur"]
            if f["kind"].startswith("kill"):
                extra += self.args.request_timeout_s + self.args.register_timeout_s
            else:
                extra += self.args.request_timeout_s
        return base + extra

    def end_deadline_s(self):
        # A server that lost the scheduler waits --scheduler_grace_s for it.
        return max(self.args.grace_s, self.args.register_timeout_s) + 30

    # -- invariants ------------------------------------------------------------------------
    def rank_of(self, s):
        """The scheduler's rank of server process s (--identity=s<s>): the layout's index."""
        m = re.search(r"registered as server (\d+)", open(self.servers[s].logs[0]).read())
        return int(m.group(1)) if m else None

    def check(self):
        a, inv, notes = self.args, {}, []
        n = a.steps
        inv["injected"] = not self.harness_errors
        notes += self.harness_errors
        inv["ends"] = not self.hung
        if self.hung:
            notes.append("a process was still running at the deadline (a hang)")
        wouts = [read_events(p) for p in self.state["workers_out"]]
        acked = [0] * n
        unacked = [0] * n  # a failed worker's step in flight: applied or not
        for ev in wouts:
            for e in ev:
                if e["event"] == "ack":
                    acked[e["step"]] += 1
                if e["event"] == "error" and 0 <= e["step"] < n:
                    unacked[e["step"]] += 1
        done = all(any(e["event"] == "done" for e in ev) for ev in wouts)
        codes = {p.name: p.poll() for p in [self.sched] + self.servers + self.workers}
        completes = done and not self.hung and all(c == 0 for c in codes.values())
        inv["completes"] = completes
        if not completes:
            bad = {k: c for k, c in codes.items() if c != 0}
            notes.append(f"exit codes {bad}" if bad else "not every worker finished")
            for ev in wouts:
                for e in ev:
                    if e["event"] == "error":
                        notes.append(f"worker error: {e['code']}: {e['message'][:300]}")
            for p in [self.sched] + self.servers:
                if codes[p.name] not in (0, None):
                    notes.append(f"{p.name}: {last_error(p.logs[-1])}")
        # Restores: every restarted server's new incarnations restored their slices.
        restored = {}  # server -> [(version restored per tensor)]
        ok_restore = True
        for s, kills in self.restarts.items():
            for k in range(1, len(self.servers[s].logs)):
                text = open(self.servers[s].logs[k]).read()
                vers = {m.group(1): int(m.group(2))
                        for m in re.finditer(r"slice '([^']+)' restored at step (\d+)", text)}
                if "registered as server" not in text and not vers:
                    # Killed again before it reached the scheduler (down too, or the link):
                    # a server learns its rank, and so its checkpoint, by registering.
                    notes.append(f"server{s} incarnation {k} was killed before it registered")
                    continue
                if not re.search(r"restored \d+ slices from", text) or not vers:
                    ok_restore = False
                    notes.append(f"server{s} incarnation {k} did not restore a checkpoint: "
                                 f"{last_error(self.servers[s].logs[k])}")
                restored.setdefault(self.rank_of(s), []).append((vers, kills[k - 1] if k - 1 < len(kills) else n))
        inv["restored"] = ok_restore
        # Exact counts.
        layout = None
        params = None
        for ev in wouts:
            for e in ev:
                if e["event"] == "declared" and layout is None:
                    layout = e["owners"]
                if e["event"] == "params" and params is None:
                    params = e["values"]
        exact = True
        if params is None:
            notes.append("no worker read the servers' parameters (exact counts not checked)")
            exact = completes  # nothing to compare only when the run failed anyway
        else:
            for t in range(NUM_TENSORS):
                server = owner(layout, t)
                windows = []
                for vers, at_kill in restored.get(server, []):
                    v = vers.get(f"t{t}")
                    if v is not None:
                        windows.append((v, at_kill + 2))
                for e in range(2 * n):
                    j = e % n
                    got = params[t * 2 * n + e]
                    if acked[j] <= got <= acked[j] + unacked[j] and got == int(got):
                        continue
                    if any(lo <= j <= hi for lo, hi in windows) and 0 <= got <= acked[j]:
                        continue
                    exact = False
                    notes.append(f"tensor t{t} (server rank {server}) step {j}: value {got}, "
                                 f"{acked[j]} pushes acknowledged, restore windows {windows}")
                    break
        inv["exact"] = exact
        # Replicas.
        rep_ok = True
        finals = []
        for w, ev in enumerate(wouts):
            r = [e["values"] for e in ev if e["event"] == "replica"]
            p = [e["values"] for e in ev if e["event"] == "params"]
            if r and p:
                if r[0] != p[0]:
                    rep_ok = False
                    notes.append(f"worker {w}: last pulled values differ from the servers' "
                                 f"parameters at {sum(x != y for x, y in zip(r[0], p[0]))} elements")
                finals.append(p[0])
        if any(f != finals[0] for f in finals[1:]):
            rep_ok = False
            notes.append("workers read different server parameters")
        inv["replicas"] = rep_ok
        return inv, notes


def owner(layout, t):
    return layout.get(f"t{t}") if isinstance(layout, dict) else None


def last_error(path):
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return "(no log)"
    errs = [l for l in lines if "[error]" in l or "[critical]" in l]
    return (errs[-1] if errs else (lines[-1] if lines else "(empty log)"))[:300]


def have_netem():
    probe = f"adapsnetem{os.getpid()}"
    if sh("ip", "netns", "add", probe).returncode != 0:
        return False
    try:
        sh("ip", "-n", probe, "link", "add", "a0", "type", "veth", "peer", "name", "a1")
        sh("ip", "-n", probe, "link", "set", "a0", "up")
        return sh("ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "a0", "root",
                  "netem", "delay", "1ms").returncode == 0
    finally:
        sh("ip", "netns", "del", probe)


HAVE_NETEM = None


def skip_reason():
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if not shutil.which("ip") or not shutil.which("tc") or not shutil.which("iptables"):
        return "iproute2 (ip, tc) and iptables are needed"
    probe = f"adapsprobe{os.getpid()}"
    if sh("ip", "netns", "add", probe).returncode != 0:
        return "cannot create network namespaces here"
    ok = sh("ip", "-n", probe, "link", "add", "br0", "type", "bridge").returncode == 0
    ok = ok and sh("ip", "netns", "exec", probe, "iptables", "-L", "-n").returncode == 0
    sh("ip", "netns", "del", probe)
    return None if ok else "cannot create a bridge or use iptables inside a namespace here"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--minutes", type=float, default=None)
    ap.add_argument("--short", action="store_true")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--step_sleep", type=float, default=0.05)
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    a.bin_sched = os.path.join(a.build, "scheduler", "adaps-scheduler")
    a.bin_server = os.path.join(a.build, "server", "adaps-server")
    # Timeouts of adaps itself: partitions last at most 8 s; nodes are declared dead after
    # 30 s (the default) and requests time out after 30 s, both far beyond any fault here.
    # A restarted node re-registers within a heartbeat (1 s) and a killed one is back within
    # 3 s, so a minute of registration or of grace without the scheduler is only reached by
    # a failure; the end of such a run is bounded by these.
    a.dead_timeout_s, a.request_timeout_s = 30, 30
    a.register_timeout_s, a.grace_s = 60, 30
    why = skip_reason()
    if why:
        print(f"SKIPPED: {why}")
        return 77
    global HAVE_NETEM
    HAVE_NETEM = have_netem()
    if not HAVE_NETEM:
        print("note: no sch_netem in this kernel: the netem fault uses iptables (loss) and "
              "tc tbf (delay), without reordering")
    for b in (a.bin_sched, a.bin_server, os.path.join(a.build, "python", "adaps")):
        if not os.path.exists(b):
            print(f"SKIPPED: {b} is not built")
            return 77

    root = f"/tmp/adaps-faults-{os.getpid()}"
    os.makedirs(root, exist_ok=True)
    prefix = f"af{os.getpid() % 100000}"
    subnet = f"10.{214 + os.getpid() % 30}.{os.getpid() % 250}"
    live = {"run": None}

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGINT, on_signal)  # also when started with SIGINT ignored (&)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    if a.short:
        seeds = list(SHORT_SEEDS)
    elif a.minutes is not None:
        seeds = None
    else:
        start = a.seed if a.seed is not None else random.SystemRandom().randrange(1, 10**6)
        seeds = list(range(start, start + a.runs))

    totals = {"runs": 0, "faults": 0, "held": 0, "failed": 0}
    failed_seeds = []
    t_begin = time.time()
    try:
        # Calibration: the same workload without faults; its time sets every deadline.
        print(f"calibration: a run without faults ({a.steps} steps, {NUM_WORKERS} workers, "
              f"{NUM_SERVERS} sum servers), load {os.getloadavg()[0]:.1f}", flush=True)
        cal = Run(a, None, os.path.join(root, "calibration"), None)
        live["run"] = cal
        try:
            cal.execute(prefix, subnet)
        finally:
            cal.hosts.down()
        inv, notes = cal.check()
        calib_s = cal.elapsed
        print(f"calibration: {calib_s:.1f}s, invariants {fmt(inv)}", flush=True)
        if not all(inv.values()):
            for n in notes:
                print(f"  {n}")
            print("FAILED: the fault-free run failed; logs in", root)
            return 1
        i = 0
        next_seed = random.SystemRandom().randrange(1, 10**6) if a.seed is None else a.seed
        while True:
            if seeds is not None:
                if i >= len(seeds):
                    break
                seed = seeds[i]
            else:
                if time.time() - t_begin > a.minutes * 60:
                    break
                seed = next_seed + i
            i += 1
            run = Run(a, seed, os.path.join(root, f"seed-{seed}"), calib_s)
            live["run"] = run
            load = os.getloadavg()[0]
            try:
                run.execute(prefix, subnet)
            finally:
                run.hosts.down()
            inv, notes = run.check()
            ok = all(inv.values())
            totals["runs"] += 1
            totals["faults"] += len(run.faults)
            totals["held"] += sum(inv.values())
            totals["failed"] += len(inv) - sum(inv.values())
            outcome = "completed" if inv["completes"] else ("HUNG" if not inv["ends"] else "stopped")
            print(f"seed {seed}: load {load:.1f}, {run.elapsed:.0f}s, {outcome}; invariants {fmt(inv)}",
                  flush=True)
            for e in run.events:
                print(f"  fault: {e}")
            for n in notes:
                print(f"  ! {n}")
            if not ok:
                failed_seeds.append(seed)
            elif not a.keep:
                shutil.rmtree(run.logdir, ignore_errors=True)
    except KeyboardInterrupt as e:
        print(f"interrupted ({e}); cleaning up", flush=True)
        r = live["run"]
        if r is not None and hasattr(r, "hosts"):
            r.stop.set()
            for p in getattr(r, "workers", []) + getattr(r, "servers", []) + (
                    [r.sched] if hasattr(r, "sched") else []):
                p.kill9()
            r.hosts.down()
        print(f"logs: {root}")
        return 130
    finally:
        r = live["run"]
        if r is not None and hasattr(r, "hosts"):
            r.hosts.down()
    print(f"runs {totals['runs']}, faults {totals['faults']}, invariants held {totals['held']}, "
          f"failed {totals['failed']}" + (f"; failed seeds {failed_seeds}" if failed_seeds else ""))
    if failed_seeds or a.keep:
        print(f"logs: {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if not failed_seeds else 1


def fmt(inv):
    return " ".join(f"{k}={'held' if v else 'FAILED'}" for k, v in inv.items())


if __name__ == "__main__":
    sys.exit(main())
