"""adaps.torch and adaps.launch with real processes: 2 torch workers on a local cluster."""
import os
import re
import subprocess

import pytest

from conftest import REPO, SCHEDULER_BIN, launch_and_join, run_launch

HERE = os.path.dirname(os.path.abspath(__file__))


def test_dense_mean_mode_aggregates_the_mean_of_torch_gradients():
    code, out = run_launch(["-n", "2", "--server-optimizer", "mean", "--compression", "dense",
                            os.path.join(HERE, "dense_check_worker.py"), "local"], timeout=600)
    assert code == 0, out
    assert out.count("DENSE CHECK OK") == 2, out


def test_dense_server_mode_matches_sgd_on_the_mean_gradient():
    code, out = run_launch(["-n", "2", "--server-optimizer", "sgd", "--compression", "dense",
                            os.path.join(HERE, "dense_check_worker.py"), "server"], timeout=600)
    assert code == 0, out
    assert out.count("DENSE CHECK OK") == 2, out


def test_adacomp_fashion_mnist_loss_falls_and_accuracy_beats_chance():
    code, out = run_launch(
        ["-n", "2", "--server-optimizer", "sgd", "--compression", "adacomp",
         os.path.join(REPO, "examples", "pytorch", "train_fashion_mnist.py"),
         "--max-steps", "150", "--train-size", "12000", "--test-size", "1000",
         "--log-every", "25", "--lr", "0.05"], timeout=600)
    assert code == 0, out
    for rank in (0, 1):
        losses = [float(m) for m in re.findall(r"\[r%d\] step +\d+ +loss ([\d.]+)" % rank, out)]
        assert len(losses) >= 4, out
        assert losses[-1] < 0.7 * losses[0], (losses, out)
        acc = re.search(r"\[r%d\] final test accuracy ([\d.]+)" % rank, out)
        assert acc and float(acc.group(1)) > 0.6, out  # chance: 0.1
    # AdaComp actually compressed: push wire bytes well below dense for both layer types.
    for kind in ("conv", "linear"):
        m = re.search(r"\[r0\] %s .*\( *([\d.]+)x\)" % kind, out)
        assert m and float(m.group(1)) > 5, out


def test_launch_stops_everything_when_a_worker_fails():
    script = os.path.join(HERE, "failing_worker.py")
    code, out = run_launch(["-n", "2", script], timeout=600)
    assert code == 3, out
    assert "exited with 3, stopping everything" in out, out


def test_launch_without_a_server_optimizer_runs_local_mode_so_any_torch_optimizer_trains():
    # As with DDP or Horovod, AdamW (which the servers cannot run) trains at the defaults.
    code, out = run_launch(["-n", "2", os.path.join(HERE, "launch_flags_worker.py"), "adamw"],
                           timeout=600)
    assert code == 0, out
    assert out.count("FLAGS mode=local compression=adacomp pull=sparse lr=0.01 dense_push=0 "
                     "servers=1 moment=global own=share") == 2, out


def test_the_job_may_take_rdzv_timeout_to_form_and_no_longer():
    # The servers and workers adaps.launch starts wait --rdzv-timeout for the others (a
    # worker importing torch 2.x on a busy machine takes minutes), not adaps-server's own
    # minute; past it the job fails, naming the deadline. (Before, the servers' minute held
    # whatever the flag said: this job, 3 s allowed and 20 s needed, completed.)
    code, out = run_launch(["-n", "2", "--server-optimizer", "mean", "--rdzv-timeout", "3",
                            os.path.join(HERE, "slow_start_worker.py"), "20"], timeout=600)
    assert code != 0 and "DEADLINE_EXCEEDED" in out, out
    assert out.count("REGISTERED") < 2, out
    code, out = run_launch(["-n", "2", "--server-optimizer", "mean", "--rdzv-timeout", "600",
                            os.path.join(HERE, "slow_start_worker.py"), "3"], timeout=600)
    assert code == 0 and out.count("REGISTERED") == 2, out


