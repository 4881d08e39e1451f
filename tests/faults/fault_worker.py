"""One worker of tests/faults/netns_faults.py (run by it; needs numpy and PYTHONPATH=build/python).

Pushes known dense gradients to sum-only servers: at step j the gradient of each of --tensors
tensors (t0, t1, ...; each one slice, the scheduler spreads them over the servers) is 1 at
elements j and STEPS + j and 0 elsewhere, so element j (and STEPS + j) of the servers'
parameters counts the pushes of step j that were applied. A step is acknowledged once the
push_pull of every tensor succeeded. Writes one JSON line per event to --out: the layout,
every acknowledged step, its last pulled values (the replica), the servers' exact parameters
after the last step, or the error that stopped it.
"""
import argparse
import json
import sys
import time

import numpy as np

import adaps


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--scheduler", required=True)
    p.add_argument("--identity", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--tensors", type=int, default=4)
    p.add_argument("--step_sleep", type=float, default=0.05)
    p.add_argument("--request_timeout", type=float, default=30.0)
    p.add_argument("--register_timeout", type=float, default=120.0)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    out = open(a.out, "a", buffering=1)

    def note(**kw):
        kw["t"] = time.time()
        out.write(json.dumps(kw) + "\n")

    n = a.steps
    j = -1
    try:
        w = adaps.Worker(a.scheduler, identity=a.identity, register_timeout=a.register_timeout,
                         request_timeout=a.request_timeout, log_level="info")
        names = [f"t{k}" for k in range(a.tensors)]
        owners = {}
        for name in names:
            values = np.zeros(2 * n, dtype=np.float32)
            w.declare(name, values, compression="dense", pull="dense", fuse=False)
            sl = w.slices(name)
            owners[name] = sl[0]["server"] if len(sl) == 1 else [x["server"] for x in sl]
        note(event="declared", rank=w.rank, owners=owners)
        grad = np.zeros(2 * n, dtype=np.float32)
        res = {name: np.zeros(2 * n, dtype=np.float32) for name in names}
        for j in range(n):
            grad[:] = 0
            grad[j] = 1
            grad[n + j] = 1
            handles = [w.push_pull(name, grad, res[name]) for name in names]
            for h in handles:
                h.wait()
            note(event="ack", step=j)
            if a.step_sleep > 0:
                time.sleep(a.step_sleep)
        j = n  # every step acknowledged
        note(event="replica", values=np.concatenate([res[x] for x in names]).tolist())
        params = np.zeros(2 * n, dtype=np.float32)
        allp = []
        for name in names:
            w.pull_parameters(name, params)
            allp.append(params.copy())
        note(event="params", values=np.concatenate(allp).tolist())
        w.stop()
        note(event="done")
        return 0
    except adaps.Error as e:
        # The push of step j may have been applied without its acknowledgement.
        note(event="error", step=j, code=e.code_name, message=str(e))
        print(f"fault_worker {a.identity}: {e.code_name}: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
