"""The real adaps-scheduler serves its metrics over HTTP (--metrics_port=0), and the values
follow what happens to the cluster: nodes registered by real adaps-server and adaps-worker
processes, a server killed (declared dead), and garbage sent by a raw ZeroMQ client
(rejected as malformed).

Run by ctest (tests/scheduler/CMakeLists.txt) with the executables in ADAPS_*_BIN."""
import os
import re
import signal
import subprocess
import tempfile
import time
import urllib.request

import pytest
import zmq

SCHEDULER = os.environ.get("ADAPS_SCHEDULER_BIN", "build/scheduler/adaps-scheduler")
SERVER = os.environ.get("ADAPS_SERVER_BIN", "build/server/adaps-server")
WORKER = os.environ.get("ADAPS_WORKER_BIN", "build/worker/adaps-worker")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


def scrape(port):
    """{(name, frozenset(labels)): value} of http://127.0.0.1:port/metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert r.status == 200
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m or line.startswith("#"):
            continue
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def value(samples, name, **labels):
    want = {("role", "scheduler"), ("rank", "0")} | set(labels.items())
    hits = [v for (n, ls), v in samples.items() if n == name and ls == want]
    assert len(hits) == 1, f"{name}{labels}: {len(hits)} series"
    return hits[0]


def wait_for(port, name, expected, timeout=20, **labels):
    deadline = time.time() + timeout
    got = None
    while time.time() < deadline:
        samples = scrape(port)
        got = value(samples, name, **labels)
        if got == expected:
            return samples
        time.sleep(0.1)
    pytest.fail(f"{name}{labels} = {got}, want {expected}")


def read_port(path, proc, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                return int(f.read())
        assert proc.poll() is None, "process exited early"
        time.sleep(0.05)
    pytest.fail(f"no port file {path}")


@pytest.fixture
def procs():
    started = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_scheduler_metrics_follow_the_cluster(procs, tmp_path):
    sched = subprocess.Popen(
        [SCHEDULER, "--num_servers=2", "--num_workers=1", "--heartbeat_ms=100",
         "--dead_timeout_ms=1000", "--metrics_port=0", "--metrics_host=127.0.0.1",
         f"--metrics_port_file={tmp_path}/metrics", f"--port_file={tmp_path}/port",
         "--log_level=warn"])
    procs.append(sched)
    mport = read_port(tmp_path / "metrics", sched)
    port = read_port(tmp_path / "port", sched)
    s = scrape(mport)
    assert value(s, "adaps_nodes_expected", node_role="server") == 2
    assert value(s, "adaps_nodes_expected", node_role="worker") == 1
    assert value(s, "adaps_cluster_formed") == 0
    assert value(s, "adaps_nodes", node_role="server", state="live") == 0

    sched_addr = f"tcp://127.0.0.1:{port}"
    # With identities the servers are restartable: the worker waits for a killed one to come
    # back (up to its request timeout) instead of failing at once, which would end the job
    # (every worker gone) and take the metrics endpoint down before the checks below.
    servers = [subprocess.Popen([SERVER, f"--scheduler={sched_addr}", "--log_level=warn",
                                 f"--identity=metrics-test-server-{i}"])
               for i in range(2)]
    procs.extend(servers)
    wait_for(mport, "adaps_nodes", 2, node_role="server", state="live")
    assert value(scrape(mport), "adaps_registrations_total", node_role="server") == 2

    # A raw client's garbage: one frame that is no Envelope, and a three-frame message.
    ctx = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(sched_addr)
    raw.send(b"not a flatbuffer")
    raw.send_multipart([b"a", b"b", b"c"])
    wait_for(mport, "adaps_rejected_messages_total", 2, reason="malformed")
    raw.close()
    ctx.term()

    worker = subprocess.Popen([WORKER, f"--scheduler={sched_addr}", "--mode=synthetic",
                               "--tensors=20K", "--layers=2", "--steps=100000", "--warmup=0",
                               "--log_level=warn"])
    procs.append(worker)
    wait_for(mport, "adaps_cluster_formed", 1)
    s = scrape(mport)
    assert value(s, "adaps_nodes", node_role="worker", state="live") == 1
    assert value(s, "adaps_views_sent_total") >= 3  # one per node when the cluster formed
    assert value(s, "adaps_cluster_epoch") >= 1
    assert value(s, "adaps_transport_messages_total", direction="in") > 0

    servers[1].send_signal(signal.SIGKILL)
    s = wait_for(mport, "adaps_nodes", 1, node_role="server", state="dead")
    assert value(s, "adaps_nodes", node_role="server", state="live") == 1
    assert worker.poll() is None, "the worker must wait for the killed server, not exit"
    assert value(scrape(mport), "adaps_nodes", node_role="server", state="live") == 1


def test_scheduler_refuses_a_metrics_port_in_use(procs, tmp_path):
    first = subprocess.Popen([SCHEDULER, "--metrics_port=0", "--metrics_host=127.0.0.1",
                              f"--metrics_port_file={tmp_path}/metrics", "--log_level=warn"])
    procs.append(first)
    mport = read_port(tmp_path / "metrics", first)
    second = subprocess.run([SCHEDULER, f"--metrics_port={mport}", "--metrics_host=127.0.0.1"],
                            capture_output=True, text=True, timeout=30)
    assert second.returncode == 1
    assert "UNAVAILABLE" in second.stderr and str(mport) in second.stderr, second.stderr
