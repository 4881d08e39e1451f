"""Run by test_torch.py under adaps.launch (2 workers, dense compression).

Every worker trains a small model (conv, LSTM, linear) through DistributedOptimizer and a
replica on its own with plain SGD on the mean of the gradients that torch computes for
every rank's batch (all batches are reproducible from the seed). After each step:
  local mode:  p.grad (the servers' mean) == mean of torch's gradients (None where no
               rank's backward reached the parameter, as DDP leaves it)
  both modes:  the distributed parameters == the replica's parameters
Exit 0 and "DENSE CHECK OK" on success, exit 1 with the worst difference otherwise."""
import copy
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import adaps
import adaps.torch

STEPS, LR = 4, 0.1


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.lstm = nn.LSTM(4, 6, batch_first=True)
        self.fc = nn.Linear(6, 3)
        self.unused = nn.Linear(2, 2)  # never gets a gradient: pushed as zeros, grad None

    def forward(self, x):
        h = F.relu(self.conv(x))                 # (B, 4, 6, 6)
        seq = h.mean(2).transpose(1, 2)          # (B, 6, 4)
        out, _ = self.lstm(seq)
        return self.fc(out[:, -1])


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 1, 8, 8, generator=g), torch.randint(0, 3, (8,), generator=g)


def grads(model, x, y):
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    return {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
            for n, p in model.named_parameters()}


def main():
    mode = sys.argv[1]
    torch.manual_seed(7)
    worker = adaps.worker_from_env(request_timeout=20)
    rank, size = worker.rank, worker.num_workers
    model = Net()
    opt = adaps.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                           model, worker, mode=mode, compression="dense")
    replica = copy.deepcopy(model)  # rank 0's initial values, as declared
    worst = 0.0
    for step in range(STEPS):
        per_rank = [grads(replica, *batch(r, step)) for r in range(size)]
        mean = {n: sum(g[n] for g in per_rank) / size for n in per_rank[0]}
        x, y = batch(rank, step)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.synchronize()
        if mode == "local":
            for n, p in model.named_parameters():
                if n.startswith("unused."):
                    if p.grad is not None:
                        print("step %d %s: unused parameter got a gradient" % (step, n))
                        sys.exit(1)
                    continue
                d = (p.grad - mean[n]).abs().max().item()
                worst = max(worst, d)
                if not torch.allclose(p.grad, mean[n], rtol=1e-4, atol=1e-6):
                    print("step %d %s: aggregated gradient differs from the mean of torch's "
                          "gradients by %g" % (step, n, d))
                    sys.exit(1)
        opt.step()
        with torch.no_grad():
            for n, p in replica.named_parameters():
                p -= LR * mean[n]
        for (n, p), q in zip(model.named_parameters(), replica.parameters()):
            d = (p - q).abs().max().item()
            worst = max(worst, d)
            if not torch.allclose(p, q, rtol=1e-4, atol=1e-5):
                print("step %d %s: parameters differ from the replica's by %g" % (step, n, d))
                sys.exit(1)
    print("DENSE CHECK OK rank %d mode %s worst difference %.3g" % (rank, mode, worst))
    worker.stop()


if __name__ == "__main__":
    main()
