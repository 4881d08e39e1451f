"""Run by test_torch.py under adaps.launch: rank 1 fails, rank 0 would wait forever."""
import sys
import time

import adaps

worker = adaps.worker_from_env()
if worker.rank == 1:
    sys.exit(3)
time.sleep(120)
