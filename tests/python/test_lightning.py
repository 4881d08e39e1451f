"""adaps.lightning.AdapsStrategy: Lightning jobs through adaps.launch on a real local cluster
(lightning_worker.py), its collectives on 2 ranks in threads, and the errors it raises
for what it cannot do. Skipped where Lightning is not installed (Debian's python3)."""
import hashlib
import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("lightning")

import lightning as L  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from adaps.lightning import AdapsStrategy  # noqa: E402
from conftest import run_launch  # noqa: E402
from torch_ranks import run_ranks  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "lightning_worker.py")
TRAIN = 4000
# test_acc of the 2-worker AdaComp job: 0.821 where one Lightning process on the same
# samples and global batch reached 0.8115 (docs/lightning.md).
MIN_ACC = 0.75


def launch(out, *args, timeout=900):
    rc, log = run_launch(["-n", "2", "--server-optimizer", "mean", "--python", sys.executable,
                          SCRIPT, "--out", str(out), "--train", str(TRAIN)] + list(args),
                         timeout)
    assert rc == 0, log[-6000:]
    ranks = [json.load(open(os.path.join(out, "rank%d.json" % r))) for r in (0, 1)]
    return ranks, log


def sha_of_state(state):
    digest = hashlib.sha256()
    for _, p in sorted(state.items()):
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def test_two_workers_train_like_one_process(tmp_path):
    out = tmp_path / "adaps"
    (r0, r1), log = launch(out, "--strategy-kwargs", json.dumps({"own_updates": "off"}))
    assert [r0["rank"], r1["rank"], r0["world"], r1["world"]] == [0, 1, 2, 2]
    # Each epoch every worker trained on its own half of the samples (DistributedSampler).
    assert len(r0["seen"]) == len(r1["seen"]) == 3
    for a, b in zip(r0["seen"], r1["seen"]):
        assert len(a) == len(b) == TRAIN // 2
        assert not set(a) & set(b)
        assert set(a) | set(b) == set(range(TRAIN))
    # One step per batch, the StepLR schedule stepped every epoch.
    assert r0["global_step"] == r1["global_step"] == 3 * (TRAIN // 2 // 64 + 1)
    assert r0["lrs"] == r1["lrs"] == pytest.approx([2e-3, 1e-3, 5e-4])
    # The replicas end identical (own_updates="off"), and the checkpoint holds them.
    assert r0["sha256"] == r1["sha256"]
    # self.log(sync_dist=True): the workers' mean, the same on both.
    assert r0["val_acc_synced"] == r1["val_acc_synced"]
    assert r0["val_acc_own"] != r1["val_acc_own"]
    assert r0["val_acc_synced"] == pytest.approx((r0["val_acc_own"] + r1["val_acc_own"]) / 2,
                                                 abs=1e-6)
    # Only rank 0 wrote checkpoints, and last.ckpt is the trained model.
    assert (out / "saved-rank0.txt").exists() and not (out / "saved-rank1.txt").exists()
    last = torch.load(out / "ckpt" / "last.ckpt", map_location="cpu", weights_only=False)
    assert sha_of_state(last["state_dict"]) == r0["sha256"]
    assert "adaps" in last["optimizer_states"][0]
    # Accuracy: well above chance (0.1), and near one process on the same samples.
    single = tmp_path / "single"
    p = subprocess.run([sys.executable, SCRIPT, "--single", "--out", str(single),
                        "--train", str(TRAIN)], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=600)
    assert p.returncode == 0, p.stdout.decode()[-4000:]
    base = json.load(open(single / "rank0.json"))
    print("adaps test_acc %.4f, one process %.4f" % (r0["test_acc"], base["test_acc"]))
    assert r0["test_acc"] == r1["test_acc"]
    assert r0["test_acc"] >= MIN_ACC
    assert r0["test_acc"] >= base["test_acc"] - 0.03


def test_gradient_exchange_accumulates_and_clips_the_mean_gradient(tmp_path):
    (r0, r1), _ = launch(tmp_path, "--accumulate", "2", "--clip", "1.0",
                         "--strategy-kwargs", json.dumps({"compression": "dense"}))
    steps = 3 * ((TRAIN // 2 // 64 + 1) // 2)
    assert r0["global_step"] == r1["global_step"] == steps
    # At every clipping the gradient was the workers' mean (checked in the script).
    assert r0["mean_grad_checks"] == r1["mean_grad_checks"] == steps
    assert r0["sha256"] == r1["sha256"]
    assert r0["test_acc"] >= MIN_ACC - 0.05


def test_manual_optimization_with_one_optimizer(tmp_path):
    (r0, r1), _ = launch(tmp_path, "--manual",
                         "--strategy-kwargs", json.dumps({"own_updates": "off"}))
    assert r0["global_step"] == r1["global_step"] == 3 * (TRAIN // 2 // 64 + 1)
    assert r0["lrs"] == r1["lrs"] == pytest.approx([2e-3, 1e-3, 5e-4])
    assert r0["sha256"] == r1["sha256"]
    assert r0["test_acc"] >= MIN_ACC


def test_local_steps_end_and_validate_on_one_model(tmp_path):
    # local_steps=5 over 96 steps (3 epochs of 32), validated after epoch 2 only (step 64):
    # neither is a multiple of 5, and DDP's replicas are the same at both. The strategy
    # exchanges the steps since the last exchange before validating (every rank validates
    # the same model) and when training ends (every rank keeps the same model).
    kwargs = {"own_updates": "off", "local_steps": 5}
    (r0, r1), _ = launch(tmp_path, "--check-val-every", "2",
                         "--strategy-kwargs", json.dumps(kwargs))
    assert r0["global_step"] == r1["global_step"] == 3 * (TRAIN // 2 // 64 + 1)
    assert len(r0["val_shas"]) == 1 and r0["val_shas"] == r1["val_shas"]
    assert r0["sha256"] == r1["sha256"]
    assert r0["test_acc"] == r1["test_acc"] >= MIN_ACC - 0.05


# -- the collectives, 2 ranks in threads ------------------------------------------------
def test_reduce_all_gather_broadcast_on_two_ranks(cluster):
    address = cluster(2, server_args=["--optimizer=mean"]).address

    def rank(w):
        s = AdapsStrategy(worker=w)
        r = w.rank
        out = {
            "mean": s.reduce(torch.tensor([1.0, 2.0]) * (r + 1)),
            "sum": s.reduce(torch.tensor(3.0 + r), reduce_op="sum"),
            "max": s.reduce(torch.tensor([1.0 + r, 5.0 - r]), reduce_op="max"),
            "min": s.reduce(torch.tensor([1.0 + r, 5.0 - r]), reduce_op="min"),
            "int_sum": s.reduce(torch.tensor([7, 1 << 20]) * (r + 1), reduce_op="sum"),
            "all": s.reduce_boolean_decision(r == 0, all=True),
            "any": s.reduce_boolean_decision(r == 0, all=False),
            "both": s.reduce_boolean_decision(True, all=True),
            "gather64": s.all_gather(torch.tensor([0.1, -1e300]) * (r + 1)),
            "gather_int": s.all_gather(torch.tensor([[r, -3]], dtype=torch.int64)),
            "bcast": s.broadcast({"r": r, "path": pathlib.Path("/x/%d" % r)}),
        }
        s.barrier()
        return out
    r0, r1 = run_ranks(address, 2, rank)
    for res in (r0, r1):
        assert torch.equal(res["mean"], torch.tensor([1.5, 3.0]))
        assert res["sum"].item() == 7.0
        assert torch.equal(res["max"], torch.tensor([2.0, 5.0]))
        assert torch.equal(res["min"], torch.tensor([1.0, 4.0]))
        assert res["int_sum"].dtype == torch.int64
        assert res["int_sum"].tolist() == [21, 3 << 20]
        assert (res["all"], res["any"], res["both"]) == (False, True, True)
        assert torch.equal(res["gather64"], torch.stack(
            [torch.tensor([0.1, -1e300]), torch.tensor([0.1, -1e300]) * 2]))
        assert res["gather_int"].tolist() == [[[0, -3]], [[1, -3]]]
        assert res["bcast"] == {"r": 0, "path": pathlib.Path("/x/0")}


# -- what it cannot do: errors at setup, no cluster needed -------------------------------
class FakeWorker:
    rank, num_workers = 0, 1

    def __init__(self, server_optimizer="mean"):
        self.server_optimizer = server_optimizer

    def barrier(self):
        pass


class Tiny(L.LightningModule):
    def __init__(self, optimizers=1):
        super().__init__()
        self.a, self.b = nn.Linear(2, 1), nn.Linear(2, 1)
        self.n = optimizers
        self.automatic_optimization = optimizers == 1

    def training_step(self, batch, batch_idx):
        loss = (self.a(batch[0]) + self.b(batch[0])).sum()
        if not self.automatic_optimization:
            self.manual_backward(loss)
            for opt in self.optimizers():
                opt.step()
        return loss

    def configure_optimizers(self):
        if self.n == 1:
            return torch.optim.SGD(self.parameters(), lr=0.1)
        return [torch.optim.SGD(self.a.parameters(), lr=0.1),
                torch.optim.SGD(self.b.parameters(), lr=0.1)]


def fit(strategy, model=None, **trainer_kwargs):
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 2)),
                                       batch_size=2)
    trainer = L.Trainer(strategy=strategy, accelerator="cpu", max_steps=1, logger=False,
                        enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False, **trainer_kwargs)
    trainer.fit(model or Tiny(), data)


def test_servers_that_run_an_optimizer_are_refused():
    with pytest.raises(ValueError, match="--optimizer=sgd.*--server-optimizer mean"):
        fit(AdapsStrategy(worker=FakeWorker("sgd")))


def test_several_optimizers_are_refused():
    with pytest.raises(ValueError, match="returned 2 optimizers.*one optimizer"):
        fit(AdapsStrategy(worker=FakeWorker()), Tiny(optimizers=2))


def test_several_devices_per_process_are_refused():
    with pytest.raises(ValueError, match="devices=2.*adaps.launch -n N"):
        fit(AdapsStrategy(worker=FakeWorker()), devices=2)


def test_an_accelerator_other_than_the_cpu_is_refused():
    from lightning.pytorch.accelerators import CUDAAccelerator
    s = AdapsStrategy(worker=FakeWorker())
    s.accelerator = CUDAAccelerator()
    with pytest.raises(ValueError, match="only the CPU accelerator.*accelerator=\"cpu\""):
        s.setup_environment()


def test_arguments_and_collectives_it_cannot_take():
    with pytest.raises(ValueError, match="accumulate_grad_batches"):
        AdapsStrategy(backward_passes_per_step=2)
    with pytest.raises(TypeError, match="unknown argument.*bin_sise"):
        AdapsStrategy(bin_sise=100)
    s = AdapsStrategy(worker=FakeWorker(), compression="dense", bin_size=100)
    with pytest.raises(ValueError, match="only src=0"):
        s.broadcast("x", src=1)
    with pytest.raises(ValueError, match="sync_grads"):
        s.all_gather(torch.ones(1), sync_grads=True)
    with pytest.raises(ValueError, match="not supported"):
        s.reduce(torch.ones(1), reduce_op="prod")


def test_importing_without_lightning_names_pip_install():
    code = ("import sys; sys.modules['lightning'] = None\n"
            "try:\n    import adaps.lightning\nexcept ImportError as e:\n    print(e)\n")
    p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=120)
    assert "pip install lightning" in p.stdout.decode(), p.stdout.decode()
