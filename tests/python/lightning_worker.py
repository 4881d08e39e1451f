"""A Lightning training script for test_lightning.py: started by adaps.launch (N workers,
Trainer(strategy=AdapsStrategy(...))), or with --single as one plain Lightning process (the
baseline: the same samples, the same global batch, the same number of steps).

Trains a small MLP on a Fashion-MNIST subset with AdamW and a StepLR schedule, logs
val_acc with sync_dist=True, keeps a ModelCheckpoint on it, then runs trainer.test(). Each
rank writes OUT/rank<R>.json: its rank and world size, the SHA-256 of its final
parameters and of those it validated each time, the training samples it saw in each epoch,
its own and the synchronized validation accuracy, the test accuracy, the learning rates per
epoch, the steps taken. A checkpoint_io plugin
records in OUT/saved-rank<R>.txt every checkpoint this rank wrote."""
import argparse
import gzip
import hashlib
import json
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins import TorchCheckpointIO

FMNIST = os.environ.get("ADAPS_FMNIST_DIR", "/usr/share/datasets/fashion-mnist")


def fashion_mnist(split, n):
    prefix = "train" if split == "train" else "t10k"
    with gzip.open(os.path.join(FMNIST, prefix + "-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)[:n]
    with gzip.open(os.path.join(FMNIST, prefix + "-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)[:n]
    x = (torch.from_numpy(x.astype(np.float32)) / 255.0 - 0.2860) / 0.3530
    idx = torch.arange(len(y))
    return torch.utils.data.TensorDataset(x, torch.from_numpy(y.astype(np.int64)), idx)


def param_sha(module):
    digest = hashlib.sha256()
    for _, p in sorted(module.state_dict().items()):
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


class MLP(L.LightningModule):
    def __init__(self, lr, check_mean_grads, manual=False):
        super().__init__()
        self.automatic_optimization = not manual
        self.net = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
        self.lr = lr
        self.check_mean_grads = check_mean_grads
        self.seen, self.lrs, self.mean_grad_checks, self.val_shas = [], [], 0, []
        self.val_correct = self.val_total = 0

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y, idx = batch
        self.seen[-1].extend(idx.tolist())
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_epoch=True, sync_dist=True)
        if not self.automatic_optimization:
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        return loss

    def on_train_epoch_end(self):
        if not self.automatic_optimization:
            self.lr_schedulers().step()

    def on_train_epoch_start(self):
        self.seen.append([])
        self.lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])

    def _acc(self, batch, name):
        x, y, _ = batch
        correct = (self(x).argmax(1) == y).sum()
        self.log(name, correct.float() / len(y), batch_size=len(y), sync_dist=True)
        return correct, len(y)

    def on_validation_epoch_start(self):
        self.val_correct = self.val_total = 0

    def validation_step(self, batch, batch_idx):
        if batch_idx == 0 and not self.trainer.sanity_checking:
            self.val_shas.append(param_sha(self))  # the model this rank validates
        c, n = self._acc(batch, "val_acc")
        self.val_correct += int(c)
        self.val_total += n

    def test_step(self, batch, batch_idx):
        self._acc(batch, "test_acc")

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None,
                                    gradient_clip_algorithm=None):
        if self.check_mean_grads:
            # The gradient exchange: at clipping time p.grad is the workers' mean, the same
            # on every rank (all_gather is exact).
            g = torch.cat([p.grad.reshape(-1) for p in self.parameters()])
            both = self.trainer.strategy.all_gather(g[:64].clone())
            assert torch.equal(both[0], both[-1]), "gradients differ at clipping time"
            self.mean_grad_checks += 1
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}


class RecordingIO(TorchCheckpointIO):
    def __init__(self, out):
        super().__init__()
        self.out, self.trainer = out, None

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        rank = self.trainer.global_rank
        with open(os.path.join(self.out, "saved-rank%d.txt" % rank), "a") as f:
            f.write(str(path) + "\n")
        super().save_checkpoint(checkpoint, path, storage_options)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--train", type=int, default=4000)
    ap.add_argument("--test", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64, help="per worker")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--accumulate", type=int, default=1)
    ap.add_argument("--clip", type=float, default=None)
    ap.add_argument("--manual", action="store_true", help="manual optimization")
    ap.add_argument("--single", action="store_true", help="one process, no adaps")
    ap.add_argument("--workers", type=int, default=2, help="with --single: the batch scale")
    ap.add_argument("--strategy-kwargs", default="{}", help="JSON, to AdapsStrategy")
    ap.add_argument("--check-val-every", type=int, default=1, help="epochs between validations")
    a = ap.parse_args()
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    os.makedirs(a.out, exist_ok=True)
    kwargs = json.loads(a.strategy_kwargs)
    if a.single:
        strategy, batch = "auto", a.batch * a.workers
    else:
        from adaps.lightning import AdapsStrategy
        strategy, batch = AdapsStrategy(**kwargs), a.batch
    model = MLP(a.lr, check_mean_grads=kwargs.get("compression") == "dense" and not a.single,
                manual=a.manual)
    train = torch.utils.data.DataLoader(fashion_mnist("train", a.train), batch_size=batch,
                                        shuffle=True)
    val = torch.utils.data.DataLoader(fashion_mnist("test", a.test), batch_size=500)
    ckpt = ModelCheckpoint(dirpath=os.path.join(a.out, "ckpt"), monitor="val_acc",
                           mode="max", save_last=True)
    io = RecordingIO(a.out)
    trainer = L.Trainer(strategy=strategy, accelerator="cpu", devices=1, max_epochs=a.epochs,
                        accumulate_grad_batches=a.accumulate, gradient_clip_val=a.clip,
                        check_val_every_n_epoch=a.check_val_every,
                        callbacks=[ckpt], plugins=[io], logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=a.out)
    io.trainer = trainer
    trainer.fit(model, train, val)
    rank = trainer.global_rank
    sha = param_sha(model)
    val_synced = float(trainer.callback_metrics["val_acc"])
    val_own = model.val_correct / max(1, model.val_total)
    test = trainer.test(model, val, verbose=False)[0]["test_acc"]
    record = {"rank": rank, "world": trainer.world_size, "sha256": sha,
              "seen": [sorted(e) for e in model.seen],
              "val_acc_synced": val_synced, "val_acc_own": val_own, "test_acc": float(test),
              "lrs": model.lrs, "global_step": trainer.global_step,
              "mean_grad_checks": model.mean_grad_checks, "val_shas": model.val_shas,
              "best_model_path": ckpt.best_model_path, "last_model_path": ckpt.last_model_path}
    with open(os.path.join(a.out, "rank%d.json" % rank), "w") as f:
        json.dump(record, f)
    print("RESULT rank %d test_acc %.4f val_acc %.4f steps %d sha %s"
          % (rank, test, val_synced, trainer.global_step, sha[:12]), flush=True)


if __name__ == "__main__":
    main()
