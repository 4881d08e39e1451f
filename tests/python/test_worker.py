"""The adaps Python module over a real local cluster: buffers, results, errors."""
import os
import signal
import subprocess
import threading
import time

import numpy as np
import pytest
import torch

import adaps


def test_pushes_numpy_and_torch_buffers_and_writes_out_in_place(cluster):
    c = cluster(1, server_args=["--optimizer=sgd", "--learning_rate=1"])
    w = adaps.Worker(c.address, request_timeout=10)
    assert (w.rank, w.num_workers, w.num_servers) == (0, 1, 1)
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    w.declare("x", values, bin_size=50, compression="dense")
    grad = torch.ones(2, 3)
    out = torch.zeros(2, 3)
    ptr = out.data_ptr()
    w.push_pull("x", grad, out).wait()
    assert out.data_ptr() == ptr
    assert torch.equal(out, torch.arange(6, dtype=torch.float32).view(2, 3) - 1)
    # A non-contiguous float64 gradient is converted; the out array is written in place.
    w.push_pull("x", np.ones((3, 2)).T, values).wait()
    np.testing.assert_array_equal(values, np.arange(6).reshape(2, 3) - 2)
    t = w.traffic("x")
    assert t["pushes"] == 2 and t["push_dense_bytes"] == 2 * 6 * 4
    w.stop()


def test_wrong_shape_is_an_exception_with_the_status_message(cluster):
    c = cluster(1)
    w = adaps.Worker(c.address, request_timeout=10)
    w.declare("x", np.zeros(6, np.float32))
    with pytest.raises(adaps.Error) as e:
        w.push_pull("x", np.ones(5, np.float32), np.zeros(6, np.float32)).wait()
    assert e.value.code == adaps.INVALID_ARGUMENT
    assert e.value.code_name == "INVALID_ARGUMENT"
    assert "6 elements" in str(e.value)
    with pytest.raises(adaps.Error) as e:
        w.push_pull("nope", np.ones(6, np.float32), np.zeros(6, np.float32)).wait()
    assert "not declared" in str(e.value)
    with pytest.raises(adaps.Error, match="float32"):
        w.pull("x", np.zeros(6))  # float64 out cannot be written in place
    with pytest.raises(adaps.Error) as e:
        w.declare("x", np.zeros(7, np.float32))  # conflicts with the first declaration
    assert e.value.code == adaps.INVALID_ARGUMENT
    w.stop()
    with pytest.raises(adaps.Error) as e:
        w.push("x", np.zeros(6, np.float32))
    assert e.value.code == adaps.FAILED_PRECONDITION


def test_unreachable_scheduler_is_an_exception_not_a_hang():
    start = time.time()
    with pytest.raises(adaps.Error) as e:
        adaps.Worker("tcp://127.0.0.1:1", register_timeout=0.5, request_timeout=0.5)
    assert e.value.code in (adaps.UNAVAILABLE, adaps.DEADLINE_EXCEEDED)
    assert str(e.value)
    assert time.time() - start < 10


def test_killed_server_is_an_exception_from_wait(cluster):
    c = cluster(1)
    w = adaps.Worker(c.address, request_timeout=2)
    w.declare("x", np.zeros(100, np.float32), compression="adacomp", bin_size=10)
    w.push_pull("x", np.ones(100, np.float32), np.zeros(100, np.float32)).wait()
    c.servers[0].kill()
    c.servers[0].wait()
    with pytest.raises(adaps.Error) as e:
        w.push_pull("x", np.ones(100, np.float32), np.zeros(100, np.float32)).wait()
    assert e.value.code in (adaps.UNAVAILABLE, adaps.DEADLINE_EXCEEDED), e.value
    assert str(e.value)


def test_non_float32_values_are_rejected_with_a_reason(cluster):
    c = cluster(1)
    w = adaps.Worker(c.address, request_timeout=10)
    with pytest.raises(adaps.Error, match="float32"):
        w.declare("i", np.zeros(4, np.int32))
    with pytest.raises(adaps.Error, match="expected a float32"):
        w.declare("l", [0.0, 1.0])
    w.stop()


