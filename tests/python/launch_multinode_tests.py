"""Jobs launched the multi-node ways, on this machine's loopback (the namespace test
tests/deploy/launch_multinode_test.sh runs the two-node launch across real addresses):

  - the torchrun way: 4 processes of checksum_worker.py given RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR and MASTER_PORT and no ADAPS_SCHEDULER; rank 0 hosts the scheduler and the
    server, every replica ends equal, and the hosted processes are gone afterwards;
  - the same with srun's and mpirun's variables (2 processes each);
  - rank 0 killed: the scheduler it hosts dies with it (PR_SET_PDEATHSIG);
  - adaps.launch --nnodes 2: two launches, one per "node", 2 workers each;
  - a worker failing on node 1: node 1 exits with its code, and the scheduler fails the job
    on node 0 once node 1's other worker (stopped by its launch) is declared dead.

Not named test_*.py: its own ctest (python_launch_multinode) runs it with a longer timeout
than the package's pytest run. Every wait has a deadline of minutes (a machine at load 20)."""
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import SCHEDULER_BIN

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "checksum_worker.py")
BIN_DIR = os.path.dirname(os.path.dirname(SCHEDULER_BIN))
DEADLINE_S = 600


def base_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "SLURM_",
                                "OMPI_"))
           and k != "ADAPS_SCHEDULER"}
    env["ADAPS_BIN_DIR"] = BIN_DIR
    env["PYTHONUNBUFFERED"] = "1"
    return env


def free_port_pair():
    """A port p with p free and p + 1 free (the scheduler takes MASTER_PORT + 1)."""
    for _ in range(100):
        with socket.socket() as a:
            a.bind(("0.0.0.0", 0))
            p = a.getsockname()[1]
            if p >= 65535:
                continue
            try:
                with socket.socket() as b:
                    b.bind(("0.0.0.0", p + 1))
                return p
            except OSError:
                continue
    raise RuntimeError("no two adjacent free ports")


def port_listens(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return True
    except OSError:
        return False


def wait_until(cond, timeout, what):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "gave up after %gs waiting for %s" % (timeout, what)
        time.sleep(0.2)


def finish(procs, timeout):
    """[(exit code, output)] of every process, killing all of them at the deadline."""
    end = time.monotonic() + timeout
    results = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1, end - time.monotonic()))
            results.append((p.returncode, out.decode("utf-8", "replace")))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return results


def start(argv, env):
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


def checksums(out):
    return re.findall(r"CHECKSUM rank (\d+) of (\d+) launcher-rank \S+ sha256 ([0-9a-f]+)", out)


