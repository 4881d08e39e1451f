"""adaps.torch's local steps (local_steps=H, the update exchange every H steps, DiLoCo and
SparseLoCo style): each worker steps its own optimizer on its own batches, and every H-th
step sends the change since the last exchange through AdaComp with error feedback; every
replica becomes where the last exchange left it plus the outer step of the mean change.
Ranks in threads on a real local cluster (servers --optimizer=mean)."""
import copy
import os
import time

import numpy as np
import pytest
import torch
import torch.nn as nn

import adaps
import adaps.torch
from conftest import launch_and_join, run_launch
from torch_ranks import Declared, one_parameter, run_ranks

HERE = os.path.dirname(os.path.abspath(__file__))
N = 600           # elements of the one trained tensor
TIMEOUT = 600     # seconds for a rank to finish (generous: the machine may be loaded)


def mean_cluster(cluster, workers=2):
    return cluster(workers, server_args=["--optimizer=mean"]).address


def gradient(p, rank, step):
    """This rank's gradient at this step: a fixed random direction plus 0.3 p (so the local
    trajectories depend on where each worker is)."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(N, generator=g) + 0.3 * p.detach()


def start_values():
    return torch.randn(N, generator=torch.Generator().manual_seed(5))


def wrapped(w, **kwargs):
    """(p, opt): one parameter of N elements at start_values(), Adam at lr 0.05, AdaComp at
    bin size 50 pulled exactly (as reference() does; with local steps the default pull is
    recompressed), torch's own second moment and no own share or bin schedule unless
    given."""
    p, m = one_parameter(N)
    with torch.no_grad():
        p.copy_(start_values())
    for k, v in (("compression", "adacomp"), ("bin_size", 50), ("pull", "sparse"),
                 ("second_moment", "local"), ("own_updates", "off"), ("bin_schedule", "off")):
        kwargs.setdefault(k, v)
    opt = adaps.torch.DistributedOptimizer(torch.optim.Adam([p], lr=0.05), m, w,
                                           server_optimizer="mean", **kwargs)
    return p, opt


def train(p, opt, rank, steps, first=0):
    """Steps opt on gradient(p, rank, s) for s in first..first+steps-1; p after each step."""
    out = []
    for s in range(first, first + steps):
        opt.zero_grad()
        (p * gradient(p, rank, s)).sum().backward()
        opt.step()
        out.append(p.detach().clone())
    return out


def reference(w, steps, h, outer, compression, exchanges=None, lr_at=None, bins_at=None):
    """The update exchange written out with the worker API alone: torch's Adam on this
    worker's gradients, and every h-th step (or after the steps numbered in `exchanges`,
    counted from 1) the change since the last exchange is pushed and the model becomes where
    the last exchange left it plus the mean change (outer="average") or DiLoCo's Nesterov
    step on it (lr 0.7, momentum 0.9); Adam's lr at step s lr_at(s) (0.05); the push bin
    from step s on bins_at[s] (50). p after each step."""
    p = nn.Parameter(start_values())
    opt = torch.optim.Adam([p], lr=0.05)
    change = np.zeros(N, dtype=np.float32)
    mean = np.zeros(N, dtype=np.float32)
    w.declare("p", mean, shape=[N], bin_size=50, compression=compression, pull="sparse")
    w.close_fusion_buckets()
    anchor, momentum, out = p.detach().clone(), torch.zeros(N), []
    for s in range(steps):
        if lr_at is not None:
            opt.param_groups[0]["lr"] = lr_at(s)
        if bins_at and s in bins_at:
            w.set_bin_size("p", bins_at[s])
        opt.zero_grad()
        (p * gradient(p, w.rank, s)).sum().backward()
        opt.step()
        if (s + 1 in exchanges) if exchanges is not None else (s + 1) % h == 0:
            with torch.no_grad():
                torch.sub(p, anchor, out=torch.from_numpy(change))
                w.push_pull("p", change, mean).wait()
                m = torch.from_numpy(mean)
                if outer == "nesterov":
                    momentum.mul_(0.9).add_(m)
                    m = m.add(momentum, alpha=0.9).mul_(0.7)
                torch.add(anchor, m, out=p)
                anchor.copy_(p)
        out.append(p.detach().clone())
    return out


@pytest.mark.parametrize("h,outer,compression", [
    (1, "average", "adacomp"), (3, "average", "adacomp"), (3, "nesterov", "adacomp"),
    (1, "nesterov", "adacomp"), (2, "average", "dense")])
def test_local_steps_are_the_update_exchange_every_h_steps_bit_for_bit(cluster, h, outer,
                                                                        compression):
    # H = 1 with outer="average" is the update exchange of every step as it was; H > 1 the
    # same every H steps; "nesterov" DiLoCo's outer step; compression="dense" with the
    # update exchange named is DiLoCo without compression.
    steps = 7

    def ours(w):
        kwargs = {"exchange": "update"} if compression == "dense" else {}
        p, opt = wrapped(w, local_steps=h, outer=outer, compression=compression, **kwargs)
        assert (opt.local_steps, opt.outer, opt.exchange) == (h, outer, "update")
        return train(p, opt, w.rank, steps)
    got = run_ranks(mean_cluster(cluster), 2, ours, timeout=TIMEOUT)
    want = run_ranks(mean_cluster(cluster), 2,
                     lambda w: reference(w, steps, h, outer, compression), timeout=TIMEOUT)
    for rank in range(2):
        for s in range(steps):
            assert torch.equal(got[rank][s], want[rank][s]), (rank, s)
    for s in range(steps):
        # Equal replicas after an exchange; each worker's own model between.
        assert torch.equal(got[0][s], got[1][s]) == ((s + 1) % h == 0), s


@pytest.mark.parametrize("phases,lr_at,exchanges,phase_bins,bins_at", [
    ("2@4,3", None, [2, 4, 7, 10], "keep", None),
    # phase_bins="scale": the second phase pushes at the bin 50 * 2 / 3 (from its first step,
    # 4 counted from 0).
    ("2@4,3", None, [2, 4, 7, 10], "scale", {4: 33}),
    # The lr falls to 0.02 <= 0.05 / 2 at step 4 (counted from 0): the interval that begins
    # there is the second phase's.
    ("1@lr/2,3", lambda s: 0.05 if s < 4 else 0.02, [1, 2, 3, 4, 7, 10], "keep", None),
    # (50 / 3 = 16 stops at 25, as the default bin divided by H does.)
    ("1@lr/2,3", lambda s: 0.05 if s < 4 else 0.02, [1, 2, 3, 4, 7, 10], "scale", {4: 25}),
    # Its peak is the highest lr so far: a warm-up (0.01, 0.03, 0.05) is not a fall.
    ("2@lr/2,4", lambda s: min(0.05, 0.01 + 0.02 * s) if s < 6 else 0.02, [2, 4, 6, 10],
     "keep", None),
])
def test_local_steps_phases_exchange_every_h_of_each_phase_bit_for_bit(
        cluster, phases, lr_at, exchanges, phase_bins, bins_at):
    # local_steps="H@END,...,H": every H steps until END (a step, or where the lr is at most
    # its peak / K), then the next phase's H; bit for bit the update exchange written out
    # with those exchanges, and with phase_bins="scale" the bins set at the switch.
    steps = 10

    def ours(w):
        p, opt = wrapped(w, local_steps=phases, phase_bins=phase_bins)
        out = []
        for s in range(steps):
            if lr_at is not None:
                opt.optimizer.param_groups[0]["lr"] = lr_at(s)
            out += train(p, opt, w.rank, 1, first=s)
        return out
    got = run_ranks(mean_cluster(cluster), 2, ours, timeout=TIMEOUT)
    want = run_ranks(mean_cluster(cluster), 2,
                     lambda w: reference(w, steps, None, "average", "adacomp", exchanges,
                                         lr_at, bins_at), timeout=TIMEOUT)
    for rank in range(2):
        for s in range(steps):
            assert torch.equal(got[rank][s], want[rank][s]), (rank, s)
    for s in range(steps):
        assert torch.equal(got[0][s], got[1][s]) == (s + 1 in exchanges), s


@pytest.mark.parametrize("h,now_at,exchanges,pending,bins_at", [
    (4, 6, [4, 6, 10], True, None),   # two steps into an interval: sent, then 4 more
    (4, 8, [4, 8, 12], False, None),  # right after an exchange: nothing to send
    # Phases: the interval after it is the phase's H (pushed at its bin, 50 * 2 / 3).
    ("2@4,3", 5, [2, 4, 5, 8], True, {4: 33}),
])
def test_exchange_now_sends_the_local_steps_since_the_last_exchange(cluster, h, now_at,
                                                                    exchanges, pending,
                                                                    bins_at):
    # The end of a run whose steps are not a multiple of H (or of a phase's, which falls
    # where the lr says): exchange_now() (collective) sends what the steps since the last
    # exchange changed, so every replica is the same there, as under DDP; the next interval
    # counts from it. Bit for bit the update exchange written out with those exchanges.
    steps = now_at + 4

    def ours(w):
        p, opt = wrapped(w, local_steps=h)
        out = train(p, opt, w.rank, now_at)
        before = w.traffic("p")["push_wire_bytes"]
        sent = opt.exchange_now()
        after = w.traffic("p")["push_wire_bytes"]
        out[-1] = p.detach().clone()
        again = opt.exchange_now()  # nothing since: no exchange
        assert w.traffic("p")["push_wire_bytes"] == after
        return out + train(p, opt, w.rank, steps - now_at, first=now_at), \
            (sent, after > before, again)
    got = run_ranks(mean_cluster(cluster), 2, ours, timeout=TIMEOUT)
    want = run_ranks(mean_cluster(cluster), 2,
                     lambda w: reference(w, steps, None, "average", "adacomp", exchanges,
                                         bins_at=bins_at), timeout=TIMEOUT)
    for rank in range(2):
        assert got[rank][1] == (pending, pending, False), got[rank][1]
        for s in range(steps):
            assert torch.equal(got[rank][0][s], want[rank][s]), (rank, s)
    for s in range(steps):
        assert torch.equal(got[0][0][s], got[1][0][s]) == (s + 1 in exchanges), s


def test_exchange_now_without_local_steps_sends_nothing(cluster):
    # Every step exchanged already (local_steps=1): nothing pending, nothing sent.
    def rank(w):
        p, opt = wrapped(w)
        train(p, opt, w.rank, 3)
        before = w.traffic("p")["push_wire_bytes"]
        return opt.exchange_now(), w.traffic("p")["push_wire_bytes"] == before
    assert run_ranks(mean_cluster(cluster), 2, rank, timeout=TIMEOUT) == [(False, True)] * 2


class BinsSet:
    """A worker that records each set_bin_size (name, bin) with the push_pulls before it."""

    def __init__(self, w):
        self._w, self.pushes, self.bins = w, 0, []

    def push_pull(self, *args):
        self.pushes += 1
        return self._w.push_pull(*args)

    def set_bin_size(self, name, size):
        self.bins.append((self.pushes, name, size))
        return self._w.set_bin_size(name, size)

    def __getattr__(self, name):
        return getattr(self._w, name)


@pytest.mark.parametrize("phase_bins,pull,bin_schedule,expected", [
    ("keep", "sparse", "off", []),
    ("scale", "sparse", "off", [(2, 200)]),
    # Recompressed pulls push at a quarter of the bin from the start, then a quarter of the
    # phase's.
    ("keep", "recompressed", "off", [(0, 100)]),
    ("scale", "recompressed", "off", [(0, 100), (2, 50)]),
    # The bin schedule's divisor (2 while the lr is at most 3/4 of its recent mean: 0.03
    # against 0.05) on top: 400 * 2 / 4 / 2 once the lr falls at step 4, the phase's 200
    # before (and after, once the mean has followed: the first two settings compared).
    ("scale", "sparse", "auto", [(2, 200), (2, 100)]),
])
def test_phase_bins_scale_follows_each_phases_h_on_the_pushes(cluster, phase_bins, pull,
                                                              bin_schedule, expected):
    # local_steps="2@4,4" at bin 400: the second phase (from step 4 on, after 2 exchanges)
    # pushes at 400 * 2 / 4 with phase_bins="scale" (the default); "keep" leaves the first
    # phase's bin.
    def rank(w):
        spy = BinsSet(w)
        kwargs = {"phase_bins": phase_bins} if phase_bins == "keep" else {}
        p, opt = wrapped(spy, local_steps="2@4,4", pull=pull, bin_size=400,
                         bin_schedule=bin_schedule, **kwargs)
        if bin_schedule == "auto":
            opt._exchange.bins.schedule.start_step = 0
        for s in range(8):
            opt.optimizer.param_groups[0]["lr"] = 0.05 if s < 4 or bin_schedule == "off" \
                else 0.03
            train(p, opt, w.rank, 1, first=s)
        got = [(pushes, size) for pushes, name, size in spy.bins if name == "p"]
        return got[:2] if bin_schedule == "auto" else got
    assert run_ranks(mean_cluster(cluster), 2, rank, timeout=TIMEOUT) == [expected] * 2


@pytest.mark.parametrize("phases,lr_fall,said", [
    ("2@4,4", False, "local_steps phase 2 of 2 from step 4: an exchange every 4 steps, "
                     "the push bins x 2/4 (phase_bins=scale)"),
    ("2@lr/1.5,4", True, "local_steps phase 2 of 2 from step 4: an exchange every 4 steps, "
                         "the push bins x 2/4 (phase_bins=scale); the lr 0.03 is at most "
                         "its peak 0.05 / 1.5"),
])
def test_rank_0_says_when_a_phase_begins(cluster, capsys, phases, lr_fall, said):
    # A phase changes the job's traffic: rank 0 says once, on stderr, when and why (the
    # other ranks say nothing; the lines before the switch say nothing of it).
    def rank(w):
        p, opt = wrapped(w, local_steps=phases, bin_size=400)
        for s in range(8):
            opt.optimizer.param_groups[0]["lr"] = 0.03 if lr_fall and s >= 4 else 0.05
            train(p, opt, w.rank, 1, first=s)
    run_ranks(mean_cluster(cluster), 2, rank, timeout=TIMEOUT)
    lines = [x for x in capsys.readouterr().err.splitlines() if "local_steps phase" in x]
    assert lines == ["adaps.torch: " + said]


class CountingWorker:
    """A worker that counts push_pull calls and passes everything on."""

    def __init__(self, w):
        self._w, self.push_pulls = w, 0

    def push_pull(self, *args):
        self.push_pulls += 1
        return self._w.push_pull(*args)

    def __getattr__(self, name):
        return getattr(self._w, name)


@pytest.mark.parametrize("own_updates,pull", [("off", "sparse"), ("share", "sparse"),
                                             ("off", "recompressed")])
def test_only_every_h_th_step_sends_and_the_replicas_meet_there(cluster, own_updates, pull):
    # 4 local steps: the steps between push nothing (no push_pull, no bytes); an exchange
    # pushes once per tensor. With own_updates="off" the replicas are equal after each
    # exchange; with "share" each worker's model is the replica plus 1/W of its residue
    # (e.held) there, and the replica (the model less it) is every worker's. Recompressed
    # pulls (the servers' running sum of the exchanges' means) give every replica the same.
    h, steps = 4, 12

    def rank(w):
        counting = CountingWorker(w)
        p, opt = wrapped(counting, local_steps=h, own_updates=own_updates,
                         second_moment="global", pull=pull)
        assert opt.pull == pull
        calls, wire, replicas = [], [], []
        for s in range(steps):
            train(p, opt, w.rank, 1, first=s)
            t = w.traffic("p")
            calls.append(counting.push_pulls)
            wire.append(t["push_wire_bytes"] + t["pull_wire_bytes"])
            held = opt._params[0].held
            replicas.append(p.detach() - (held.view_as(p) if held is not None else 0))
        return calls, wire, replicas, opt._local_step
    r0, r1 = run_ranks(mean_cluster(cluster), 2, rank, timeout=TIMEOUT)
    for calls, wire, _, local_step in (r0, r1):
        assert calls == [(s + 1) // h for s in range(steps)], calls
        for s in range(1, steps):
            assert (wire[s] > wire[s - 1]) == ((s + 1) % h == 0), (s, wire)
        assert local_step == 0
    for s in range(steps):
        if (s + 1) % h:
            assert not torch.allclose(r0[2][s], r1[2][s], atol=1e-3), s  # each its own
        elif own_updates == "off":
            assert torch.equal(r0[2][s], r1[2][s]), s
        else:
            assert torch.allclose(r0[2][s], r1[2][s], atol=1e-5), s


@pytest.mark.parametrize("h,outer,saved_at,since,phase_bins", [
    (4, "nesterov", 6, 2, "keep"), ("2@4,3", "average", 5, 1, "keep"),
    ("2@lr/2,3", "average", 5, 1, "keep"), ("2@4,3", "average", 5, 1, "scale")])
def test_state_dict_keeps_the_local_steps_the_anchor_and_the_outer_momentum(
        cluster, h, outer, saved_at, since, phase_bins):
    # A run saved after `saved_at` steps (`since` after an exchange; H = 4 with outer
    # Nesterov, or phases: 2 until step 4 then 3, or 2 until the lr halves, which it does at
    # step 4, then 3) and resumed on a new cluster from the model and each rank's
    # state_dict() goes on bit for bit as the run that was not stopped: the steps since the
    # exchange, the phase (the H of the interval saved in), where the exchange left the model
    # (the changes since are sent at the next one) and the outer momentum are kept; with
    # phase_bins="scale" the phase's push bins are set at load, before its next exchange.
    steps = 12

    def lr(opt, s):
        if isinstance(h, str) and "lr" in h:
            opt.optimizer.param_groups[0]["lr"] = 0.05 if s < 4 else 0.02

    def steps_from(p, opt, w, first, last):
        out = []
        for s in range(first, last):
            lr(opt, s)
            out += train(p, opt, w.rank, 1, first=s)
        return out

    def straight(w):
        p, opt = wrapped(w, local_steps=h, outer=outer, phase_bins=phase_bins)
        steps_from(p, opt, w, 0, saved_at)
        saved = (p.detach().clone(), copy.deepcopy(opt.state_dict()))
        return saved, steps_from(p, opt, w, saved_at, steps)
    run = run_ranks(mean_cluster(cluster), 2, straight, timeout=TIMEOUT)
    assert run[0][0][1]["adaps"]["local_steps"]["step"] == since

    def resumed(w):
        (model, state), _ = run[w.rank]
        p, opt = wrapped(w, local_steps=h, outer=outer, phase_bins=phase_bins)
        with torch.no_grad():
            p.copy_(model)  # (every rank's model is its own between exchanges)
        opt.load_state_dict(state)
        return steps_from(p, opt, w, saved_at, steps)
    again = run_ranks(mean_cluster(cluster), 2, resumed, timeout=TIMEOUT)
    for rank in range(2):
        for a, b in zip(run[rank][1], again[rank]):
            assert torch.equal(a, b), rank


def test_a_checkpoint_of_other_local_steps_is_refused_before_anything_is_loaded(cluster):
    def rank(w):
        p, opt = wrapped(w, local_steps=4)
        train(p, opt, w.rank, 3)
        state = copy.deepcopy(opt.state_dict())
        m2 = nn.Module()
        m2.q = p2 = nn.Parameter(torch.zeros(N))  # another name: another declaration
        opt2 = adaps.torch.DistributedOptimizer(
            torch.optim.Adam([p2], lr=0.05), m2, w, server_optimizer="mean",
            compression="adacomp", local_steps=2)
        with pytest.raises(ValueError, match="local_steps it was saved with"):
            opt2.load_state_dict(state)
        return opt2._local_step, len(opt2.optimizer.state)
    assert run_ranks(mean_cluster(cluster), 2, rank, timeout=TIMEOUT) == [(0, 0)] * 2


@pytest.mark.parametrize("bad,why", [
    (0, "must be an int >= 1"), (-1, "must be an int >= 1"), (1.5, "must be an int >= 1"),
    ("2", "must be an int >= 1"), (True, "must be an int >= 1"),
    ("4@6,8", "not a positive multiple of 4 steps"), ("4@8,2@8,1", "not a positive multiple"),
    ("4@8", "phases are H@END"), ("4@lr/1,8", "phases are H@END"), ("4@lr/x,8", "H@END"),
    ("0@8,4", "phases are H@END"), ("4,8", "must be an int >= 1")])
def test_a_bad_local_steps_is_refused(bad, why):
    m = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=why):
        adaps.torch.DistributedOptimizer(torch.optim.Adam(m.parameters()), m, object(),
                                         server_optimizer="mean", local_steps=bad)


def test_local_steps_from_the_environment_and_a_bad_value_there(monkeypatch):
    m = nn.Linear(2, 2)
    monkeypatch.setenv("ADAPS_LOCAL_STEPS", "four")
    with pytest.raises(ValueError, match="ADAPS_LOCAL_STEPS"):
        adaps.torch.DistributedOptimizer(torch.optim.Adam(m.parameters()), m, object(),
                                         server_optimizer="mean")
    monkeypatch.setenv("ADAPS_LOCAL_STEPS", "0")
    with pytest.raises(ValueError, match="local_steps must be an int >= 1"):
        adaps.torch.DistributedOptimizer(torch.optim.Adam(m.parameters()), m, object(),
                                         server_optimizer="mean")
    monkeypatch.setenv("ADAPS_OUTER", "adam")
    monkeypatch.setenv("ADAPS_LOCAL_STEPS", "4")
    with pytest.raises(ValueError, match="unknown outer 'adam'"):
        adaps.torch.DistributedOptimizer(torch.optim.Adam(m.parameters()), m, object(),
                                         server_optimizer="mean")


@pytest.mark.parametrize("how", ["server mode", "dense pushes", "gradient exchange",
                                 "nesterov with dense pushes"])
def test_local_steps_without_the_update_exchange_are_refused_naming_what_works(how):
    m = nn.Linear(2, 2)
    kwargs = {"server mode": dict(server_optimizer="adam"),
              "dense pushes": dict(server_optimizer="mean", compression="dense"),
              "gradient exchange": dict(server_optimizer="mean", exchange="gradient"),
              "nesterov with dense pushes": dict(server_optimizer="mean",
                                                 compression="dense", local_steps=1,
                                                 outer="nesterov")}[how]
    kwargs.setdefault("local_steps", 4)
    with pytest.raises(ValueError, match=r"need local mode's update exchange.*"
                                         r"--optimizer=mean.*exchange=\"update\""):
        adaps.torch.DistributedOptimizer(torch.optim.Adam(m.parameters()), m, object(),
                                         **kwargs)


def test_a_large_embedding_goes_through_the_update_exchange_with_local_steps(cluster):
    # row_sparse would exchange its gradient every step: with local steps it is exchanged
    # as the rest, every H steps.
    def rank(w):
        m = nn.Embedding(5000, 4)
        opt = adaps.torch.DistributedOptimizer(torch.optim.Adam(m.parameters()), m, w,
                                               server_optimizer="mean", local_steps=2)
        return opt._params[0].row_sparse
    assert run_ranks(mean_cluster(cluster), 2, rank, timeout=TIMEOUT) == [False] * 2


@pytest.mark.parametrize("flag,sent", [("3", [3, 6]), ("2@2,4", [2, 6]),
                                       ("2@lr/2,4", [2, 4, 6])])
def test_launch_local_steps_reaches_a_script_that_reads_no_environment(flag, sent):
    code, out = run_launch(["-n", "2", "--local-steps", flag,
                            os.path.join(HERE, "local_steps_worker.py")], timeout=TIMEOUT)
    assert code == 0, out
    assert out.count("LOCAL local_steps=%s outer=average sent_after=%s" % (flag, sent)) == 2, out


@pytest.mark.parametrize("flag", ["0", "4@", "4@lr,8", "4,8", "x"])
def test_launch_refuses_a_bad_local_steps_before_starting_anything(flag):
    code, out = run_launch(["-n", "2", "--local-steps", flag,
                            os.path.join(HERE, "local_steps_worker.py")], timeout=TIMEOUT)
    assert code == 2 and "--local-steps" in out and "H@END" in out, out



@pytest.mark.parametrize("h, named, expected", [
    (4, {}, {"fc.weight": 125, "fc.bias": 125}),       # the default bin 500 / H
    (16, {}, {"fc.weight": 31, "fc.bias": 31}),
    (64, {}, {"fc.weight": 25, "fc.bias": 25}),      # ... down to 25 (not 7)
    (1, {}, {"fc.weight": 500, "fc.bias": 500}),       # every step: the default bin
    (4, {"bin_size": 400}, {"fc.weight": 400, "fc.bias": 400}),  # a bin named is kept
    (4, {"bin_sizes": {"fc.weight": 300}}, {"fc.weight": 300, "fc.bias": 125}),
])
def test_local_steps_declare_the_default_bin_divided_by_h(cluster, h, named, expected):
    # Each exchange sends H steps' change, and what a residue holds back waits whole
    # exchanges: unless a bin is named, a non-convolution AdaComp tensor is declared at
    # bin_size / H (docs/local-steps.md); the convolution keeps its bin (50, bias too).
    def rank(w):
        torch.manual_seed(0)
        m = nn.Sequential()
        m.add_module("conv", nn.Conv2d(2, 4, 3))
        m.add_module("fc", nn.Linear(40, 30))
        spy = Declared(w)
        opt = adaps.torch.DistributedOptimizer(
            torch.optim.Adam(m.parameters(), lr=1e-2), m, spy, server_optimizer="mean",
            compression="adacomp", local_steps=h, **named)
        for _ in range(h):  # one exchange goes through at those bins
            opt.zero_grad()
            (m.conv(torch.randn(2, 2, 5, 5)).sum() + m.fc(torch.randn(8, 40)).pow(2).mean()
             ).backward()
            opt.step()
        return {n: kw["bin_size"] for n, kw in spy.declared.items() if "bin_size" in kw}
    conv = {"conv.weight": 50, "conv.bias": 50}
    assert run_ranks(mean_cluster(cluster), 2, rank, timeout=TIMEOUT) == \
        [dict(conv, **expected)] * 2


def job_with_a_joiner(cluster, h, join, **kwargs):
    """A local-mode job of two workers (wrapped(w, local_steps=h, **kwargs)) that train 2h
    steps, wait while a third worker joins and runs join(w, joined, result) (which sets the
    event `joined` once it has its optimizer, or fails), then train 2h more steps. Returns the
    two workers' last parameters and `result` ("error": what the joiner raised)."""
    import threading
    c = cluster(2, server_args=["--optimizer=mean"], scheduler_args=["--max_workers=3"])
    asked, joined, result = threading.Event(), threading.Event(), {}

    def joiner():
        asked.wait(TIMEOUT)
        w = adaps.Worker(scheduler=c.address, register_timeout=20, request_timeout=120)
        try:
            join(w, joined, result)
        except Exception as e:  # (the test's assertions report it)
            result["error"] = str(e)
        finally:
            joined.set()
            w.stop()

    def rank(w):
        p, opt = wrapped(w, local_steps=h, **kwargs)
        train(p, opt, w.rank, 2 * h)
        if w.rank == 0:
            asked.set()
        assert joined.wait(TIMEOUT)
        return train(p, opt, w.rank, 2 * h, first=2 * h)[-1]

    t = threading.Thread(target=joiner, daemon=True)
    t.start()
    last = run_ranks(c.address, 2, rank, timeout=TIMEOUT)
    t.join(TIMEOUT)
    assert torch.equal(last[0], last[1])
    return last, result


