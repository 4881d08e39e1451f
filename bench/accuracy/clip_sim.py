#!/usr/bin/python3
"""Where gradient clipping happens, in an in-process simulation of 4 workers on a zoo model
(docs/accuracy.md, the encoder's section): nothing compressed, so only the clipping differs.

  /usr/bin/python3 bench/accuracy/clip_sim.py --model encoder --mode ddp|local|global --seed 1

  ddp     DDP's arithmetic: the workers' mean gradient, clipped, one optimizer step
  local   the update exchange (adaps.torch's local mode): each worker clips its own gradient
          and steps its own optimizer (with adaps.torch_moments' global second moment), every
          replica adds the mean of the workers' changes
  global  the same, but every worker's gradient scaled by DDP's clipping factor for the mean
          gradient (an oracle: adaps cannot know the mean gradient's norm before the step)

Prints the metric every 50 steps and how often clipping bit. Needs the built Python package
(bash deploy/build.sh) for adaps.torch_moments.
"""
import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "build", "python"))
import zoo_models  # noqa: E402
from adaps import torch_moments  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="encoder", choices=zoo_models.MODELS)
    ap.add_argument("--mode", default="local", choices=("ddp", "local", "global"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--workers", type=int, default=4)
    a = ap.parse_args()
    w = a.workers
    tasks = [zoo_models.make_task(a.model, r, w, a.seed, a.steps) for r in range(w)]
    model, clip = tasks[0].model, tasks[0].clip
    if not clip:
        ap.error("%s's recipe does not clip" % a.model)
    params = [p for p in model.parameters() if p.requires_grad]

    def optimizer_over_model(task):
        # The task's optimizer (its class and groups) over the shared model's parameters.
        own = {id(q): i for i, q in enumerate(q for q in task.model.parameters()
                                              if q.requires_grad)}
        groups = [dict({k: v for k, v in g.items() if k != "params"},
                       params=[params[own[id(p)]] for p in g["params"]])
                  for g in task.optimizer.param_groups]
        return type(task.optimizer)(groups)
    opts = [optimizer_over_model(t) for t in (tasks[:1] if a.mode == "ddp" else tasks)]
    moments = [dict() for _ in opts]
    clipped_local = clipped_global = 0
    curve = []
    for step in range(a.steps):
        for o in opts:
            for g in o.param_groups:
                g["lr"] = tasks[0].lr_at(step)
        grads = []
        for t in tasks:
            x, y = t.batch(step)
            model.zero_grad()
            t.loss(model(x), y).backward()
            grads.append([p.grad.detach().clone() if p.grad is not None
                          else torch.zeros_like(p) for p in params])
        mean = [sum(g[i] for g in grads) / w for i in range(len(params))]
        norm = torch.norm(torch.stack([g.norm() for g in mean])).item()
        clipped_global += norm > clip
        if a.mode == "ddp":
            for p, g in zip(params, mean):
                p.grad = g
            torch.nn.utils.clip_grad_norm_(params, clip)
            opts[0].step()
        else:
            with torch.no_grad():
                start = [p.detach().clone() for p in params]
                change = [torch.zeros_like(p) for p in params]
            for r in range(w):
                with torch.no_grad():
                    for p, s in zip(params, start):
                        p.copy_(s)
                for p, g in zip(params, grads[r]):
                    p.grad = g
                own = torch.nn.utils.clip_grad_norm_(params, clip if a.mode == "local"
                                                     else float("inf")).item()
                clipped_local += own > clip
                if a.mode == "global":
                    for p in params:
                        p.grad.mul_(min(1.0, clip / (norm + 1e-6)))
                restore = torch_moments.global_second_moment(opts[r], w, moments[r])
                opts[r].step()
                restore()
                with torch.no_grad():
                    for c, p, s in zip(change, params, start):
                        c.add_(p - s, alpha=1.0 / w)
            with torch.no_grad():
                for p, s, c in zip(params, start, change):
                    p.copy_(s + c)
        if (step + 1) % 50 == 0 or step + 1 == a.steps:
            curve.append((step + 1, tasks[0].evaluate()))
            print("step %d %s %.4f" % (step + 1, tasks[0].metric, curve[-1][1]), flush=True)
    local = "" if a.mode == "ddp" else ", each worker's own gradient on %.0f%% of worker-steps" \
        % (100.0 * clipped_local / (w * a.steps))
    print("FINAL %s %s seed %d %s %.4f; clipping at %g bit the mean gradient on %.0f%% of steps%s"
          % (a.model, a.mode, a.seed, tasks[0].metric, curve[-1][1], clip,
             100.0 * clipped_global / a.steps, local))


if __name__ == "__main__":
    main()