def test_a_job_started_the_torchrun_way_completes_with_equal_replicas():
    master_port = free_port_pair()
    procs = []
    for r in range(4):
        env = base_env()
        env.update({"RANK": str(r), "WORLD_SIZE": "4", "LOCAL_RANK": str(r),
                    "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(master_port)})
        procs.append(start([sys.executable, SCRIPT], env))
    results = finish(procs, DEADLINE_S)
    everything = "\n".join("== rank %d, exit %d\n%s" % (r, c, o)
                           for r, (c, o) in enumerate(results))
    assert all(c == 0 for c, _ in results), everything
    found = [checksums(o) for _, o in results]
    assert all(len(f) == 1 for f in found), everything
    ranks = sorted(int(f[0][0]) for f in found)
    assert ranks == [0, 1, 2, 3], everything
    assert {f[0][1] for f in found} == {"4"}, everything
    assert len({f[0][2] for f in found}) == 1, everything  # every replica the same
    # Rank 0's scheduler (at MASTER_PORT + 1) ended with the job.
    wait_until(lambda: not port_listens(master_port + 1), 120, "the scheduler to end")


def launcher_env(launcher, rank, size, port):
    """What srun or mpirun gives rank `rank` of `size` on this one node (the scheduler's
    port by ADAPS_SCHEDULER_PORT: Slurm's default is derived from the job id)."""
    if launcher == "slurm":
        return {"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(size),
                "SLURM_LOCALID": str(rank), "SLURM_JOB_NODELIST": "localhost,nohost[2-3]",
                "SLURM_JOB_ID": "4242", "ADAPS_SCHEDULER_PORT": str(port)}
    return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_SIZE": str(size),
            "ADAPS_SCHEDULER_PORT": str(port)}


@pytest.mark.parametrize("launcher", ["slurm", "mpi"])
def test_jobs_started_by_srun_and_mpirun_variables_complete(launcher):
    port = free_port_pair()
    procs = []
    for r in range(2):
        env = base_env()
        env.update(launcher_env(launcher, r, 2, port))
        procs.append(start([sys.executable, SCRIPT], env))
    results = finish(procs, DEADLINE_S)
    everything = "\n".join("== rank %d, exit %d\n%s" % (r, c, o)
                           for r, (c, o) in enumerate(results))
    assert all(c == 0 for c, _ in results), everything
    found = [f for _, o in results for f in checksums(o)]
    assert sorted(int(f[0]) for f in found) == [0, 1], everything
    assert len({f[2] for f in found}) == 1, everything
    wait_until(lambda: not port_listens(port), 120, "the scheduler to end")


def test_the_scheduler_rank_0_hosts_dies_with_it():
    master_port = free_port_pair()
    env = base_env()
    env.update({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port)})
    p = start([sys.executable, SCRIPT], env)
    try:
        # Rank 1 never comes: rank 0 waits in registration with its scheduler up.
        wait_until(lambda: port_listens(master_port + 1) or p.poll() is not None, DEADLINE_S,
                   "rank 0's scheduler")
        assert p.poll() is None, p.communicate()[0].decode()
        os.kill(p.pid, signal.SIGKILL)  # no atexit: only the death signal stops it
        p.wait()
        wait_until(lambda: not port_listens(master_port + 1), 120,
                   "the scheduler to die with rank 0")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        p.stdout.close()


def launch_node(node, port, extra, script_args=()):
    return start([sys.executable, "-m", "adaps.launch", "--bin-dir", BIN_DIR,
                  "--nnodes", "2", "--node-rank", str(node), "--rdzv", "127.0.0.1:%d" % port,
                  "--rdzv-timeout", str(DEADLINE_S), "-n", "2"] + extra +
                 [SCRIPT] + list(script_args), base_env())


def test_launch_over_two_nodes_trains_one_job():
    port = free_port_pair()
    # Node 1 first: it waits for node 0's scheduler.
    procs = [launch_node(1, port, ["--colocate"])]
    time.sleep(1)
    procs.insert(0, launch_node(0, port, ["--colocate"]))
    results = finish(procs, DEADLINE_S)
    everything = "\n".join("== node %d, exit %d\n%s" % (n, c, o)
                           for n, (c, o) in enumerate(results))
    assert [c for c, _ in results] == [0, 0], everything
    assert "waiting up to" in results[1][1], everything  # node 1 waited for node 0
    found = checksums(results[0][1]) + checksums(results[1][1])
    assert sorted(int(f[0]) for f in found) == [0, 1, 2, 3], everything
    assert {f[1] for f in found} == {"4"}, everything
    assert len({f[2] for f in found}) == 1, everything


def test_a_worker_failing_on_node_1_fails_both_nodes():
    port = free_port_pair()
    procs = [launch_node(n, port, [], ["fail-on-node-1"]) for n in (0, 1)]
    start_s = time.monotonic()
    results = finish(procs, DEADLINE_S)
    everything = "\n".join("== node %d, exit %d\n%s" % (n, c, o)
                           for n, (c, o) in enumerate(results))
    assert results[1][0] == 3, everything
    assert "exited with 3, stopping everything" in results[1][1], everything
    # The scheduler failed the job: node 0 stops (its server or a worker reports it first).
    assert results[0][0] != 0, everything
    assert "died (--on_worker_death=fail)" in results[0][1], everything
    assert time.monotonic() - start_s < DEADLINE_S, everything