@pytest.mark.parametrize("h,kwargs,why", [
    (1, {"compression": "dense"}, 'exchange="gradient"'),
    (3, {"outer": "nesterov"}, "outer='nesterov'"),
])
def test_a_worker_joining_a_local_mode_job_whose_servers_lack_the_model_is_refused(
        cluster, h, kwargs, why):
    """Where the servers do not hold the model (the gradient exchange: each step's mean
    gradient only; DiLoCo's outer momentum: each worker's own), a worker that joined a
    running job would start from its own (or rank 0's initial) values and stay offset from
    the others for good: it is refused, naming what works, before it declares its tensors,
    and the job's own workers finish without waiting for it."""
    def join(w, joined, result):
        wrapped(w, local_steps=h, **kwargs)

    _, result = job_with_a_joiner(cluster, h, join, **kwargs)
    assert result.get("error") is not None, "the joiner was let train offset"
    assert "joined a running job" in result["error"] and "server mode" in result["error"]
    assert why in result["error"], result["error"]


def test_a_worker_joining_a_job_with_local_steps_phases_is_refused(cluster):
    """A joiner's steps count from its own first: with phases it cannot tell which one the
    job is in, and is refused, saying what to give it instead."""
    def join(w, joined, result):
        wrapped(w, local_steps="2@lr/2,4")

    _, result = job_with_a_joiner(cluster, 2, join)
    assert result.get("error") is not None, "the joiner was let in"
    assert "cannot tell which phase" in result["error"], result["error"]
    assert "local_steps=4" in result["error"], result["error"]


