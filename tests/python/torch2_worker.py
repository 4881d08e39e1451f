"""One rank of test_torch2.py, run under adaps.launch: a small classifier trained a few
steps with one torch 2.x feature, in local mode. Writes <out>/rank<r>.json with the losses,
the parameters, and the warnings torch or adaps gave.

    torch2_worker.py FEATURE OUT     FEATURE: eager, compile, foreach, fused, amp
"""
import json
import os
import sys
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

import adaps
import adaps.torch

feature, out = sys.argv[1], sys.argv[2]
warnings.simplefilter("always")
caught = []
warnings.showwarning = lambda message, *rest: caught.append(str(message))

worker = adaps.worker_from_env()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
trained = torch.compile(model) if feature == "compile" else model
kwargs = {"foreach": True} if feature == "foreach" else \
    {"fused": True} if feature == "fused" else {"foreach": False}
inner = torch.optim.AdamW(model.parameters(), lr=0.02, **kwargs)
# The compiled module is what the trainer holds; its parameter names gain "_orig_mod.".
opt = adaps.torch.DistributedOptimizer(inner, trained, worker)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
scaler = torch.amp.GradScaler("cpu") if feature == "amp" else None

gen = torch.Generator().manual_seed(1000 + worker.rank)  # each rank its own batches
teacher = torch.Generator().manual_seed(7)
w_true = torch.randn(16, 4, generator=teacher)
losses = []
for step in range(int(os.environ.get("TORCH2_STEPS", "30"))):
    x = torch.randn(32, 16, generator=gen)
    y = (x @ w_true).argmax(1)
    opt.zero_grad(set_to_none=True)
    if scaler is not None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(trained(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    else:
        loss = F.cross_entropy(trained(x), y)
        loss.backward()
        opt.step()
    sched.step()
    losses.append(float(loss))

with open(os.path.join(out, "rank%d.json" % worker.rank), "w") as f:
    json.dump(dict(losses=losses, names=opt.trained_names(),
                   params=[p.detach().flatten().tolist() for p in model.parameters()],
                   compression=str(opt.compression), exchange=opt.exchange,
                   warnings=caught), f)
worker.stop()
