"""adaps.torch server mode: the servers run the optimizer, and whatever they cannot honour
is an error that names local mode. 2 ranks in threads on a real local cluster."""
import warnings

import pytest
import torch
import torch.nn as nn

import adaps.torch
from torch_ranks import Declared, one_parameter, run_ranks


def sgd_cluster(cluster, kind="sgd"):
    return cluster(2, server_args=["--optimizer=" + kind]).address


def test_a_param_group_with_its_own_learning_rate_is_refused_naming_local_mode(cluster):
    address = sgd_cluster(cluster)

    def rank(w):
        m = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
        opt = torch.optim.SGD([{"params": m[0].parameters(), "lr": 0.1},
                               {"params": m[1].parameters(), "lr": 0.0}], lr=0.1)
        with pytest.raises(ValueError, match="local mode"):
            adaps.torch.DistributedOptimizer(opt, m, w, server_optimizer="sgd",
                                             compression="dense")
        return True
    assert run_ranks(address, 2, rank) == [True, True]


def test_momentum_the_servers_do_not_run_and_custom_optimizers_are_refused(cluster):
    address = sgd_cluster(cluster)

    def rank(w):
        m = nn.Linear(3, 1)
        with pytest.raises(ValueError, match="--optimizer=momentum"):
            adaps.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1,
                                                             momentum=0.9), m, w,
                                             server_optimizer="sgd", compression="dense")
        with pytest.raises(ValueError, match="local mode"):
            adaps.torch.DistributedOptimizer(torch.optim.RMSprop(m.parameters()), m, w,
                                             server_optimizer="sgd")
        return True
    assert run_ranks(address, 2, rank) == [True, True]

    def adamw(w):
        m = nn.Linear(3, 1)
        with pytest.raises(ValueError, match="decoupled.*local mode"):
            adaps.torch.DistributedOptimizer(torch.optim.AdamW(m.parameters()), m, w,
                                             server_optimizer="adam")
        return True
    adam_address = cluster(2, server_args=["--optimizer=adam"]).address
    assert run_ranks(adam_address, 2, adamw) == [True, True]


def test_parameters_outside_the_optimizer_are_not_trained(cluster):
    address = sgd_cluster(cluster)

    def rank(w):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        opt = adaps.torch.DistributedOptimizer(torch.optim.SGD(m[1].parameters(), lr=0.1), m,
                                               w, server_optimizer="sgd", compression="dense")
        # After the wrapper's broadcast: the ranks are threads sharing torch's global
        # generator, so the values each built before it may differ.
        before = [p.detach().clone() for p in m.parameters()]
        for _ in range(3):
            opt.zero_grad()
            m(torch.ones(2, 4)).sum().backward()
            opt.step()
        after = list(m.parameters())
        declared = [n for n in w.tensor_names() if not n.startswith("__adaps")]
        return [torch.equal(a, b) for a, b in zip(after, before)], sorted(declared)
    for same, names in run_ranks(address, 2, rank):
        assert same == [True, True, False, False]
        assert names == ["1.bias", "1.weight"]


def test_clipping_after_backward_is_refused_naming_local_mode(cluster):
    address = sgd_cluster(cluster)

    def rank(w):
        m = nn.Linear(3, 1)
        opt = adaps.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m, w,
                                               server_optimizer="sgd", compression="dense")
        opt.zero_grad()
        m(torch.ones(2, 3)).sum().backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1e-3)
        with pytest.raises(RuntimeError, match="local mode"):
            opt.step()
        return True
    assert run_ranks(address, 2, rank) == [True, True]