@pytest.mark.parametrize("h,pull", [(1, "recompressed"), (3, "recompressed"), (1, "sparse"),
                                    (3, "sparse"), (3, "dense")])
def test_a_worker_joining_a_local_mode_job_trains_where_the_others_are(cluster, h, pull):
    """The servers keep the running sum of the exchanges' means (the slice itself with
    pull="recompressed"; beside the step's mean with exact pulls, TensorSpec::keep_sum), so a
    worker that joins a running local-mode job starts where every replica is (the job's
    initial parameters plus that sum) and trains on with the others: after two more
    exchanges its model is theirs, to float rounding (a joiner that started from its own
    values stayed 0.22 off at H = 1, 0.60 at H = 3; exact pulls were refused for that
    before the servers kept the sum beside them)."""
    import warnings

    def join(w, joined, result):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            p, opt = wrapped(w, local_steps=h, pull=pull)
        result["warned"] = any("joined a running local-mode job" in str(x.message)
                               for x in caught)
        result["start"] = p.detach().clone()
        joined.set()
        result["last"] = train(p, opt, w.rank, 2 * h, first=2 * h)[-1]

    last, result = job_with_a_joiner(cluster, h, join, pull=pull)
    assert "error" not in result, result["error"]
    assert result["warned"]
    assert float((result["start"] - start_values()).abs().max()) > 0.05, \
        "the joiner started from the job's start, not where the job is"
    off = float((result["last"] - last[0]).abs().max())
    assert off < 1e-4, off


