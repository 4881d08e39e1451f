"""Run by test_torch_local_steps.py under adaps.launch: a script that reads no environment
itself. Prints the local_steps and outer DistributedOptimizer took from the launcher, and
the steps after which this worker's pushes had sent bytes."""
import torch
import torch.nn as nn

import adaps.torch

model = nn.Linear(200, 5)
opt = adaps.torch.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01), model)
sent, last = [], 0
for step in range(6):
    opt.zero_grad()
    model(torch.randn(8, 200)).sum().backward()
    opt.step()
    wire = sum(d["push_wire"] for d in opt.traffic().values())
    if wire > last:
        sent.append(step + 1)
    last = wire
print("LOCAL local_steps=%s outer=%s sent_after=%s" % (opt.local_steps, opt.outer, sent))
opt.worker.stop()