@pytest.mark.parametrize("made_on", ["wrapper", "torch optimizer"])
def test_step_lr_takes_the_wrapper_and_every_new_rate_reaches_the_servers(cluster, made_on):
    address = sgd_cluster(cluster)

    def rank(w):
        p, m = one_parameter(2)
        inner = torch.optim.SGD([p], lr=1.0)
        opt = adaps.torch.DistributedOptimizer(inner, m, w, server_optimizer="sgd",
                                               compression="dense")
        assert isinstance(opt, torch.optim.Optimizer)
        sched = torch.optim.lr_scheduler.StepLR(opt if made_on == "wrapper" else inner,
                                                step_size=1, gamma=0.5)
        seen = []
        for _ in range(4):
            opt.zero_grad(set_to_none=True)
            p.sum().backward()  # gradient 1 on every rank
            opt.step()
            sched.step()
            seen.append(p.detach().clone())
        return seen
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = run_ranks(address, 2, rank)
    # In server mode the torch optimizer's own step never runs; a scheduler made on either
    # object must still see each step before its own (torch 1.x and 2.x check differently).
    order = [str(c.message) for c in caught if "lr_scheduler.step()" in str(c.message)]
    assert not order, order
    for seen in results:
        # p = -(1 + 0.5 + 0.25 + 0.125) after the fourth step
        expect = [-1.0, -1.5, -1.75, -1.875]
        assert [float(s[0]) for s in seen] == expect


def test_gradient_accumulation_in_no_sync_reaches_the_servers_as_one_push(cluster):
    address = sgd_cluster(cluster)

    def rank(w):
        p, m = one_parameter(2)
        opt = adaps.torch.DistributedOptimizer(torch.optim.SGD([p], lr=1.0), m, w,
                                               server_optimizer="sgd", compression="dense")
        for _ in range(2):
            opt.zero_grad()
            with opt.no_sync():
                (p * (w.rank + 1.0)).sum().backward()
            (p * 2.0).sum().backward()
            opt.step()
        return p.detach().clone()
    for p in run_ranks(address, 2, rank):
        assert torch.allclose(p, torch.full((2,), -2 * 3.5)), p  # mean of (1+2, 2+2), twice


def test_state_dict_round_trip_and_zero_grad_set_to_none(cluster):
    address = cluster(2, server_args=["--optimizer=momentum"]).address

    def rank(w):
        m = nn.Linear(2, 1)
        opt = adaps.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1,
                                                               momentum=0.5), m, w,
                                               server_optimizer="momentum")
        opt.zero_grad(set_to_none=True)
        assert all(p.grad is None for p in m.parameters())
        sd = opt.state_dict()
        sd["param_groups"][0]["lr"] = 0.25
        opt.load_state_dict(sd)
        assert opt.param_groups is opt.optimizer.param_groups
        return opt.param_groups[0]["lr"], opt.optimizer.param_groups[0]["lr"]
    assert run_ranks(address, 2, rank) == [(0.25, 0.25), (0.25, 0.25)]


def test_pull_parameters_loads_the_servers_exact_parameters_behind_recompressed_pulls(cluster):
    address = sgd_cluster(cluster)

    def rank(w):
        torch.manual_seed(0)
        # 70000 weights: a tensor of its own; the rest are fused (under 256 KiB).
        m = nn.Sequential(nn.Linear(40, 50), nn.Tanh(), nn.Linear(50, 1400))
        opt = adaps.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m, w,
                                               server_optimizer="sgd", compression="dense",
                                               pull="recompressed")
        # Every rank has the same replica and data, so the mean gradient is its own and the
        # servers' SGD is reproduced here (dense pushes: nothing held back on the way up).
        ref = [p.detach().clone() for p in m.parameters()]
        x = torch.linspace(-1, 1, 8 * 40).reshape(8, 40)
        for _ in range(6):
            opt.zero_grad()
            m(x).pow(2).mean().backward()
            grads = [p.grad.detach().clone() for p in m.parameters()]
            opt.step()
            for r, g in zip(ref, grads):
                r.sub_(0.1 * g)
        replica_gap = max((p.detach() - r).abs().max().item()
                          for p, r in zip(m.parameters(), ref))
        m(x).sum().backward()  # pushed, not yet waited for
        with pytest.raises(adaps.Error, match="in flight"):
            opt.pull_parameters()
        opt.step()
        for r, p in zip(ref, m.parameters()):
            r.sub_(0.1 * p.grad.detach())
        opt.pull_parameters()
        exact_gap = max((p.detach() - r).abs().max().item()
                        for p, r in zip(m.parameters(), ref))
        opt.zero_grad()
        m(x).sum().backward()
        opt.step()  # the recompressed stream goes on from the replica
        return replica_gap, exact_gap
    for replica_gap, exact_gap in run_ranks(address, 2, rank):
        assert replica_gap > 1e-4, "the recompressed replica should trail the servers"
        assert exact_gap < 1e-6