def test_compression_threads_reach_the_worker_and_traffic_has_the_phase_times(cluster):
    with pytest.raises(adaps.Error) as e:
        adaps.Worker("tcp://127.0.0.1:1", register_timeout=0.5, compression_threads=-1)
    assert e.value.code == adaps.INVALID_ARGUMENT and "compression_threads" in str(e.value)
    for threads in (0, 2):  # the old path (caller and I/O thread) and a pool of two
        c = cluster(1, server_args=["--optimizer=sgd", "--learning_rate=1"])
        w = adaps.Worker(c.address, request_timeout=10, compression_threads=threads)
        values = np.zeros(1 << 20, np.float32)
        w.declare("big%d" % threads, values, compression="adacomp", bin_size=50,
                  pull="recompressed")
        for _ in range(3):
            w.push_pull("big%d" % threads, np.ones_like(values), values).wait()
        np.testing.assert_array_equal(values, np.full_like(values, -3.0))
        t = w.traffic("big%d" % threads)
        assert t["compress_seconds"] > 0 and t["decode_seconds"] > 0
        assert t["server_seconds"] > 0
        w.stop()


def test_set_bin_size(cluster):
    c = cluster(1, server_args=["--optimizer=sgd"])
    w = adaps.Worker(c.address, request_timeout=10)
    values = np.zeros(100, np.float32)
    w.declare("x", values, compression="adacomp", bin_size=5, fuse=False)
    w.declare("fused", np.zeros(10, np.float32), compression="adacomp", bin_size=5)
    w.declare("d", np.zeros(10, np.float32), compression="dense", fuse=False)
    grad = np.full(100, 0.01, np.float32)
    grad[3::10] = 5.0  # one dominant element in every 10
    w.set_bin_size("x", 10)
    w.push_pull("x", grad, values).wait()
    np.testing.assert_array_equal(w.last_sent("x"), np.arange(3, 100, 10))
    w.set_bin_size("x", 5)  # bins of 5 without a dominant element send their ties too
    w.push_pull("x", grad, values).wait()
    assert w.last_sent("x").size > 10
    w.set_bin_size("fused", 10)  # a fused tensor's too: its bucket's pushes carry it
    for name, bad, code in [("x", 0, adaps.INVALID_ARGUMENT), ("nope", 10, adaps.INVALID_ARGUMENT),
                            ("d", 10, adaps.INVALID_ARGUMENT)]:
        with pytest.raises(adaps.Error) as e:
            w.set_bin_size(name, bad)
        assert e.value.code == code, (name, e.value)
    w.stop()


def test_last_sent_and_pull_parameters(cluster):
    c = cluster(1, server_args=["--optimizer=sgd", "--learning_rate=1"])
    w = adaps.Worker(c.address, request_timeout=10)
    values = np.zeros(100, np.float32)
    w.declare("x", values, compression="adacomp", bin_size=10, pull="recompressed")
    assert w.last_sent("x").size == 0
    grad = np.full(100, 0.01, np.float32)
    grad[3::10] = 5.0  # one dominant element a bin: AdaComp sends exactly those
    w.push_pull("x", grad, values).wait()
    sent = w.last_sent("x")
    assert sent.dtype == np.int64
    np.testing.assert_array_equal(sent, np.arange(3, 100, 10))
    exact = np.zeros(100, np.float32)
    w.pull_parameters("x", exact)
    # The servers' SGD stepped by what they received: -scale at the sent elements.
    assert np.all(exact[3::10] < 0) and np.count_nonzero(exact) == 10
    with pytest.raises(adaps.Error) as e:
        w.last_sent("nope")
    assert e.value.code == adaps.INVALID_ARGUMENT
    with pytest.raises(adaps.Error) as e:
        w.pull_parameters("x", np.zeros(7, np.float32))
    assert e.value.code == adaps.INVALID_ARGUMENT
    w.stop()