def test_launch_flags_reach_the_optimizer_of_a_script_that_reads_no_environment():
    code, out = run_launch(["-n", "2", "--server-optimizer", "sgd", "--compression", "dense",
                            "--pull", "recompressed", "--lr", "0.5",
                            os.path.join(HERE, "launch_flags_worker.py")], timeout=600)
    assert code == 0, out
    assert out.count("FLAGS mode=server compression=dense pull=recompressed lr=0.5 "
                     "dense_push=1 servers=1") == 2, out
    code, out = run_launch(["-n", "2", "--server-optimizer", "mean", "--compression", "dense",
                            "--lr", "0.5", os.path.join(HERE, "launch_flags_worker.py")],
                           timeout=600)
    assert code == 0, out
    # Local mode's default pull is sparse (the servers answer dense when that is smaller).
    assert out.count("FLAGS mode=local compression=dense pull=sparse lr=0.5 "
                     "dense_push=1 servers=1") == 2, out
    # The dict form per layer type: the linear layers dense, so nothing is compressed.
    code, out = run_launch(["-n", "2", "--server-optimizer", "mean", "--compression",
                            "linear:dense", os.path.join(HERE, "launch_flags_worker.py")],
                           timeout=600)
    assert code == 0, out
    assert out.count("FLAGS mode=local compression={'linear': 'dense'} pull=sparse lr=0.01 "
                     "dense_push=1 servers=1") == 2, out
    for bad in ("linear:zip", "rnn:dense", "zip"):
        code, out = run_launch(["-n", "2", "--compression", bad, "x.py"], timeout=600)
        assert code == 2 and "TYPE:NAME" in out, (bad, out)
    # --colocate: one server per worker (BytePS-style); refused beside --servers.
    code, out = run_launch(["-n", "3", "--colocate", "--server-optimizer", "mean",
                            "--second-moment", "local", "--own-updates", "all",
                            os.path.join(HERE, "launch_flags_worker.py")], timeout=600)
    assert code == 0, out
    assert out.count("FLAGS mode=local compression=adacomp pull=sparse") == 3, out
    assert out.count("servers=3 moment=local own=all") == 3, out
    code, out = run_launch(["-n", "2", "--colocate", "--servers", "2", "x.py"], timeout=600)
    assert code == 2 and "drop --servers" in out, out


def test_local_mode_refuses_recompressed_pulls_of_gradients_before_anything_collective():
    # The servers' running sum of mean gradients would hand stale gradients back: only the
    # update exchange (the sum of the updates is where the parameters are) pulls recompressed.
    import torch
    import torch.nn as nn
    import adaps.torch
    m = nn.Linear(2, 1)
    with pytest.raises(ValueError, match="recompressed pulls in local mode need the update"):
        adaps.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m,
                                         worker=None, server_optimizer="mean",
                                         pull="recompressed", exchange="gradient")


def test_launch_restarts_a_killed_server_and_the_workers_resume_it(tmp_path):
    code, out = run_launch(["-n", "2", "--server-optimizer", "sum",
                            "--checkpoint-dir", str(tmp_path / "ckpt"),
                            "--checkpoint-interval", "1",
                            os.path.join(HERE, "restart_server_worker.py")], timeout=600)
    assert code == 0, out
    assert "KILLED the server" in out, out
    assert "restarting it from its checkpoint" in out, out
    assert out.count("STEPS 90") == 2, out


