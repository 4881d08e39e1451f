"""Run by test_torch.py under adaps.launch --worker-restarts 1: rank 1 exits with an error
mid-run the first time (argv[1]: a marker file that says it did); the launcher starts it
again, it takes its rank back (its ADAPS_IDENTITY) and both finish every step."""
import os
import sys
import time

import numpy as np

import adaps

marker = sys.argv[1]
worker = adaps.worker_from_env()
params = np.zeros(50, np.float32)
worker.declare("x", params, compression="dense")
for step in range(60):
    if worker.rank == 1 and step == 15 and not os.path.exists(marker):
        open(marker, "w").close()
        print("FAILING on purpose as", os.environ.get("ADAPS_IDENTITY", ""), flush=True)
        os._exit(3)
    worker.push_pull("x", np.ones(50, np.float32), params).wait()
    time.sleep(0.02)
print("DONE rank", worker.rank, "identity", os.environ.get("ADAPS_IDENTITY", ""), flush=True)
worker.stop()