def test_residue_is_what_the_pushes_held_back(cluster):
    c = cluster(1, server_args=["--optimizer=mean"])
    w = adaps.Worker(c.address, request_timeout=10)
    values = np.zeros(100, np.float32)
    w.declare("x", values, compression="adacomp", bin_size=10, fuse=False)
    w.declare("small", np.zeros(6, np.float32), compression="adacomp", bin_size=6)  # fused
    w.declare("d", np.zeros(10, np.float32), compression="dense", fuse=False)
    held = np.full(100, 7.0, np.float32)
    w.residue("x", held)
    assert not held.any()  # nothing pushed yet
    grad = np.full(100, 0.01, np.float32)
    grad[3::10] = 5.0  # AdaComp sends exactly these, each with the one scale
    w.push_pull("x", grad, values).wait()
    w.residue("x", held)
    sent = np.zeros(100, np.float32)
    sent[3::10] = values[3::10]  # the mean of one worker: what it sent
    np.testing.assert_allclose(held + sent, grad, rtol=1e-6)  # error feedback: nothing lost
    g6 = np.array([0.1, 0.2, 9.0, 0.1, 0.3, 0.2], np.float32)
    out6 = np.zeros(6, np.float32)
    w.push_pull("small", g6, out6).wait()
    h6 = np.zeros(6, np.float32)
    w.residue("small", h6)
    np.testing.assert_allclose(h6 + out6, g6, rtol=1e-6)
    h10 = np.full(10, 1.0, np.float32)
    w.residue("d", h10)
    assert not h10.any()  # dense: nothing held back
    for name, out in [("nope", np.zeros(100, np.float32)), ("x", np.zeros(7, np.float32))]:
        with pytest.raises(adaps.Error) as e:
            w.residue(name, out)
        assert e.value.code == adaps.INVALID_ARGUMENT
    w.stop()


def test_residues_saved_and_loaded_into_a_restarted_worker(cluster, tmp_path):
    c = cluster(1, server_args=["--optimizer=mean"])
    w = adaps.Worker(c.address, request_timeout=10)
    values = np.zeros(100, np.float32)
    w.declare("x", values, compression="adacomp", bin_size=10, fuse=False)
    w.declare("small", np.zeros(6, np.float32), compression="adacomp", bin_size=6)
    w.declare("d", np.zeros(4, np.float32), compression="dense", fuse=False)
    rng = np.random.default_rng(5)
    w.push_pull("x", rng.normal(size=100).astype(np.float32), values).wait()
    w.push_pull("small", rng.normal(size=6).astype(np.float32), np.zeros(6, np.float32)).wait()
    path = str(tmp_path / "w0.residues")
    w.save_residues(path)
    held = {n: np.zeros(k, np.float32) for n, k in (("x", 100), ("small", 6))}
    for n, h in held.items():
        w.residue(n, h)
        assert h.any()
    w.stop()

    c2 = cluster(1, server_args=["--optimizer=mean"])
    w2 = adaps.Worker(c2.address, request_timeout=10)
    w2.declare("x", np.zeros(100, np.float32), compression="adacomp", bin_size=10, fuse=False)
    w2.declare("small", np.zeros(6, np.float32), compression="adacomp", bin_size=6)
    w2.declare("d", np.zeros(4, np.float32), compression="dense", fuse=False)
    w2.load_residues(path)
    for n, h in held.items():
        got = np.zeros_like(h)
        w2.residue(n, got)
        np.testing.assert_array_equal(got, h)
    # Bad files change nothing.
    damaged = tmp_path / "damaged"
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x10
    damaged.write_bytes(bytes(data))
    w2.declare("y", np.zeros(3, np.float32), compression="adacomp", fuse=False)
    w2.save_residues(str(tmp_path / "other"))  # has "y" (and "x", "small")
    for bad, code in [(str(tmp_path / "missing"), adaps.NOT_FOUND),
                      (str(damaged), adaps.DATA_LOSS)]:
        with pytest.raises(adaps.Error) as e:
            w2.load_residues(bad)
        assert e.value.code == code, e.value
    w2.stop()
    c3 = cluster(1, server_args=["--optimizer=mean"])
    w3 = adaps.Worker(c3.address, request_timeout=10)  # lacks "y" (the last): nothing is set
    w3.declare("x", np.zeros(100, np.float32), compression="adacomp", bin_size=10, fuse=False)
    w3.declare("small", np.zeros(6, np.float32), compression="adacomp", bin_size=6)
    with pytest.raises(adaps.Error) as e:
        w3.load_residues(str(tmp_path / "other"))
    assert e.value.code == adaps.INVALID_ARGUMENT and "'y' is not declared" in str(e.value)
    got = np.ones(100, np.float32)
    w3.residue("x", got)
    assert not got.any()
    with pytest.raises(adaps.Error) as e:
        w3.save_residues(str(tmp_path / "no" / "such" / "dir"))
    assert e.value.code == adaps.INTERNAL
    w3.stop()


