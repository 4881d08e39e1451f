"""Run by test_torch.py under adaps.launch: a script that reads no environment itself.
Prints what DistributedOptimizer took from the launcher's flags and what one step pushed.
With the argument "adamw" it trains with torch.optim.AdamW instead of SGD."""
import sys

import torch
import torch.nn as nn

import adaps.torch

model = nn.Linear(200, 5)
inner = torch.optim.AdamW(model.parameters(), lr=0.01) if sys.argv[1:] == ["adamw"] else \
    torch.optim.SGD(model.parameters(), lr=0.01)
opt = adaps.torch.DistributedOptimizer(inner, model)
opt.zero_grad()
model(torch.randn(8, 200)).sum().backward()
opt.step()
t = opt.traffic()["linear"]
print("FLAGS mode=%s compression=%s pull=%s lr=%g dense_push=%d servers=%d moment=%s own=%s" % (
    opt.mode, opt.compression, opt.pull, opt.param_groups[0]["lr"],
    int(t["push_wire"] >= t["push_dense"]), opt.worker.num_servers, opt.second_moment,
    opt.own_updates))
opt.worker.stop()
