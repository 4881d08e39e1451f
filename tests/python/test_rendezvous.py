"""adaps.rendezvous: the job a launcher's environment describes (torchrun, Slurm, Open MPI),
Slurm's compressed node lists, and adaps.launch's checks of its multi-node flags. Fast: no
cluster is started (label unit)."""
import os
import socket
import time

import pytest

import adaps
from adaps import rendezvous as rdzv
from adaps.rendezvous import EnvError, expand_nodelist, job_from_env


def fields(job):
    return (job.launcher, job.rank, job.world_size, job.local_rank, job.host, job.port)


# --- Slurm node lists -----------------------------------------------------------------------

@pytest.mark.parametrize("text, hosts", [
    ("node1", ["node1"]),
    ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
    ("a,b,c", ["a", "b", "c"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("r[1-2]-n[1,3]", ["r1-n1", "r1-n3", "r2-n1", "r2-n3"]),
    ("gpu-[3]", ["gpu-3"]),
    ("c[1-2]x,d[5]", ["c1x", "c2x", "d5"]),
    ("10.0.0.[1-2]", ["10.0.0.1", "10.0.0.2"]),
])
def test_slurm_node_lists_expand_in_order(text, hosts):
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize("text", ["", "n[1-2", "n1-2]", "n[a-b]", "n[3-1]", "a,,b",
                                  "n[1,[2]]", "n[]"])
def test_malformed_slurm_node_lists_are_errors(text):
    with pytest.raises(EnvError):
        expand_nodelist(text)


# --- The launchers' environments ------------------------------------------------------------

def test_no_launcher_variables_is_no_job():
    assert job_from_env({}) is None
    assert job_from_env({"PATH": "/bin", "LOCAL_RANK": "0"}) is None


def test_torchrun():
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "10.1.2.3",
           "MASTER_PORT": "29500"}
    job = job_from_env(env)
    assert fields(job) == ("torchrun", 3, 8, 1, "10.1.2.3", 29501)
    assert job.address == "tcp://10.1.2.3:29501"
    env["ADAPS_SCHEDULER_PORT"] = "4000"
    assert job_from_env(env).port == 4000


def test_torchrun_wins_over_slurm_and_mpi_variables():
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h0", "MASTER_PORT": "100",
           "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NODELIST": "x",
           "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"}
    assert fields(job_from_env(env)) == ("torchrun", 1, 2, 0, "h0", 101)


@pytest.mark.parametrize("env, words", [
    ({"WORLD_SIZE": "4"}, ["WORLD_SIZE is set but RANK is not"]),
    ({"RANK": "0"}, ["RANK is set but WORLD_SIZE is not"]),
    ({"RANK": "4", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
     ["RANK=4 is not below WORLD_SIZE=4"]),
    ({"RANK": "x", "WORLD_SIZE": "4"}, ["RANK='x' is not an integer"]),
    ({"RANK": "0", "WORLD_SIZE": "0"}, ["WORLD_SIZE=0 must be at least 1"]),
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, ["MASTER_ADDR is not"]),
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, ["MASTER_PORT", "ADAPS_SCHEDULER_PORT"]),
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "65535"},
     ["65536", "not 1 to 65535"]),
    ({"OMPI_COMM_WORLD_SIZE": "2"}, ["OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK"]),
    ({"SLURM_PROCID": "0"}, ["SLURM_PROCID is set but SLURM_STEP_NUM_TASKS or SLURM_NTASKS"]),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "5"}, ["no node list"]),
])
def test_contradictory_or_incomplete_environments_are_clear_errors(env, words):
    with pytest.raises(EnvError) as e:
        job_from_env(env)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_torchrun_single_process_needs_no_master():
    assert fields(job_from_env({"RANK": "0", "WORLD_SIZE": "1"})) == \
        ("torchrun", 0, 1, 0, "127.0.0.1", 29501)


def test_slurm():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
           "SLURM_JOB_NODELIST": "gpu[07-10],cpu1", "SLURM_JOB_ID": "1234"}
    # Task 0 runs on the first node; the port is deploy/slurm/adaps.sbatch's.
    assert fields(job_from_env(env)) == ("slurm", 5, 8, 1, "gpu07",
                                         20000 + 100 * (1234 % 300))
    # The step's own task count and node list win over the allocation's.
    env.update({"SLURM_STEP_NUM_TASKS": "6", "SLURM_STEP_NODELIST": "gpu[09-10]"})
    assert fields(job_from_env(env))[2:5] == (6, 1, "gpu09")
    env.update({"MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "7000"})
    assert fields(job_from_env(env))[4:] == ("10.0.0.9", 7001)
    # SLURM_NODELIST (older Slurm) and no job id: a port must be given.
    env = {"SLURM_PROCID": "0", "SLURM_NPROCS": "2", "SLURM_NODELIST": "n[1-2]"}
    with pytest.raises(EnvError, match="MASTER_PORT"):
        job_from_env(env)
    env["ADAPS_SCHEDULER_PORT"] = "31000"
    assert fields(job_from_env(env)) == ("slurm", 0, 2, 0, "n1", 31000)


def test_open_mpi():
    env = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
           "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    # Two nodes: Open MPI does not say where rank 0 runs.
    with pytest.raises(EnvError, match="MASTER_ADDR"):
        job_from_env(env)
    env["MASTER_ADDR"] = "node0"
    assert fields(job_from_env(env)) == ("mpi", 2, 4, 0, "node0", 29501)
    # One node: loopback.
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
           "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    assert fields(job_from_env(env)) == ("mpi", 1, 2, 1, "127.0.0.1", 29501)
    # mpirun inside a Slurm allocation: the ranks inherit the batch step's SLURM_PROCID.
    env.update({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "a,b",
                "SLURM_JOB_ID": "9"})
    assert job_from_env(env).launcher == "mpi"


# --- worker_from_env without ADAPS_SCHEDULER ------------------------------------------------

@pytest.fixture
def launcher_env(monkeypatch):
    """set(**variables): os.environ without any launcher's variables, plus these."""
    for k in list(os.environ):
        if k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "SLURM_", "OMPI_")) \
                or k in ("ADAPS_SCHEDULER", "ADAPS_SCHEDULER_PORT", "ADAPS_REGISTER_TIMEOUT_S"):
            monkeypatch.delenv(k)

    def set_vars(**variables):
        for k, v in variables.items():
            monkeypatch.setenv(k, v)
    return set_vars