def test_sparse_pulls_write_the_servers_parameters_and_are_refused_on_momentum(cluster):
    c = cluster(1, server_args=["--optimizer=mean"])
    w = adaps.Worker(c.address, request_timeout=10)
    values = np.zeros(20000, np.float32)
    w.declare("m", values, compression="adacomp", bin_size=500, pull="sparse")
    rng = np.random.default_rng(3)
    for _ in range(4):
        w.push_pull("m", rng.normal(size=values.size).astype(np.float32), values).wait()
        exact = np.empty_like(values)
        w.pull_parameters("m", exact)
        np.testing.assert_array_equal(values, exact)  # the step's mean, 0 where none sent
        assert 0 < np.count_nonzero(values) < values.size // 4
    t = w.traffic("m")
    # A mean step's AdaComp pushes forwarded (sign bits) beat the merged list (floats).
    assert t["pulls_answered_forwarded"] >= 3 and t["pulls_answered_sparse"] == 0
    with pytest.raises(adaps.Error) as e:
        w.declare("bad", np.zeros(4, np.float32), pull="bogus")
    assert e.value.code == adaps.INVALID_ARGUMENT and "sparse" in str(e.value)
    w.stop()
    c = cluster(1, server_args=["--optimizer=momentum"])
    w = adaps.Worker(c.address, request_timeout=10)
    with pytest.raises(adaps.Error) as e:
        w.declare("x", np.zeros(100, np.float32), pull="sparse")
    assert e.value.code == adaps.FAILED_PRECONDITION
    assert "momentum" in str(e.value) and "pull=dense" in str(e.value)
    w.stop()


def wait_stopped(pid, timeout=5.0):
    """True once every thread of process `pid` is stopped (state T), within `timeout`."""
    end = time.time() + timeout
    while time.time() < end:
        states = []
        for tid in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if states and all(st in ("T", "t") for st in states):
            return True
        time.sleep(0.005)
    return False


def test_stop_after_the_scheduler_exited_warns_and_stops(cluster):
    # A job's scheduler may exit before a worker says goodbye (the end of a run): stop()
    # then warns and stops the worker, as Horovod's shutdown() returns, instead of failing
    # a finished run. leave() still raises: what its residues held may not have arrived.
    c = cluster(1)
    w = adaps.Worker(c.address, request_timeout=3)
    w.declare("x", np.zeros(10, np.float32))
    c.scheduler.send_signal(signal.SIGKILL)
    c.scheduler.wait()
    with pytest.warns(RuntimeWarning, match="did not acknowledge its goodbye"):
        w.stop()
    with pytest.raises(adaps.Error):
        w.rank  # stopped
    c2 = cluster(1)
    v = adaps.Worker(c2.address, request_timeout=3)
    v.declare("y", np.zeros(10, np.float32))
    c2.scheduler.send_signal(signal.SIGKILL)
    c2.scheduler.wait()
    with pytest.raises(adaps.Error):
        v.leave()


