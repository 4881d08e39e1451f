"""adaps.torch local mode (servers --optimizer=mean): each step's mean gradient comes back and
the torch optimizer runs. 2 ranks in threads on a real local cluster."""
import numpy as np
import pytest
import torch
import torch.nn as nn

import adaps.torch
from torch_ranks import run_ranks


def mean_cluster(cluster):
    return cluster(2, server_args=["--optimizer=mean"]).address


def wrap(opt, model, w, **kwargs):
    kwargs.setdefault("compression", "dense")
    return adaps.torch.DistributedOptimizer(opt, model, w, server_optimizer="mean", **kwargs)


def test_every_replica_starts_from_rank_0s_values_without_seeding(cluster):
    address = mean_cluster(cluster)

    def rank(w):
        m = nn.Linear(3, 2)
        with torch.no_grad():
            for p in m.parameters():
                p.fill_(float(w.rank + 1))  # each rank its own initial values
        opt = wrap(torch.optim.SGD(m.parameters(), lr=0.1), m, w)
        first = [p.detach().clone() for p in m.parameters()]
        opt.zero_grad()
        m(torch.full((4, 3), float(w.rank))).sum().backward()
        opt.step()
        return first, [p.detach().clone() for p in m.parameters()]
    r0, r1 = run_ranks(address, 2, rank)
    for a, b in zip(r0[0] + r0[1], r1[0] + r1[1]):
        assert torch.equal(a, b)
    assert all(torch.all(t == 1.0) for t in r0[0])  # rank 0's


def test_a_group_with_learning_rate_zero_stays_and_the_other_moves(cluster):
    address = mean_cluster(cluster)

    def rank(w):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
        opt = torch.optim.SGD([{"params": m[0].parameters(), "lr": 0.0},
                               {"params": m[1].parameters()}], lr=0.1, momentum=0.9)
        opt = wrap(opt, m, w)
        before = [p.detach().clone() for p in m.parameters()]
        for _ in range(2):
            opt.zero_grad()
            m(torch.ones(2, 3)).sum().backward()
            opt.step()
        return [torch.equal(a, b) for a, b in zip(m.parameters(), before)]
    assert run_ranks(address, 2, rank) == [[True, True, False, False]] * 2


def test_clipping_between_synchronize_and_step_takes_effect(cluster):
    address = mean_cluster(cluster)

    def rank(w):
        p = nn.Parameter(torch.zeros(2))
        m = nn.Module()
        m.p = p
        opt = wrap(torch.optim.SGD([p], lr=1.0), m, w)
        opt.zero_grad()
        (p * torch.tensor([3.0, 4.0]) * (w.rank + 1)).sum().backward()  # mean: 1.5*(3, 4)
        opt.synchronize()
        mean = p.grad.clone()
        torch.nn.utils.clip_grad_norm_([p], 1.0)
        opt.step()
        return mean, p.detach().clone()
    for mean, p in run_ranks(address, 2, rank):
        assert torch.allclose(mean, torch.tensor([4.5, 6.0]))
        assert torch.allclose(p, -torch.tensor([0.6, 0.8]), atol=1e-6)  # norm 1


def test_a_parameter_without_gradient_is_treated_as_ddp_treats_unused_parameters(cluster):
    address = mean_cluster(cluster)

    def rank(w):
        m = nn.Module()
        m.a = nn.Parameter(torch.ones(3))  # used by rank 0 only
        m.b = nn.Parameter(torch.ones(3))  # used by nobody
        opt = wrap(torch.optim.SGD(m.parameters(), lr=0.5, weight_decay=0.1), m, w)
        opt.zero_grad(set_to_none=True)
        loss = (m.a * 2.0).sum() if w.rank == 0 else torch.zeros(()).requires_grad_()
        loss.backward()
        opt.step()
        return m.a.grad.clone(), m.b.grad, m.a.detach().clone(), m.b.detach().clone()
    for a_grad, b_grad, a, b in run_ranks(address, 2, rank):
        assert torch.equal(a_grad, torch.ones(3))          # (2 + 0) / 2 workers
        assert b_grad is None                              # globally unused: untouched
        assert torch.allclose(a, torch.full((3,), 1 - 0.5 * (1 + 0.1)))
        assert torch.equal(b, torch.ones(3))               # no weight decay step either


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_and_bfloat16_parameters_get_the_float32_mean_converted(cluster, dtype):
    address = mean_cluster(cluster)

    def rank(w):
        m = nn.Module()
        m.weight = nn.Parameter(torch.full((2, 4), float(w.rank), dtype=dtype))
        opt = wrap(torch.optim.SGD(m.parameters(), lr=0.5), m, w)
        opt.zero_grad()
        (m.weight * float(w.rank + 1)).sum().backward()
        opt.synchronize()
        g = m.weight.grad.clone()
        opt.step()
        return g, m.weight.detach().clone()
    (g0, w0), (g1, w1) = run_ranks(address, 2, rank)
    assert g0.dtype == dtype and torch.equal(g0, g1) and torch.equal(w0, w1)
    assert torch.equal(g0, torch.full((2, 4), 1.5, dtype=dtype))  # mean of 1 and 2
    assert torch.equal(w0, torch.full((2, 4), -0.75, dtype=dtype))  # rank 0's 0, one step


DRIFT_STEPS = 10000


def test_the_mean_gradient_does_not_drift_over_ten_thousand_steps(cluster):
    address = mean_cluster(cluster)
    n = 4

    def grads(r):
        # Per-rank gradients with a non-zero mean, so a running sum would keep growing.
        rng = np.random.default_rng(100 + r)
        return (1.0 + 0.5 * rng.standard_normal((DRIFT_STEPS, n))).astype(np.float32)

    def rank(w):
        p = nn.Parameter(torch.zeros(n))
        m = nn.Module()
        m.p = p
        opt = wrap(torch.optim.SGD([p], lr=0.0), m, w)
        mine = torch.from_numpy(grads(w.rank))
        got = np.empty((DRIFT_STEPS, n), dtype=np.float32)
        for s in range(DRIFT_STEPS):
            opt.zero_grad()
            (p * mine[s]).sum().backward()
            opt.step()
            got[s] = p.grad.numpy()
        return got
    results = run_ranks(address, 2, rank, timeout=120)
    exact = (grads(0).astype(np.float64) + grads(1).astype(np.float64)) / 2  # DDP's average
    for got in results:
        err = np.abs(got - exact) / np.maximum(np.abs(exact), 1e-3)
        # float32 rounding of one step's sum, at the end as at the start: no growth.
        assert err.max() < 2e-7, (err.max(), err[-100:].max())
