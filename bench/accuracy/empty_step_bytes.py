#!/usr/bin/python3
"""The fixed cost of a step's messages for one zoo model: the wire bytes a worker pushes and
pulls in a step whose every update is zero (learning rate 0), on a real local cluster with
the defaults (local mode, AdaComp), 4 workers.

    PYTHONPATH=build/python /usr/bin/python3 bench/accuracy/empty_step_bytes.py --model lstm

Prints each of the first steps' (pushed, pulled) bytes on rank 0: headers, envelopes and
empty encodings only. Compare with a run's bytes (the zoo's JSON `traffic`)."""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))
import torch  # noqa: E402

import adaps.torch  # noqa: E402
import zoo_models  # noqa: E402
from conftest import Cluster  # noqa: E402  (real adaps-scheduler and adaps-server, OS ports)
from torch_ranks import run_ranks  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="lstm", choices=zoo_models.MODELS)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()

    def rank(w):
        torch.manual_seed(1)
        task = zoo_models.make_task(a.model, w.rank, a.workers, 1, 300)
        opt = adaps.torch.DistributedOptimizer(task.optimizer, task.model, w,
                                               server_optimizer="mean")
        out = []
        for step in range(a.steps):
            before = {k: dict(v) for k, v in opt.traffic().items()}
            for g in opt.param_groups:
                g["lr"] = 0.0  # a zero update: every push and pull carries no element
            opt.zero_grad()
            x, y = task.batch(step)
            task.loss(task.model(x), y).backward()
            opt.step()
            t = opt.traffic()
            out.append((sum(t[k]["push_wire"] - before[k]["push_wire"] for k in t),
                        sum(t[k]["pull_wire"] - before[k]["pull_wire"] for k in t)))
        return out
    c = Cluster(a.workers, server_args=["--optimizer=mean"])
    try:
        for step, (push, pull) in enumerate(run_ranks(c.address, a.workers, rank, 300)[0]):
            print("step %d: %d bytes pushed, %d pulled (rank 0)" % (step + 1, push, pull))
    finally:
        c.stop()


if __name__ == "__main__":
    main()