def test_the_scheduler_keeps_answering_for_its_shutdown_grace_after_the_job_ended(cluster):
    # At the end of a job the scheduler's last messages (the Ack of the last goodbyes, the
    # Shutdown to every server) are queued when it decides to exit. It used to close 0.1 s
    # later: on 10 Mbit/s links with 16 workers and a server beside each, half the workers
    # waited out their goodbye's deadline and every server gave up on a silent scheduler
    # (exit 1). It now keeps its transport running for --shutdown_grace_ms (answering late
    # goodbyes), and a stop signal cuts that short with the job's exit code.
    c = cluster(1, scheduler_args=["--shutdown_grace_ms=60000", "--log_level=info"])
    w = adaps.Worker(c.address, request_timeout=60)
    w.declare("x", np.zeros(10, np.float32))
    w.stop()  # the only worker left: the job ended
    assert c.servers[0].wait(timeout=120) == 0  # the server had its Shutdown
    time.sleep(2.0)
    assert c.scheduler.poll() is None, "the scheduler exited within 2 s of the job's end"
    c.scheduler.send_signal(signal.SIGTERM)
    assert c.scheduler.wait(timeout=120) == 0
    assert "every worker has left" in c.log("scheduler")


def test_stop_waits_for_a_slow_scheduler_within_the_request_timeout(cluster):
    # 64 workers leaving at once on 2 cores kept the scheduler's answer to Leave past the
    # fixed 2 s it had (two workers once ended with DEADLINE_EXCEEDED after training
    # finished). Leave waits for request_timeout like every other request.
    c = cluster(1, dead_timeout_ms=20000)
    w = adaps.Worker(c.address, request_timeout=15)
    w.declare("x", np.zeros(10, np.float32))
    c.scheduler.send_signal(signal.SIGSTOP)
    try:
        # The stop takes effect when the scheduler's threads next run: on a loaded machine
        # its I/O thread answered the Leave before that (seen under a full ctest -j2).
        assert wait_stopped(c.scheduler.pid), "the scheduler did not stop on SIGSTOP"
        resume = threading.Timer(3.5, lambda: c.scheduler.send_signal(signal.SIGCONT))
        resume.start()
        start = time.time()
        w.stop()  # raised DEADLINE_EXCEEDED after 2 s before
        assert time.time() - start >= 3.0
    finally:
        c.scheduler.send_signal(signal.SIGCONT)
        resume.cancel()