def test_launch_adds_workers_to_a_running_job(tmp_path):
    """adaps.launch --max-workers starts an elastic job; adaps.launch --join adds workers to
    it: they start from the servers' current parameters and the steps count them."""
    address_file = str(tmp_path / "address")
    script = os.path.join(HERE, "elastic_worker.py")
    address, (code, out), (job_code, job_out) = launch_and_join(
        ["-n", "2", "--max-workers", "4", "--server-optimizer", "sum", script, "250",
         address_file], address_file, ["-n", "2", "--server-optimizer", "sum", script, "40"],
        timeout=600)
    assert code == 0, out
    assert job_code == 0, job_out
    assert "adaps.launch: scheduler at " + address in job_out, job_out
    joined = [l for l in out.splitlines() if "RANK" in l]
    assert len(joined) == 2, out
    for line in joined:
        rank = int(line.split("RANK ")[1].split()[0])
        assert rank >= 2, line
        # It started from the parameters the job had reached, not from zero.
        assert float(line.split("START ")[1].split()[0]) > 0, line
    originals = [l for l in job_out.splitlines() if "RANK" in l]
    assert len(originals) == 2, job_out
    for line in originals:
        assert "MOST 4.0" in line, line  # some step took all four workers' pushes
        assert "4" in line.split("LIVE ")[1], line


def test_launch_join_refuses_flags_of_the_jobs_own_launch():
    code, out = run_launch(["--join", "tcp://127.0.0.1:1", "-n", "1", "--servers", "2",
                            "--server-optimizer", "sum", "x.py"], timeout=600)
    assert code == 2 and "--servers belongs to the job's own launch" in out, out
    code, out = run_launch(["--join", "tcp://127.0.0.1:1", "-n", "1", "x.py"], timeout=600)
    assert code == 2 and "--join needs the job's --server-optimizer" in out, out


def test_launch_restarts_a_failed_worker_which_takes_its_rank_back(tmp_path):
    code, out = run_launch(["-n", "2", "--worker-restarts", "1", "--server-optimizer", "sum",
                            os.path.join(HERE, "fails_once_worker.py"),
                            str(tmp_path / "failed")], timeout=600)
    assert code == 0, out
    assert "FAILING on purpose" in out, out
    assert "starting it again, it rejoins with its rank" in out, out
    done = sorted(l.split("DONE ")[1] for l in out.splitlines() if "DONE rank" in l)
    assert len(done) == 2 and done[0].startswith("rank 0") and done[1].startswith("rank 1"), out
    # The restarted process had the failed one's identity, and got its rank back.
    failed_as = out.split("FAILING on purpose as ")[1].split()[0]
    assert done[1] == "rank 1 identity " + failed_as, out


_CURVE_WORKER = """
import os
import numpy as np
import adaps
w = adaps.worker_from_env(request_timeout=120)
v = np.zeros(4, np.float32)
w.declare("x", v, compression="dense")
w.push_pull("x", np.ones(4, np.float32), v).wait()
print("CURVE", os.path.basename(os.environ.get("ADAPS_CURVE_CLIENT_KEY", "none")), v.tolist(),
      flush=True)
w.stop()
"""


def test_launch_with_curve_runs_the_job_encrypted(tmp_path):
    # --curve DIR (deploy/curve-keys.sh's layout): the scheduler and servers serve with
    # DIR's keys and the workers connect with theirs; a CURVE client cannot talk to a
    # plaintext server, so the workers' steps completing means every link was encrypted.
    keys = tmp_path / "keys"
    keygen = os.path.join(os.path.dirname(os.path.abspath(SCHEDULER_BIN)), "adaps-keygen")
    env = dict(os.environ, ADAPS_KEYGEN=keygen)
    subprocess.run(["bash", os.path.join(REPO, "deploy", "curve-keys.sh"), str(keys)],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    script = tmp_path / "curve_worker.py"
    script.write_text(_CURVE_WORKER)
    code, out = run_launch(["-n", "2", "--curve", str(keys), "--server-optimizer", "mean",
                            str(script)], timeout=600)
    assert code == 0, out
    assert out.count("CURVE client.key [1.0, 1.0, 1.0, 1.0]") == 2, out
    os.remove(keys / "allowed_clients")
    code, out = run_launch(["-n", "2", "--curve", str(keys), str(script)], timeout=600)
    assert code == 2 and "no allowed_clients there" in out, out
