#!/usr/bin/python3
"""One worker of an accuracy-zoo run (bench/accuracy/zoo.py starts it through adaps.launch).

Trains one model of bench/accuracy/zoo_models.py with adaps.torch.DistributedOptimizer at
the defaults a user gets (whatever adaps.launch exported: --compression dense for the
baseline, nothing for AdaComp), evaluates on rank 0 every --eval-every steps, and writes
rank 0's result as JSON to --out: the metric against steps, the final metric, bytes pushed
and pulled (wire and dense; the wire bytes so far after every step too), and the training time.
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo_models  # noqa: E402

import adaps  # noqa: E402
import adaps.blas  # noqa: E402
import adaps.torch  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True, choices=zoo_models.MODELS)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", required=True)
    ap.add_argument("--text", default=None,
                    help="train the language models on this UTF-8 file instead of the licences")
    ap.add_argument("--schedule", default="recipe", choices=zoo_models.SCHEDULES,
                    help="constant: the peak learning rate after the recipe's warm-up, "
                         "never decayed")
    ap.add_argument("--test-size", type=int, default=zoo_models.IMAGE_TEST_SIZE,
                    help="score the image models on the first this many test images")
    a = ap.parse_args()
    zoo_models.SCHEDULE = a.schedule
    zoo_models.IMAGE_TEST_SIZE = a.test_size
    if a.text:
        zoo_models.TEXT_FILES = [a.text]
    if "OMP_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

    # Rank 0 evaluates while the others wait in their next step: a long pause, not a fault.
    worker = adaps.worker_from_env(request_timeout=600)
    blas = adaps.blas.blas_info(measure=worker.rank == 0)
    if worker.rank == 0:
        adaps.blas.warn_if_reference(blas)
    task = zoo_models.make_task(a.model, worker.rank, worker.num_workers, a.seed, a.steps,
                                a.quick)
    opt = adaps.torch.DistributedOptimizer(task.optimizer, task.model, worker)
    curve = [(0, task.evaluate())] if worker.rank == 0 else []
    wire = []  # rank 0: (step, push wire bytes, pull wire bytes) so far, after every step
    start = time.time()
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = task.lr_at(step)
        x, y = task.batch(step)
        opt.zero_grad()
        task.loss(task.model(x), y).backward()
        if task.clip:
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(task.model.parameters(), task.clip)
        opt.step()
        if worker.rank == 0:  # where the bytes go: the first steps of Adam are near-dense
            t = opt.traffic().values()
            wire.append((step + 1, sum(d["push_wire"] for d in t), sum(d["pull_wire"] for d in t)))
        if worker.rank == 0 and ((step + 1) % a.eval_every == 0 or step + 1 == a.steps):
            curve.append((step + 1, task.evaluate()))
            print("step %d %s %.4f (%.1f s)" % (step + 1, task.metric, curve[-1][1],
                                                 time.time() - start), flush=True)
    seconds = time.time() - start
    traffic = opt.traffic()
    total = {k: sum(d[k] for d in traffic.values())
             for k in ("push_dense", "push_wire", "pull_dense", "pull_wire")}
    if worker.rank == 0:
        result = dict(model=a.model, seed=a.seed, steps=a.steps, metric=task.metric,
                      higher_is_better=task.higher_is_better, final=curve[-1][1],
                      curve=curve, seconds=seconds, mode=opt.mode, exchange=opt.exchange,
                      compression=opt.compression, pull=opt.pull,
                      second_moment=opt.second_moment, own_updates=opt.own_updates,
                      bin_schedule=opt.bin_schedule, traffic=total,
                      by_layer=traffic, workers=worker.num_workers, wire=wire, blas=blas)
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
        print("final %s %.4f  push %.1fx  pull %.1fx" % (
            task.metric, result["final"], total["push_dense"] / max(1, total["push_wire"]),
            total["pull_dense"] / max(1, total["pull_wire"])), flush=True)
    worker.stop()


if __name__ == "__main__":
    main()