@pytest.mark.parametrize("pull", ["recompressed", "sparse"])
def test_launch_join_adds_a_worker_to_a_local_mode_job(tmp_path, pull):
    """As users launch it: a local-mode job (adaps.launch -n 2 --max-workers 3
    --server-optimizer mean, pulls recompressed or exact) that adaps.launch --join adds a
    worker to: the joiner is let in (warned), starts where the job's replicas are (moved from
    the job's start) rather than from that start, trains and leaves; everyone exits 0."""
    address_file = str(tmp_path / "address")
    script = os.path.join(HERE, "local_join_worker.py")
    common = ["--server-optimizer", "mean", "--pull", pull]
    _, (code, out), (job_code, job_out) = launch_and_join(
        ["-n", "2", "--max-workers", "3"] + common + [script, "400", address_file],
        address_file, ["-n", "1"] + common + [script, "40"], timeout=TIMEOUT)
    assert code == 0, out
    assert job_code == 0, job_out
    assert "joiners are refused" not in job_out, job_out
    joined = [l for l in out.splitlines() if "RANK" in l]
    assert len(joined) == 1 and "RANK 2 JOINED True" in joined[0], out
    assert float(joined[0].split("BEGAN ")[1].split()[0]) > 0.01, joined[0]
    originals = [l for l in job_out.splitlines() if "RANK" in l]
    assert len(originals) == 2 and all("JOINED False BEGAN 0.000000" in l for l in originals), \
        job_out

    def first_loss(line):
        return float(line.split("LOSS ")[1].split()[0])
    # The joiner's model at its start is the trained one (53.5 -> 34.7 when written), not
    # the job's start.
    assert first_loss(joined[0]) < 0.9 * first_loss(originals[0]), (joined, originals)


