"""Run by test_torch.py under adaps.launch: worker 1 starts SECONDS late (argv[1]), as a
worker importing a large framework on a busy machine does, then every worker registers."""
import os
import sys
import time

import adaps

if os.environ.get("ADAPS_LOCAL_RANK") == "1":
    time.sleep(float(sys.argv[1]))
w = adaps.worker_from_env()
print("REGISTERED rank %d" % w.rank, flush=True)
w.stop()
