"""Run by test_torch.py under adaps.launch --checkpoint-dir: rank 0 kills the job's server
(SIGKILL) mid-training; adaps.launch restarts it from its checkpoint and both workers must
finish every step. The server sums (--server-optimizer sum) dense all-ones gradients, so each
step adds exactly 2: the parameters may fall back once (to the restored checkpoint) and must
otherwise grow by 2 per step (nothing lost or doubled after the checkpoint)."""
import os
import signal
import sys
import time

import numpy as np

import adaps


def job_servers():
    """Pids of the adaps-server processes of this job (their --scheduler is ours)."""
    want = ("--scheduler=" + os.environ["ADAPS_SCHEDULER"]).encode()
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"adaps-server") and want in argv:
            pids.append(int(pid))
    return pids


worker = adaps.worker_from_env()
n = 1000
params = np.zeros(n, np.float32)
worker.declare("x", params, compression="dense")
ones = np.ones(n, np.float32)
seen = []
for step in range(90):
    if worker.rank == 0 and step == 60:
        for pid in job_servers():
            os.kill(pid, signal.SIGKILL)
        print("KILLED the server at step", step, flush=True)
    worker.push_pull("x", ones, params).wait()
    assert (params == params[0]).all()
    seen.append(float(params[0]))
    time.sleep(0.04)
falls = [i for i in range(1, len(seen)) if seen[i] != seen[i - 1] + 2]
print("STEPS", len(seen), "falls", falls, "last", seen[-1], flush=True)
if seen[0] != 2 or len(falls) > 1 or any(seen[i] % 2 or seen[i] <= 0 for i in falls):
    sys.exit("steps lost or doubled: %s" % seen)
worker.stop()
