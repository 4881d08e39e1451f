# The push rate of the MLP's dense biases fused with fc3.weight, against unfused: a 1-server,
# 1-worker cluster through the Python module, 50 steps. Run from the repository root:
#   PYTHONPATH=build/python ADAPS_SCHEDULER_BIN=build/scheduler/adaps-scheduler \
#   ADAPS_SERVER_BIN=build/server/adaps-server /usr/bin/python3 bench/fusion/bias_rate.py
import os, sys
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "python"))
import conftest, adaps
for fused in (True, False):
    c = conftest.Cluster(1)
    w = adaps.Worker(c.address)
    specs = [("fc3.weight", 1280, "adacomp"), ("fc1.bias", 256, "dense"), ("fc2.bias", 128, "dense"), ("fc3.bias", 10, "dense")]
    bufs = {}
    for n, l, comp in specs:
        bufs[n] = np.zeros(l, dtype=np.float32)
        w.declare(n, bufs[n], compression=comp, fuse=fused)
    rng = np.random.default_rng(1)
    for step in range(50):
        hs = [w.push_pull(n, rng.normal(size=l).astype(np.float32) * 0.01, bufs[n]) for n, l, _ in specs]
        for h in hs: h.wait()
    wire = dense = 0
    for n, l, comp in specs:
        t = w.traffic(n)
        if "bias" in n:
            wire += t["push_wire_bytes"]; dense += t["push_dense_bytes"]
    print("fused" if fused else "unfused", "bias push wire", wire, "dense", dense, "rate %.3f" % (dense / wire))
    w.stop(); c.stop()
