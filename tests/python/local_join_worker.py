"""Run by test_torch_local_steps.py under adaps.launch (local mode: --server-optimizer mean
--pull recompressed): a job of 2 workers (--max-workers 3) that a third joins mid-run
(adaps.launch --join). Every worker trains the same linear regression with Adam on its own
batches; argv[1] is the number of steps, argv[2] (the job's workers only) where rank 0
writes the scheduler's address after 10 steps. The joiner leaves when done (what its
residue holds goes out). Each prints whether it joined, how far its model was from the
job's start when it began training (a joiner: where the others had taken it) and its loss
on a fixed batch at the start and the end."""
import os
import sys
import time
import warnings

import torch
import torch.nn as nn

import adaps.torch

steps = int(sys.argv[1])
torch.manual_seed(0)  # the job's start (rank 0's is everyone's anyway)
model = nn.Linear(64, 4)
start = [p.detach().clone() for p in model.parameters()]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    opt = adaps.torch.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01), model)
joined = any("joined a running local-mode job" in str(w.message) for w in caught)
worker = opt.worker
target = torch.randn(64, 4, generator=torch.Generator().manual_seed(7))
probe = torch.randn(256, 64, generator=torch.Generator().manual_seed(8))


def moved():
    return max(float((p.detach() - s).abs().max()) for p, s in zip(model.parameters(), start))


def loss(x):
    return ((model(x) - x @ target) ** 2).mean()


began, first_loss = moved(), float(loss(probe))
batches = torch.Generator().manual_seed(100 + worker.rank)
for step in range(steps):
    x = torch.randn(16, 64, generator=batches)
    opt.zero_grad()
    loss(x).backward()
    opt.step()
    if step == 10 and len(sys.argv) > 2 and worker.rank == 0:
        with open(sys.argv[2] + ".tmp", "w") as f:
            f.write(os.environ["ADAPS_SCHEDULER"])
        os.replace(sys.argv[2] + ".tmp", sys.argv[2])
    time.sleep(0.03)
print("RANK %d JOINED %s BEGAN %.6f LOSS %.4f -> %.4f" % (
    worker.rank, joined, began, first_loss, float(loss(probe))), flush=True)
if joined:
    worker.leave()
else:
    worker.stop()
