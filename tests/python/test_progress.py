"""Progress a person can watch: adaps.progress (plain lines in logs, one line rewritten in
place on a terminal, rank 0 only), adaps.launch forwarding the live line to its terminal (a
pty here) and plain lines to a pipe, and adaps-worker --mode=train doing the same."""
import io
import os
import pty
import select
import subprocess
import sys

import pytest

from conftest import SCHEDULER_BIN, run_launch

import adaps.progress

HERE = os.path.dirname(os.path.abspath(__file__))


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def run_epoch(terminal, steps=50, rank=0, dt=0.1):
    out, clock = io.StringIO(), FakeClock()
    p = adaps.progress.Progress(steps, epoch=1, epochs=3, rank=rank, batch_size=64,
                                stream=out, terminal=terminal, clock=clock)
    for i in range(steps):
        clock.t += dt
        p.update(i + 1, loss=0.5, compression=40.0)
    p.close()
    return out.getvalue()


def test_in_a_log_it_prints_a_plain_line_per_tenth_of_the_epoch():
    text = run_epoch(terminal=False)
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert len(lines) == 9, text  # 10% .. 90%; the script's own epoch line follows
    assert lines[0] == ("epoch 2/3  step 5/50 ( 10%)  ETA 0:04  loss 0.5000  640 img/s  "
                        "compression 40.0x")
    assert lines[-1].startswith("epoch 2/3  step 45/50 ( 90%)")


def test_on_a_terminal_one_line_is_rewritten_at_most_four_times_a_second():
    text = run_epoch(terminal=True, steps=20)  # 2 s of steps
    draws = [d for d in text.split("\r") if d]
    assert 7 <= len(draws) <= 9, draws
    assert all(d.endswith("\x1b[K") for d in draws[:-1]), draws
    assert "\n" not in "".join(draws[:-1])
    assert draws[-1].startswith("epoch 2/3  step 20/20 (100%)  ETA 0:00")
    assert text.endswith("\x1b[K\n")


def test_ranks_other_than_zero_print_nothing():
    assert run_epoch(terminal=True, rank=1) == ""
    assert run_epoch(terminal=False, rank=1) == ""


def test_compression_given_as_a_function_is_called_only_when_a_line_is_printed():
    calls = []
    out, clock = io.StringIO(), FakeClock()
    p = adaps.progress.Progress(100, stream=out, terminal=False, clock=clock)
    for i in range(100):
        p.update(i + 1, compression=lambda: calls.append(1) or 9.0)
    assert len(calls) == 9 and "compression 9.0x" in out.getvalue()


BIN_DIR = os.path.dirname(os.path.dirname(SCHEDULER_BIN))
WORKER_BIN = os.path.join(BIN_DIR, "worker", "adaps-worker")
DATA_DIR = "/usr/share/datasets/fashion-mnist"


def on_a_pty(argv, timeout=60):
    """Runs argv with its stdout and stderr on a pseudo-terminal; (exit code, output)."""
    master, slave = pty.openpty()
    env = dict(os.environ, ADAPS_BIN_DIR=BIN_DIR)
    env.pop("ADAPS_PROGRESS", None)
    p = subprocess.Popen(argv, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], timeout)
        if not ready:
            p.kill()
            break
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: every writer closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    p.wait(timeout=10)
    return p.returncode, b"".join(chunks).decode("utf-8", "replace")


def launch_on_a_pty(args):
    return on_a_pty([sys.executable, "-m", "adaps.launch", "--bin-dir", BIN_DIR] + args)


def train_args(cluster):
    return [WORKER_BIN, "--mode=train", "--scheduler=" + cluster.address, "--train_limit=3200",
            "--epochs=2", "--batch=32", "--test_limit=200", "--log_level=warn",
            "--data_dir=" + DATA_DIR]


needs_data = pytest.mark.skipif(not os.path.isdir(DATA_DIR) or not os.path.exists(WORKER_BIN),
                                reason="no Fashion-MNIST (dataset-fashion-mnist) or adaps-worker")


@needs_data
def test_adaps_worker_train_on_a_terminal_rewrites_one_line_per_epoch(cluster):
    code, out = on_a_pty(train_args(cluster(workers=1)))
    assert code == 0, out
    for epoch in (1, 2):
        assert "\repoch %d/2  step 1/100 (  1%%)" % epoch in out, repr(out)
        assert "\repoch %d/2  step 100/100 (100%%)" % epoch in out, repr(out)
    assert out.count("\x1b[K\r\n") == 2, repr(out)  # each epoch's line ends once (pty: \r\n)


@needs_data
def test_adaps_worker_train_into_a_log_prints_plain_progress_lines(cluster):
    c = cluster(workers=1)
    p = subprocess.run(train_args(c), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=120)
    out = p.stdout.decode()
    assert p.returncode == 0, out
    assert "\r" not in out and "\x1b" not in out, repr(out)
    progress = [l for l in out.splitlines() if l.startswith("epoch ") and " step " in l and "ETA" in l]
    assert len(progress) == 18, out  # 10% .. 90% of each of 2 epochs
    assert progress[0].startswith("epoch 1/2  step 10/100 ( 10%)  ETA "), progress[0]
    assert "loss " in progress[0] and "img/s" in progress[0] and "compression" in progress[0]


def test_launch_on_a_terminal_rewrites_rank_zeros_line_in_place():
    code, out = launch_on_a_pty(["-n", "2", os.path.join(HERE, "progress_worker.py")])
    assert code == 0, out
    assert "\r[r0] epoch 1/1  step " in out, repr(out)
    assert "\r[r0] epoch 1/1  step 20/20 (100%)" in out, repr(out)
    assert "[r1] epoch" not in out, repr(out)
    assert out.count("done rank") == 2, repr(out)


def test_launch_into_a_log_forwards_plain_lines():
    code, out = run_launch(["-n", "2", os.path.join(HERE, "progress_worker.py")], timeout=60)
    assert code == 0, out
    assert "\r" not in out and "\x1b" not in out, repr(out)
    lines = [l for l in out.splitlines() if "epoch 1/1" in l]
    assert len(lines) == 9 and all(l.startswith("[r0] ") for l in lines), out
