"""adaps.torch_moments: the global batch's second moment in each worker's Adam/AdamW step
(exchange="update"), on its own and through adaps.torch on a real 2-worker cluster."""
import pytest
import torch
import torch.nn as nn

import adaps.torch
from adaps import torch_moments
from torch_ranks import run_ranks


def grads(seed, steps, n=5):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g) for _ in range(steps)]


def raw_mu_squared(mh, vh, b1, t):
    """This step's estimate of the true gradient's square: m_hat^2 less m_hat's own noise."""
    k = (1 - b1) / (1 + b1) * (1 + b1 ** t) / (1 - b1 ** t)
    if k >= 0.99:
        return mh * mh
    return (mh * mh - k * vh) / (1 - k)


class MuSquared:
    """mu^2 as adaps estimates it for one parameter: this step's estimate, or (smoothed)
    its average over v's window (beta2), bias-corrected, from the second step on."""

    def __init__(self, smoothed, b2=0.999):
        self.smoothed, self.b2, self.avg, self.n = smoothed, b2, None, 0

    def __call__(self, mh, vh, b1, t):
        est = raw_mu_squared(mh, vh, b1, t)
        if self.smoothed and t > 1:  # (the first step has no state: v_global = v_hat)
            self.avg = est * (1 - self.b2) if self.avg is None else \
                self.avg * self.b2 + est * (1 - self.b2)
            self.n += 1
            est = self.avg / (1 - self.b2 ** self.n)
        return est.clamp(min=0)


def reference(gs, w, lr=0.1, b1=0.9, b2=0.999, eps=1e-8, wd=0.0, adamw=False, maximize=False,
              smoothed=False):
    """Adam by hand with the denominator sqrt((1 - 1/w) mu^2 + v_hat / w) (capped at
    sqrt(v_hat)); returns the parameter and m, v."""
    mu_squared = MuSquared(smoothed, b2)
    p = torch.zeros_like(gs[0], dtype=torch.float64) + 0.5
    m = torch.zeros_like(p)
    v = torch.zeros_like(p)
    for t, g in enumerate(gs, 1):
        g = g.double()
        if maximize:
            g = -g
        if adamw:
            p = p * (1 - lr * wd)
        elif wd:
            g = g + wd * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        mh, vh = m / (1 - b1 ** t), v / (1 - b2 ** t)
        vg = torch.minimum((1 - 1 / w) * mu_squared(mh, vh, b1, t) + vh / w, vh)
        p = p - lr * mh / (vg.sqrt() + eps)
    return p, m, v


def run_torch(opt_cls, gs, w, smoothed=False, **kw):
    p = nn.Parameter(torch.full((gs[0].numel(),), 0.5))
    opt = opt_cls([p], lr=0.1, **kw)
    store = {} if smoothed else None
    for g in gs:
        p.grad = g.clone()
        restore = torch_moments.global_second_moment(opt, w, store)
        opt.step()
        restore()
    return p.detach(), opt.state[p]


@pytest.mark.parametrize("smoothed", [False, True])
@pytest.mark.parametrize("opt_cls,kw", [
    (torch.optim.Adam, {}),
    (torch.optim.Adam, {"weight_decay": 0.1}),
    (torch.optim.Adam, {"maximize": True}),
    (torch.optim.AdamW, {"weight_decay": 0.1}),
])
def test_the_step_uses_the_global_estimate_and_the_state_keeps_torchs_moments(opt_cls, kw,
                                                                              smoothed):
    gs = grads(1, 6)
    p, state = run_torch(opt_cls, gs, 4, smoothed=smoothed, **kw)
    want, m, v = reference(gs, 4, wd=kw.get("weight_decay", 0.0),
                           adamw=opt_cls is torch.optim.AdamW,
                           maximize=kw.get("maximize", False), smoothed=smoothed)
    assert torch.allclose(p.double(), want, rtol=1e-5, atol=1e-6)
    # Not torch's own step (which the estimate would otherwise equal by accident) ...
    plain, plain_state = run_torch(opt_cls, gs, 1, **kw)
    assert (p - plain).abs().max() > 1e-3
    # ... but torch's own moments: a checkpoint means what it means without adaps.
    assert torch.allclose(state["exp_avg_sq"].double(), v, rtol=1e-5)
    assert torch.allclose(state["exp_avg"].double(), m, rtol=1e-5, atol=1e-7)
    if opt_cls is torch.optim.AdamW or not kw.get("weight_decay"):  # else g depends on p
        assert torch.allclose(state["exp_avg_sq"], plain_state["exp_avg_sq"], rtol=1e-6)
        assert torch.equal(state["exp_avg"], plain_state["exp_avg"])


