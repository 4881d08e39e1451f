"""Run by test_torch.py under adaps.launch: a job of 2 workers (--max-workers 4) that 2 more
join mid-run (adaps.launch --join). The servers sum (--server-optimizer sum) dense all-ones
gradients, so each step adds the number of workers that pushed it: 2 before the join, up to
4 while the joiners train, never more than the live workers, and nothing applied twice.

argv[1]: the number of steps; argv[2] (optional): a file where rank 0 writes the job's
scheduler address (for the test to start the joiners with)."""
import os
import sys
import time

import numpy as np

import adaps

steps = int(sys.argv[1])
worker = adaps.worker_from_env()
if len(sys.argv) > 2 and worker.rank == 0:
    with open(sys.argv[2] + ".tmp", "w") as f:
        f.write(os.environ["ADAPS_SCHEDULER"])
    os.replace(sys.argv[2] + ".tmp", sys.argv[2])
n = 100
params = np.zeros(n, np.float32)
worker.declare("x", params, compression="dense")
start = float(params[0])
ones = np.ones(n, np.float32)
most, seen_live = 0.0, set()
for step in range(steps):
    before = float(params[0])
    worker.push_pull("x", ones, params).wait()
    assert (params == params[0]).all()
    inc = float(params[0]) - before
    live = worker.live_workers
    seen_live.add(live)
    assert 1 <= inc <= 4, (step, inc)
    most = max(most, inc)
    time.sleep(0.03)
print("RANK", worker.rank, "START", start, "MOST", most, "LIVE", sorted(seen_live), flush=True)
worker.leave()
