"""A worker for test_progress.py: registers, then draws 20 steps of adaps.progress."""
import time

import adaps
import adaps.progress

w = adaps.worker_from_env()
p = adaps.progress.Progress(20, rank=w.rank, batch_size=8, min_interval=0.05)
for i in range(20):
    time.sleep(0.02)
    p.update(i + 1, loss=1.0 / (i + 1), compression=lambda: 42.0)
p.close()
print("done rank %d" % w.rank, flush=True)
w.stop()