def take_steps(opt, p, gs, w, store):
    """One optimizer step per gradient of gs with the global estimate for w workers; returns
    the sum of the steps' mean absolute moves."""
    total = 0.0
    for g in gs:
        before = p.detach().clone()
        p.grad = g.clone()
        restore = torch_moments.global_second_moment(opt, w, store)
        opt.step()
        restore()
        total += (p.detach() - before).abs().mean().item()
    return total


def test_pure_noise_gets_the_global_batchs_step_when_mu_squared_is_averaged():
    # Elements whose gradient is pure noise (mu = 0): DDP's Adam sees the mean of W
    # gradients, whose variance is W times smaller, so it steps sqrt(W) = 2 times as far as
    # one worker's own Adam. This step's estimate of mu^2 is largest when m_hat is, i.e.
    # exactly on the steps that would move an element most, which it shortens; averaged over
    # v's window it is about 0 and the steps are about DDP's.
    gen = torch.Generator().manual_seed(3)
    gs = [torch.randn(2000, generator=gen) for _ in range(200)]

    def distance(w, smoothed):
        p = nn.Parameter(torch.zeros(2000))
        return take_steps(torch.optim.Adam([p], lr=0.1), p, gs, w, {} if smoothed else None)
    plain = distance(1, False)
    instant, smoothed = distance(4, False) / plain, distance(4, True) / plain
    assert abs(smoothed - 2.0) < 0.15 and smoothed > instant + 0.05, (instant, smoothed)


def rmsprop_reference(gs, w, lr=0.01, alpha=0.99, eps=1e-8, b1=0.9):
    """RMSprop by hand dividing by sqrt(bc2 * v_global) (capped at torch's square_avg), with
    adaps's own first moment of g; the first step is torch's (RMSprop has no state yet)."""
    p = torch.zeros_like(gs[0], dtype=torch.float64) + 0.5
    sq, m = torch.zeros_like(p), torch.zeros_like(p)
    mu_squared = MuSquared(smoothed=True, b2=alpha)
    for t, g in enumerate(gs, 1):
        g = g.double()
        sq = alpha * sq + (1 - alpha) * g * g
        m = b1 * m + (1 - b1) * g
        bc2 = 1 - alpha ** t
        mu2 = mu_squared(m / (1 - b1 ** t), sq / bc2, b1, t)
        want = torch.minimum(((1 - 1 / w) * mu2 + sq / bc2 / w) * bc2, sq)
        p = p - lr * g / (want.sqrt() + eps)
    return p, sq


def adagrad_reference(gs, w, lr=0.1, eps=1e-10, b1=0.9, b2=0.999):
    """Adagrad by hand dividing by the root of the global batch's sum of squares as adaps
    estimates it: each step adds (1 - 1/w) mu^2 + g^2 / w (capped at torch's sum)."""
    p = torch.zeros_like(gs[0], dtype=torch.float64) + 0.5
    true_sum, total = torch.zeros_like(p), torch.zeros_like(p)
    m, q = torch.zeros_like(p), torch.zeros_like(p)
    avg, n = torch.zeros_like(p), 0
    for t, g in enumerate(gs, 1):
        g = g.double()
        m = b1 * m + (1 - b1) * g
        q = b2 * q + (1 - b2) * g * g
        avg = b2 * avg + (1 - b2) * raw_mu_squared(m / (1 - b1 ** t), q / (1 - b2 ** t), b1, t)
        n += 1
        mu2 = (avg / (1 - b2 ** n)).clamp(min=0)
        true_sum = true_sum + g * g
        total = torch.minimum(total + (1 - 1 / w) * mu2 + g * g / w, true_sum)
        p = p - lr * g / (total.sqrt() + eps)
    return p, true_sum


