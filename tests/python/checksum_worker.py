"""A small training script for the multi-node launch tests: started by adaps.launch (any
number of nodes), or by the test itself the way torchrun starts it (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, LOCAL_RANK; no ADAPS_SCHEDULER).

Trains a two-layer model with torch.optim.SGD through adaps.torch (local mode, AdaComp) for
a few steps, each rank on its own batches, then prints

    CHECKSUM rank R of W launcher-rank L sha256 HEX

HEX is the SHA-256 of the parameters' bytes: in local mode with SGD every replica applies
the same pulled updates, so every rank prints the same one. Exit 0 on success.

With the argument "fail-on-node-1", the first worker adaps.launch starts on node 1 exits
with 3 once registered, and every other worker waits at barriers (for at most 10 minutes)
until the job fails under it: exit 1 and "JOB FAILED UNDER ME" then."""
import hashlib
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import adaps
import adaps.torch

STEPS = 6


def fail_on_node_1(worker):
    if os.environ.get("ADAPS_NODE_RANK") == "1" and os.environ.get("ADAPS_LOCAL_RANK") == "0":
        print("FAILING on purpose", flush=True)
        sys.exit(3)
    end = time.monotonic() + 600
    try:
        while time.monotonic() < end:
            worker.barrier()
            time.sleep(0.2)
    except adaps.Error as e:
        print("JOB FAILED UNDER ME: %s" % e, flush=True)
        sys.exit(1)
    sys.exit(0)


def main():
    torch.manual_seed(1)
    torch.set_num_threads(1)
    worker = adaps.worker_from_env()
    if sys.argv[1:] == ["fail-on-node-1"]:
        fail_on_node_1(worker)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = adaps.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                           model, worker)
    g = torch.Generator().manual_seed(100 + worker.rank)
    for _ in range(STEPS):
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 4, (16,), generator=g)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().contiguous().numpy().tobytes())
    launcher_rank = os.environ.get("RANK", os.environ.get("ADAPS_LOCAL_RANK", "?"))
    print("CHECKSUM rank %d of %d launcher-rank %s sha256 %s"
          % (worker.rank, worker.num_workers, launcher_rank, digest.hexdigest()))
    sys.stdout.flush()
    worker.stop()


if __name__ == "__main__":
    main()