def test_momentum_correction_with_dense_pushes_is_the_servers_momentum(cluster):
    # DGC's momentum correction (the default with a compressor): the workers push their
    # velocity and the servers run plain SGD. With dense pushes that is torch's momentum SGD
    # with weight decay, step for step, as servers running the momentum compute it.
    results = {}
    for kind, correct in (("momentum", False), ("sgd", True)):
        address = sgd_cluster(cluster, kind)

        def rank(w):
            m = nn.Module()
            m.p = nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
            opt = adaps.torch.DistributedOptimizer(
                torch.optim.SGD([m.p], lr=0.1, momentum=0.9, weight_decay=0.05), m, w,
                server_optimizer=kind, compression="dense", momentum_correction=correct)
            out = []
            for s in range(5):
                opt.zero_grad()
                (m.p * torch.tensor([1.0, 0.5, -1.0]) * (w.rank + s + 1)).sum().backward()
                opt.step()
                out.append(m.p.detach().clone())
            return opt.momentum_correction, out
        results[kind] = run_ranks(address, 2, rank)
    assert [r[0] for r in results["sgd"]] == [True, True]
    for a, b in zip(results["momentum"][0][1], results["sgd"][0][1]):
        assert torch.allclose(a, b, atol=1e-6), (a, b)
    assert not torch.allclose(results["sgd"][0][1][0], results["sgd"][0][1][4])


def test_momentum_correction_is_the_default_with_a_compressor(cluster):
    address = sgd_cluster(cluster)

    def rank(w):
        m = nn.Linear(3, 1)
        opt = adaps.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1,
                                                               momentum=0.9), m, w,
                                               server_optimizer="sgd", compression="adacomp")
        return opt.momentum_correction
    assert run_ranks(address, 2, rank) == [True, True]


def test_plain_sgd_defaults_hold_in_server_mode_and_both_replicas_step_alike(cluster):
    # Plain SGD on the servers is the same arithmetic as local mode's plain-SGD update, so
    # the same defaults (docs/accuracy.md "Plain SGD"): the embedding by Top-k, the recurrent
    # weights at the small bin, the rest AdaComp at 500; both ranks end with the same model.
    address = sgd_cluster(cluster)

    class Lm(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(50, 4)
            self.rnn = nn.GRU(4, 6)
            self.out = nn.Linear(6, 50)

        def forward(self, x):
            return self.out(self.rnn(self.embed(x))[0])

    def rank(w):
        rec = Declared(w)
        torch.manual_seed(w.rank)  # rank 0's values are broadcast
        m = Lm()
        opt = adaps.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.5), m, rec,
                                               server_optimizer="sgd")
        before = m.embed.weight.detach().clone()
        gen = torch.Generator().manual_seed(10 + w.rank)
        for _ in range(4):
            opt.zero_grad()
            x = torch.randint(0, 50, (5, 3), generator=gen)
            torch.nn.functional.cross_entropy(m(x).flatten(0, 1), x.flatten()).backward()
            opt.step()
        declared = {n: (d.get("compression"), d.get("bin_size")) for n, d in rec.declared.items()}
        return declared, [p.detach().clone() for p in m.parameters()], \
            bool((m.embed.weight != before).any())
    (d0, p0, moved), (d1, p1, _) = run_ranks(address, 2, rank)
    assert d0 == d1
    assert d0["embed.weight"] == ("topk", 500), d0
    assert d0["rnn.weight_ih_l0"][1] == 50 and d0["rnn.weight_hh_l0"][1] == 50, d0
    assert d0["rnn.weight_ih_l0"][0] == "adacomp" and d0["out.weight"] == ("adacomp", 500), d0
    assert moved
    for a, b in zip(p0, p1):
        assert torch.equal(a, b)
