"""adaps.torch under torch 2.x (the package index's torch, in the virtual environment of
deploy/install-python-env.sh): torch.compile'd models, foreach and fused optimizers, LR
schedulers' step-order check, torch.amp's GradScaler, state_dict hooks. Skipped under
Debian's torch 1.13, which has none of them."""
import json
import os
import warnings

import pytest
import torch
import torch.nn as nn

if int(torch.__version__.split(".")[0]) < 2:
    pytest.skip("torch %s: these are torch 2.x features" % torch.__version__,
                allow_module_level=True)

import adaps.torch  # noqa: E402
from conftest import run_launch  # noqa: E402
from torch_ranks import run_ranks  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def launch(feature, tmp_path, *flags):
    out = tmp_path / feature
    out.mkdir()
    code, log = run_launch(["-n", "2", "--server-optimizer", "mean"] + list(flags) +
                           [os.path.join(HERE, "torch2_worker.py"), feature, str(out)],
                           timeout=900)
    assert code == 0, log
    ranks = [json.loads((out / ("rank%d.json" % r)).read_text()) for r in range(2)]
    for r in ranks:
        order = [w for w in r["warnings"] if "lr_scheduler.step()" in w or "GradScaler" in w]
        assert not order, order
    return ranks


def close(a, b, atol):
    return all(torch.allclose(torch.tensor(x), torch.tensor(y), atol=atol)
               for x, y in zip(a["params"], b["params"]))


def test_a_compiled_model_and_foreach_and_fused_adamw_train_as_the_eager_one(tmp_path):
    # Dense pushes: every replica steps on the same mean gradient (DDP's arithmetic), so the
    # compiled model and the three AdamW kernels must land where eager torch does.
    eager = launch("eager", tmp_path, "--compression", "dense")
    assert eager[0]["params"] == eager[1]["params"]
    assert eager[0]["losses"][-1] < 0.6 * eager[0]["losses"][0], eager[0]["losses"]
    for feature in ("compile", "foreach", "fused"):
        got = launch(feature, tmp_path, "--compression", "dense")
        assert got[0]["params"] == got[1]["params"], feature   # the replicas agree
        assert close(got[0], eager[0], 1e-4), feature
        if feature == "compile":  # the trainer holds the compiled module: same names
            assert got[0]["names"] == eager[0]["names"], got[0]["names"]


def test_bfloat16_autocast_with_the_cpu_grad_scaler_trains_with_adacomp(tmp_path):
    got = launch("amp", tmp_path)
    for r in got:
        assert r["exchange"] == "update" and r["compression"] == "adacomp"
        assert r["losses"][-1] < 0.7 * r["losses"][0], r["losses"]


def test_a_worker_whose_scaled_gradient_overflows_pushes_zeros_and_nobody_waits(cluster):
    address = cluster(2, server_args=["--optimizer=mean"]).address

    def rank(w):
        m = nn.Linear(4, 1, bias=False)
        opt = adaps.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.5), m, w,
                                               server_optimizer="mean", compression="dense",
                                               exchange="update")
        scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
        seen = [m.weight.detach().clone()]
        for step in range(3):
            opt.zero_grad()
            loss = m(torch.ones(1, 4)).sum()
            if step == 1 and w.rank == 1:
                loss = loss * float("inf")   # this worker's step overflows
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            seen.append(m.weight.detach().clone())
        return seen, scaler.get_scale()
    (s0, scale0), (s1, scale1) = run_ranks(address, 2, rank, timeout=120)
    assert all(torch.equal(a, b) for a, b in zip(s0, s1))  # SGD: the replicas stay equal
    # Each step: SGD's -0.5 x the gradient 1, unscaled (4x before unscaling), averaged.
    assert torch.allclose(s0[1], s0[0] - 0.5)
    # Step 1: rank 1 overflowed and sent zeros: the mean change is rank 0's half.
    assert torch.allclose(s0[2], s0[1] - 0.25)
    assert torch.allclose(s0[3], s0[2] - 0.5)
    assert scale1 < scale0  # only the overflowing worker's scaler backed off


def test_state_dict_hooks_registered_on_the_wrapper_run(cluster):
    address = cluster(2, server_args=["--optimizer=mean"]).address

    def rank(w):
        m = nn.Linear(3, 2)
        opt = adaps.torch.DistributedOptimizer(torch.optim.AdamW(m.parameters(), lr=0.1), m,
                                               w, server_optimizer="mean")
        calls = []
        opt.register_state_dict_pre_hook(lambda o: calls.append("pre"))
        opt.register_state_dict_post_hook(lambda o, sd: (calls.append("post"), sd)[1])
        opt.register_load_state_dict_pre_hook(lambda o, sd: calls.append("load-pre"))
        opt.register_load_state_dict_post_hook(lambda o: calls.append("load-post"))
        opt.zero_grad()
        m(torch.ones(2, 3)).sum().backward()
        opt.step()
        sd = opt.state_dict()
        opt.load_state_dict(sd)
        return calls
    for calls in run_ranks(address, 2, rank, timeout=120):
        assert calls == ["pre", "post", "load-pre", "load-post"], calls