@pytest.mark.parametrize("opt_cls,reference_fn,state_key,lr", [
    (torch.optim.RMSprop, rmsprop_reference, "square_avg", 0.01),
    (torch.optim.Adagrad, adagrad_reference, "sum", 0.1),
])
def test_rmsprop_and_adagrad_step_on_the_global_estimate_and_keep_their_own_state(
        opt_cls, reference_fn, state_key, lr):
    gs = grads(4, 8)

    def run(w):
        p = nn.Parameter(torch.full((5,), 0.5))
        opt = opt_cls([p], lr=lr)
        take_steps(opt, p, gs, w, {})
        return p.detach(), opt.state[p]
    p, state = run(4)
    want, true_state = reference_fn(gs, 4, lr=lr)
    assert torch.allclose(p.double(), want, rtol=1e-5, atol=1e-6)
    plain, plain_state = run(1)
    assert (p - plain).abs().max() > 1e-3
    assert torch.allclose(state[state_key].double(), true_state, rtol=1e-5)
    assert torch.equal(state[state_key], plain_state[state_key])


@pytest.mark.parametrize("opt_cls,kw", [
    (torch.optim.Adam, {}),
    (torch.optim.NAdam, {}),
    (torch.optim.RAdam, {}),
    (torch.optim.RMSprop, {}),
    (torch.optim.Adagrad, {}),
    (torch.optim.RMSprop, {"momentum": 0.9}),
])
def test_pure_noise_gets_the_global_batchs_step_with_every_adaptive_optimizer(opt_cls, kw):
    # As above, for each optimizer that divides by a running second moment of g: DDP's
    # steps on pure noise are sqrt(W) = 2 times a worker's own (Adagrad's and RMSprop's alike).
    gen = torch.Generator().manual_seed(5)
    gs = [torch.randn(2000, generator=gen) for _ in range(200)]

    def distance(w):
        p = nn.Parameter(torch.zeros(2000))
        opt = opt_cls([p], lr=0.01, **kw)
        store = {}
        take_steps(opt, p, gs[:100], w, store)  # (the state and the averages settle)
        return take_steps(opt, p, gs[100:], w, store)
    ratio = distance(4) / distance(1)
    assert abs(ratio - 2.0) < 0.2, ratio


@pytest.mark.parametrize("opt_cls, kw", [
    (torch.optim.Adam, {}),
    (torch.optim.AdamW, {}),
    (torch.optim.RMSprop, {}),
    (torch.optim.Adagrad, {}),
])
def test_the_workers_agreement_is_near_one_where_the_mean_dominates_and_small_on_noise(
        opt_cls, kw):
    # own_updates="estimate": each element's c = mu^2 / (mu^2 + k s^2), how much two workers'
    # updates share (the same mean, each first moment's own noise): elements whose gradient
    # has mean 2 and noise 1 against elements of noise alone.
    gen = torch.Generator().manual_seed(9)
    mean = torch.cat([torch.full((1000,), 2.0), torch.zeros(1000)])
    p, q = nn.Parameter(torch.zeros(2000)), nn.Parameter(torch.zeros(2000))
    opt, plain_opt = opt_cls([p], lr=1e-3, **kw), opt_cls([q], lr=1e-3, **kw)
    store, plain = {}, {}
    for _ in range(150):
        p.grad = mean + torch.randn(2000, generator=gen)
        q.grad = p.grad.clone()
        for o, d, agreement in ((opt, store, True), (plain_opt, plain, False)):
            restore = torch_moments.global_second_moment(o, 4, d, agreement=agreement)
            o.step()
            restore()
    assert plain[q].corr is None  # (not asked for: not computed)
    c = store[p].corr
    assert c.min() >= 0.0 and c.max() <= 1.0
    assert c[:1000].mean() > 0.95 and c[1000:].mean() < 0.3, (c[:1000].mean(), c[1000:].mean())


def test_rmsprop_centered_and_optimizers_without_a_second_moment_are_left_alone():
    for opt in (torch.optim.RMSprop([nn.Parameter(torch.zeros(3))], lr=0.1, centered=True),
                torch.optim.SGD([nn.Parameter(torch.zeros(3))], lr=0.1, momentum=0.9),
                torch.optim.Adamax([nn.Parameter(torch.zeros(3))])):
        assert not torch_moments.changes_step(opt)
    for cls in (torch.optim.NAdam, torch.optim.RAdam, torch.optim.RMSprop, torch.optim.Adagrad):
        opt = cls([nn.Parameter(torch.zeros(3))], lr=0.1)
        assert torch_moments.changes_step(opt)