def test_worker_from_env_without_any_launcher_names_the_ways_to_start(launcher_env):
    with pytest.raises(adaps.Error) as e:
        adaps.worker_from_env()
    assert e.value.code_name == "FAILED_PRECONDITION", str(e.value)
    for w in ("adaps.launch", "torchrun", "srun", "mpirun"):
        assert w in str(e.value), str(e.value)


def test_worker_from_env_refuses_a_contradictory_environment(launcher_env):
    launcher_env(WORLD_SIZE="2")
    with pytest.raises(adaps.Error) as e:
        adaps.worker_from_env()
    assert e.value.code_name == "INVALID_ARGUMENT", str(e.value)
    assert "WORLD_SIZE is set but RANK is not" in str(e.value)


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_rank_whose_scheduler_never_answers_fails_naming_it(launcher_env):
    port = closed_port()
    launcher_env(RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                 ADAPS_SCHEDULER_PORT=str(port), ADAPS_REGISTER_TIMEOUT_S="0.5")
    start = time.monotonic()
    with pytest.raises(adaps.Error) as e:
        adaps.worker_from_env()
    assert e.value.code_name == "DEADLINE_EXCEEDED", str(e.value)
    assert "no adaps scheduler answered at 127.0.0.1:%d within 0.5s" % port in str(e.value)
    assert time.monotonic() - start < 100


def test_wait_for_port_sees_a_listener_and_gives_up_on_a_dead_one():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert rdzv.wait_for_port("127.0.0.1", s.getsockname()[1], 60)
    port = closed_port()
    assert not rdzv.wait_for_port("127.0.0.1", port, 0.2)
    start = time.monotonic()
    assert not rdzv.wait_for_port("127.0.0.1", port, 600, alive=lambda: False)
    assert time.monotonic() - start < 60


# --- adaps.launch's multi-node flags --------------------------------------------------------

def launch_usage(args, capsys):
    from adaps import launch
    with pytest.raises(SystemExit) as e:
        launch.main(args)
    captured = capsys.readouterr()
    return e.value.code, captured.out + captured.err


@pytest.mark.parametrize("args, words", [
    (["--nnodes", "2", "--node-rank", "2", "--rdzv", "h:1"], "--node-rank 2 is not below --nnodes 2"),
    (["--nnodes", "2", "--node-rank", "1"], "--nnodes 2 needs --rdzv HOST:PORT"),
    (["--nnodes", "2", "--rdzv", "h:1", "--join", "tcp://h:2", "--server-optimizer", "sum"],
     "does not go with --nnodes"),
    (["--node-rank", "1"], "--node-rank belongs to a launch over several nodes"),
    (["--rdzv", "h:5"], "--rdzv belongs to a launch over several nodes"),
    (["--nnodes", "2", "--rdzv", "h"], "expected HOST:PORT"),
    (["--nnodes", "2", "--rdzv", "h:70000"], "expected HOST:PORT"),
    (["--nnodes", "0"], "--nnodes must be at least 1"),
    (["--nnodes", "2", "--rdzv", "h:1", "--max-workers", "3"], "must be at least -n (4)"),
])
def test_launch_refuses_bad_multinode_flags(args, words, capsys):
    # (--rdzv-timeout: were a check missing, the launch would wait for a scheduler.)
    code, out = launch_usage(["-n", "2", "--rdzv-timeout", "5"] + args + ["x.py"], capsys)
    assert code == 2 and words in out, out


def test_launch_help_documents_several_nodes(capsys):
    code, out = launch_usage(["--help"], capsys)
    assert code == 0, out
    for w in ("--nnodes", "--node-rank", "--rdzv", "--node-addr", "torchrun's shape"):
        assert w in out, w


def test_a_node_whose_scheduler_never_answers_fails_naming_it(capsys):
    from adaps import launch
    port = closed_port()
    code = launch.main(["--nnodes", "2", "--node-rank", "1", "--rdzv", "127.0.0.1:%d" % port,
                        "--rdzv-timeout", "1", "-n", "1", "x.py"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "no scheduler answered at 127.0.0.1:%d within 1s" % port in err, err