def two_workers(c, n, **declare):
    """Two workers of cluster `c` (registration and Declare wait for both, hence threads),
    each with tensor "x" of n zeros declared with `declare` (unfused); (workers, values)."""
    made = [None, None]
    vals = [np.zeros(n, np.float32), np.zeros(n, np.float32)]

    def make(i):
        made[i] = adaps.Worker(c.address, request_timeout=10)
        made[i].declare("x", vals[i], fuse=False, **declare)
    threads = [threading.Thread(target=make, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return made, vals


def test_backup_workers_complete_a_step_without_the_straggler_and_keep_its_push(cluster):
    # --backup_workers=1 with 2 workers: each step completes with the first push; the
    # straggler's push of an earlier step goes into the step in progress.
    c = cluster(2, server_args=["--optimizer=sum", "--backup_workers=1"])
    (a, b), (va, vb) = two_workers(c, 8, compression="dense")
    start = time.time()
    a.push_pull("x", np.full(8, 1, np.float32), va).wait()  # B has not pushed: no wait
    assert time.time() - start < 5
    np.testing.assert_array_equal(va, 1)
    b.push_pull("x", np.full(8, 2, np.float32), vb).wait()  # late: into step 1
    np.testing.assert_array_equal(vb, 1)                      # step 0's parameters
    a.push_pull("x", np.full(8, 4, np.float32), va).wait()
    np.testing.assert_array_equal(va, 1 + 2 + 4)              # nothing lost
    a.stop()
    b.stop()


def test_backup_workers_are_refused_where_a_step_needs_every_worker(cluster, tmp_path):
    from conftest import SERVER_BIN
    import subprocess
    r = subprocess.run([SERVER_BIN, "--scheduler=tcp://127.0.0.1:1", "--optimizer=mean",
                        "--backup_workers=1"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "every step's mean" in r.stderr, r.stderr
    c = cluster(1, server_args=["--optimizer=sgd", "--backup_workers=1"])
    w = adaps.Worker(c.address, request_timeout=10)
    with pytest.raises(adaps.Error) as e:
        w.declare("r", np.zeros(100, np.float32), pull="recompressed")
    assert e.value.code == adaps.FAILED_PRECONDITION and "straggler" in str(e.value)
    w.declare("d", np.zeros(100, np.float32), pull="sparse")
    w.stop()


def test_leave_pushes_the_residues_and_live_workers_follows(cluster):
    # Worker.leave sends what the error feedback held back: with sum-only servers
    # the parameters are then the sum of every gradient, less what the staying worker holds.
    c = cluster(2, server_args=["--optimizer=sum"])
    (a, b), (va, vb) = two_workers(c, 300, compression="adacomp", bin_size=50)
    assert a.live_workers == 2 and b.live_workers == 2 and a.num_workers == 2
    rng = np.random.default_rng(7)
    ga, gb = (rng.normal(size=300).astype(np.float32) for _ in range(2))
    ha, hb = a.push_pull("x", ga, va), b.push_pull("x", gb, vb)
    ha.wait()
    hb.wait()
    held_b = np.zeros(300, np.float32)
    b.residue("x", held_b)
    assert np.abs(held_b).sum() > 1  # AdaComp held something back
    b.leave()
    a.push_pull("x", np.zeros(300, np.float32), va).wait()  # b's residue is in this step
    held_a = np.zeros(300, np.float32)
    a.residue("x", held_a)
    np.testing.assert_allclose(va + held_a, ga + gb, rtol=1e-5, atol=1e-5)
    end = time.time() + 10
    while a.live_workers != 1 and time.time() < end:
        time.sleep(0.02)
    assert a.live_workers == 1
    with pytest.raises(adaps.Error):
        b.rank  # a worker that left is stopped
    a.stop()


def test_workers_learn_the_servers_optimizer_and_a_server_that_differs_is_refused(tmp_path):
    # What a pull answers (a mean gradient or parameters) follows the servers' --optimizer:
    # the cluster view carries it to the workers (adaps.torch picks the mode by it), and the
    # scheduler refuses a server whose optimizer differs from another's of the same job.
    import subprocess
    from conftest import SCHEDULER_BIN, SERVER_BIN
    procs = []

    def start(tag, argv):
        log = open(str(tmp_path / (tag + ".log")), "wb")
        procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
        return procs[-1]

    def log(tag):
        return (tmp_path / (tag + ".log")).read_text(errors="replace")

    def wait_for(pred, what, timeout=20):
        end = time.time() + timeout
        while time.time() < end:
            if pred():
                return
            time.sleep(0.02)
        raise AssertionError("timed out waiting for " + what)
    try:
        start("scheduler", [SCHEDULER_BIN, "--num_servers=2", "--num_workers=1",
                            "--port_file=" + str(tmp_path / "port"), "--log_level=info"])
        wait_for(lambda: (tmp_path / "port").exists() and (tmp_path / "port").read_text(),
                 "the scheduler's port")
        address = "tcp://127.0.0.1:" + (tmp_path / "port").read_text().strip()
        server = [SERVER_BIN, "--scheduler=" + address, "--log_level=warn"]
        start("mean1", server + ["--optimizer=mean"])
        wait_for(lambda: "Server 0 registered" in log("scheduler"), "the first server")
        other = start("sgd", server + ["--optimizer=sgd"])
        assert other.wait(timeout=20) != 0
        text = log("sgd")
        assert "--optimizer=sgd" in text and "--optimizer=mean" in text and \
            "same optimizer" in text, text
        start("mean2", server + ["--optimizer=mean"])
        w = adaps.Worker(scheduler=address, register_timeout=20, request_timeout=15)
        try:
            assert w.server_optimizer == "mean"
        finally:
            w.stop()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def _scheduler_gauge(port, name):
    import urllib.request
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no %s" % name)


@pytest.mark.parametrize("window_ms", [600000, 0])
def test_goodbyes_close_together_share_one_view(cluster, tmp_path, window_ms):
    # A view goes to every node and grows with the job: one per goodbye at the end of a job
    # of 16 workers and 16 servers on 1 Mbit/s links held the scheduler's last answers
    # seconds behind them. Goodbyes within --leave_view_window_ms of the last view share the
    # next one (the first after a quiet spell goes at once). 5 of 6 workers leave one after
    # another: within a long window the first goodbye's view is the only one; with no window
    # (the old behaviour) each goodbye has its own (the test waits for it before the next).
    port_file = str(tmp_path / "metrics")
    c = cluster(6, scheduler_args=["--metrics_port=0", "--metrics_host=127.0.0.1",
                                   "--metrics_port_file=" + port_file,
                                   "--leave_view_window_ms=%d" % window_ms])
    workers = [None] * 6

    def make(i):
        workers[i] = adaps.Worker(c.address, request_timeout=60)
    threads = [threading.Thread(target=make, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(workers)
    with open(port_file) as f:
        port = int(f.read())
    stay = next(w for w in workers if w.rank == 0)
    before = _scheduler_gauge(port, "adaps_cluster_epoch")

    def wait_for_views(n):
        end = time.time() + 120
        while _scheduler_gauge(port, "adaps_cluster_epoch") - before < n and time.time() < end:
            time.sleep(0.02)
    leaving = [w for w in workers if w is not stay]
    for k, w in enumerate(leaving):
        w.stop()  # Leave: answered before the view it triggers
        if window_ms == 0 or k == 0:
            wait_for_views(k + 1)
    time.sleep(0.5)  # (a view that should not come would come now)
    views = _scheduler_gauge(port, "adaps_cluster_epoch") - before
    assert views == (1 if window_ms else len(leaving)), views
    stay.stop()


def test_curve_keys_encrypt_a_python_worker_as_the_executables_flags_do(cluster, tmp_path,
                                                                       monkeypatch):
    # A cluster served only to listed CURVE keys (adaps-keygen's files, the executables'
    # flags): a Python worker with its listed pair trains; one with an unlisted pair, or none,
    # is refused at registration; the server key without a pair is refused before anything.
    from conftest import SCHEDULER_BIN
    keygen = os.path.join(os.path.dirname(SCHEDULER_BIN), "adaps-keygen")
    for name in ("cluster", "server0", "worker0", "intruder"):
        subprocess.run([keygen, str(tmp_path / name)], check=True, stdout=subprocess.DEVNULL)
    allowed = tmp_path / "allowed"
    allowed.write_text((tmp_path / "server0.pub").read_text() +
                       (tmp_path / "worker0.pub").read_text())
    serve = ["--curve_server_key=%s" % (tmp_path / "cluster.key"),
             "--curve_allowed_clients=%s" % allowed]
    c = cluster(1, server_args=serve + ["--curve_client_key=%s" % (tmp_path / "server0.key"),
                                        "--optimizer=sum"],
                scheduler_args=serve)
    server_pub = str(tmp_path / "cluster.pub")
    for kwargs in ({"curve_server_key": server_pub,
                    "curve_client_key": str(tmp_path / "intruder.key")}, {}):
        with pytest.raises(adaps.Error) as e:
            adaps.Worker(c.address, register_timeout=2, **kwargs)
        assert e.value.code in (adaps.UNAVAILABLE, adaps.DEADLINE_EXCEEDED)
    with pytest.raises(adaps.Error, match="needs this worker.s key pair too") as e:
        adaps.Worker(c.address, curve_server_key=server_pub)
    assert e.value.code == adaps.INVALID_ARGUMENT
    with pytest.raises(adaps.Error, match="nope.key"):
        adaps.Worker(c.address, curve_server_key=server_pub,
                     curve_client_key=str(tmp_path / "nope.key"))
    monkeypatch.setenv("ADAPS_SCHEDULER", c.address)
    monkeypatch.setenv("ADAPS_CURVE_SERVER_KEY", server_pub)
    monkeypatch.setenv("ADAPS_CURVE_CLIENT_KEY", str(tmp_path / "worker0.key"))
    w = adaps.worker_from_env(request_timeout=60, register_timeout=120)
    values = np.zeros(4, np.float32)
    w.declare("x", values, compression="dense")
    w.push_pull("x", np.ones(4, np.float32), values).wait()
    np.testing.assert_array_equal(values, np.ones(4, np.float32))
    w.stop()