def test_one_worker_or_another_optimizer_is_torchs_own_step():
    gs = grads(2, 4)
    p, _ = run_torch(torch.optim.Adam, gs, 1)
    want, _, _ = reference(gs, 1)
    assert torch.allclose(p.double(), want, rtol=1e-5, atol=1e-6)
    sgd = torch.optim.SGD([nn.Parameter(torch.zeros(3))], lr=0.1)
    assert not torch_moments.changes_step(sgd)
    amsgrad = torch.optim.Adam([nn.Parameter(torch.zeros(3))], amsgrad=True)
    assert not torch_moments.changes_step(amsgrad)

    class MyAdam(torch.optim.Adam):
        pass
    assert not torch_moments.changes_step(MyAdam([nn.Parameter(torch.zeros(3))]))


def test_update_exchange_uses_the_global_second_moment_by_default(cluster):
    per_rank = [grads(10, 3), grads(11, 3)]

    def rank(w, second_moment):
        m = nn.Module()
        m.p = nn.Parameter(torch.full((5,), 0.5))
        kw = {} if second_moment is None else {"second_moment": second_moment}
        opt = adaps.torch.DistributedOptimizer(torch.optim.Adam([m.p], lr=0.1), m, w,
                                               server_optimizer="mean", compression="dense",
                                               exchange="update", **kw)
        out = []
        for g in per_rank[w.rank]:
            opt.zero_grad()
            (m.p * g).sum().backward()
            opt.step()
            out.append(m.p.detach().clone())
        return out

    def mean_of_local_steps(w_est):
        # Each worker's own Adam on its own gradients, every replica the start plus the mean
        # of the two workers' changes each step (mu^2 averaged: the default).
        start = torch.full((5,), 0.5, dtype=torch.float64)
        states = [{"m": torch.zeros(5, dtype=torch.float64),
                   "v": torch.zeros(5, dtype=torch.float64),
                   "mu2": MuSquared(smoothed=True)} for _ in range(2)]
        p, out = start, []
        for t in range(1, 4):
            moves = []
            for r in range(2):
                g = per_rank[r][t - 1].double()
                s = states[r]
                s["m"] = 0.9 * s["m"] + 0.1 * g
                s["v"] = 0.999 * s["v"] + 0.001 * g * g
                mh, vh = s["m"] / (1 - 0.9 ** t), s["v"] / (1 - 0.999 ** t)
                vg = torch.minimum((1 - 1 / w_est) * s["mu2"](mh, vh, 0.9, t) + vh / w_est,
                                   vh)
                moves.append(-0.1 * mh / (vg.sqrt() + 1e-8))
            p = p + (moves[0] + moves[1]) / 2
            out.append(p)
        return out

    default = run_ranks(cluster(2, server_args=["--optimizer=mean"]).address, 2,
                        lambda w: rank(w, None))
    local = run_ranks(cluster(2, server_args=["--optimizer=mean"]).address, 2,
                      lambda w: rank(w, "local"))
    for got, want in zip(default[0], mean_of_local_steps(2)):
        assert torch.allclose(got.double(), want, atol=1e-5)
    for got, want in zip(local[0], mean_of_local_steps(1)):
        assert torch.allclose(got.double(), want, atol=1e-5)
    assert torch.equal(default[0][-1], default[1][-1])
    assert (default[0][-1] - local[0][-1]).abs().max() > 1e-3


def test_an_unknown_second_moment_is_refused():
    m = nn.Linear(2, 1)
    with pytest.raises(ValueError, match="second_moment"):
        adaps.torch.DistributedOptimizer(torch.optim.Adam(m.parameters()), m, None,
                                         server_optimizer="mean", second_moment="shared")


@pytest.mark.parametrize("opt_cls", [torch.optim.Adam, torch.optim.RMSprop, torch.optim.Adagrad])
def test_a_complex_parameter_takes_torchs_own_step(opt_cls):
    gen = torch.Generator().manual_seed(6)
    gs = [torch.randn(4, dtype=torch.complex64, generator=gen) for _ in range(5)]

    def run(w):
        p = nn.Parameter(torch.ones(4, dtype=torch.complex64))
        take_steps(opt_cls([p], lr=0.1), p, gs, w, {})
        return p.detach()
    assert torch.equal(run(4), run(1))
