"""A local adaps cluster (real adaps-scheduler and adaps-server on 127.0.0.1, OS ports) for
the Python tests. Executables: $ADAPS_SCHEDULER_BIN and $ADAPS_SERVER_BIN (ctest sets
them), else $ADAPS_BIN_DIR/{scheduler,server}/. Every process is killed at the end."""
import os
import subprocess
import sys
import tempfile
import time

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _bin(name, sub):
    env = "ADAPS_%s_BIN" % sub.upper()
    if os.environ.get(env):
        return os.environ[env]
    d = os.environ.get("ADAPS_BIN_DIR", os.path.join(REPO, "build"))
    return os.path.join(d, sub, name)


SCHEDULER_BIN = _bin("adaps-scheduler", "scheduler")
SERVER_BIN = _bin("adaps-server", "server")


class Cluster:
    def __init__(self, workers, servers=1, server_args=(), dead_timeout_ms=3000,
                 scheduler_args=()):
        self.dir = tempfile.mkdtemp(prefix="adaps-pytest-")
        self.procs = []
        port_file = os.path.join(self.dir, "port")
        self.scheduler = self._start("scheduler", [
            SCHEDULER_BIN, "--num_servers=%d" % servers, "--num_workers=%d" % workers,
            "--port_file=" + port_file, "--heartbeat_ms=100",
            "--dead_timeout_ms=%d" % dead_timeout_ms, "--log_level=warn"] +
            list(scheduler_args))
        end = time.time() + 10
        port = ""
        while not port and time.time() < end:
            if os.path.exists(port_file):
                port = open(port_file).read().strip()
            time.sleep(0.02)
        assert port, "scheduler did not write its port:\n" + self.log("scheduler")
        self.address = "tcp://127.0.0.1:" + port
        self.servers = [self._start("server%d" % s, [
            SERVER_BIN, "--scheduler=" + self.address, "--log_level=warn"] + list(server_args))
            for s in range(servers)]

    def _start(self, tag, argv):
        log = open(os.path.join(self.dir, tag + ".log"), "wb")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def log(self, tag):
        with open(os.path.join(self.dir, tag + ".log"), errors="replace") as f:
            return f.read()

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()


@pytest.fixture
def cluster():
    """cluster(workers, servers=1, server_args=(), scheduler_args=()) -> Cluster; all killed
    afterwards."""
    made = []

    def make(*args, **kwargs):
        c = Cluster(*args, **kwargs)
        made.append(c)
        return c
    yield make
    for c in made:
        c.stop()


def run_launch(args, timeout):
    """Runs `python3 -m adaps.launch args` and returns (exit code, output)."""
    env = dict(os.environ)
    env.setdefault("ADAPS_BIN_DIR", os.path.dirname(os.path.dirname(SCHEDULER_BIN)))
    cmd = [sys.executable, "-m", "adaps.launch",
           "--bin-dir", os.path.dirname(os.path.dirname(SCHEDULER_BIN))] + args
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                       timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace")


def launch_and_join(job_args, address_file, join_args, timeout):
    """Starts an elastic job, `python3 -m adaps.launch job_args`, whose rank 0 writes its
    scheduler's address to `address_file`; once it is there, `adaps.launch --join ADDRESS
    join_args`. Returns the address, the joiners' (exit code, output) and the job's, after
    the job ended (killed if it outlives `timeout`)."""
    env = dict(os.environ)
    bin_dir = os.path.dirname(os.path.dirname(SCHEDULER_BIN))
    env.setdefault("ADAPS_BIN_DIR", bin_dir)
    job = subprocess.Popen([sys.executable, "-m", "adaps.launch", "--bin-dir", bin_dir] + job_args,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        end = time.time() + 120
        while not os.path.exists(address_file) and time.time() < end and job.poll() is None:
            time.sleep(0.05)
        assert os.path.exists(address_file), job.communicate(timeout=60)[0].decode()
        with open(address_file) as f:
            address = f.read().strip()
        joiners = run_launch(["--join", address] + join_args, timeout=timeout)
        job_out = job.communicate(timeout=timeout)[0].decode("utf-8", "replace")
    finally:
        if job.poll() is None:
            job.kill()
    return address, joiners, (job.returncode, job_out)