def test_launch_says_at_start_when_a_local_mode_jobs_joiners_would_be_refused(monkeypatch):
    """An elastic local-mode job whose servers would not hold the model (the gradient
    exchange, the default when every layer is sent dense; DiLoCo's outer momentum) would
    refuse every joiner: adaps.launch says so when it starts the job."""
    import types
    from adaps import launch
    for name in ("ADAPS_EXCHANGE", "ADAPS_COMPRESSION", "ADAPS_OUTER", "ADAPS_LOCAL_STEPS"):
        monkeypatch.delenv(name, raising=False)

    def job(**kw):
        a = dict(pull=None, workers=2, nodes=1, server_optimizer="mean", exchange=None,
                 compression=None)
        a.update(kw)
        return types.SimpleNamespace(**a)
    assert not launch._local_joins_refused(job())  # AdaComp: the update exchange
    assert not launch._local_joins_refused(job(pull="sparse"))
    assert not launch._local_joins_refused(job(compression="conv:dense"))
    assert launch._local_joins_refused(job(compression="dense"))
    assert launch._local_joins_refused(job(exchange="gradient"))
    assert not launch._local_joins_refused(job(compression="dense", exchange="update"))
    assert not launch._local_joins_refused(job(server_optimizer="adam", compression="dense"))
    monkeypatch.setenv("ADAPS_OUTER", "nesterov")
    assert launch._local_joins_refused(job())
    monkeypatch.delenv("ADAPS_OUTER")
    monkeypatch.setenv("ADAPS_COMPRESSION", "dense")
    assert launch._local_joins_refused(job())
    monkeypatch.delenv("ADAPS_COMPRESSION")
    monkeypatch.setenv("ADAPS_LOCAL_STEPS", "4@lr/2,64")  # phases: a joiner counts its own
    assert launch._local_joins_refused(job())
    monkeypatch.setenv("ADAPS_LOCAL_STEPS", "64")
    assert not launch._local_joins_refused(job())


def test_a_worker_leaving_between_exchanges_holds_up_nobody(cluster):
    """Of 3 workers at H = 3, rank 2 leaves after 4 steps (between two exchanges; leave()
    pushes its residue as its next exchange): the others' later exchanges average over the 2
    live workers, end, and their replicas stay equal."""
    import threading
    c = cluster(3, server_args=["--optimizer=mean"])
    out, errors = {}, []

    def body():
        w = adaps.Worker(scheduler=c.address, register_timeout=20, request_timeout=15)
        try:
            rank = w.rank
            p, opt = wrapped(w, local_steps=3)
            steps = 4 if rank == 2 else 15
            train(p, opt, rank, steps)
            if rank == 2:
                out[rank] = (p.detach().clone(), 3)
                w.leave()
                return
            end = time.time() + TIMEOUT  # (the view of the leave travels on its own)
            while w.live_workers != 2 and time.time() < end:
                time.sleep(0.05)
            out[rank] = (p.detach().clone(), w.live_workers)
        except BaseException as e:  # reported below
            errors.append(e)
        finally:
            w.stop()

    threads = [threading.Thread(target=body, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert not errors, errors
    assert sorted(out) == [0, 1, 2], out
    assert out[0][1] == 2 and out[1][1] == 2
    assert torch.equal(out[0][0], out[1][0])
