"""adaps.torch broadcasts (rank 0's values become everyone's) and the dtype/device boundary.
2 ranks in threads on a real local cluster."""
import pytest
import torch
import torch.nn as nn

import adaps.torch
from adaps.torch_broadcast import _as_bytes
from torch_ranks import run_ranks


class BnNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.bn = nn.BatchNorm1d(4)
        self.frozen = nn.Linear(4, 2)
        self.frozen.weight.requires_grad_(False)
        self.frozen.bias.requires_grad_(False)

    def forward(self, x):
        return self.frozen(self.bn(self.fc(x)))


@pytest.mark.parametrize("kind", ["sgd", "mean"])
def test_frozen_parameters_and_batchnorm_buffers_come_from_rank_0(cluster, kind):
    address = cluster(2, server_args=["--optimizer=" + kind]).address

    def rank(w):
        m = BnNet()
        with torch.no_grad():
            for t in m.state_dict().values():
                t.fill_(w.rank + 2)  # running stats, num_batches_tracked, frozen weights
        adaps.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m, w,
                                         server_optimizer=kind, compression="dense")
        return {k: v.clone() for k, v in m.state_dict().items()}
    r0, r1 = run_ranks(address, 2, rank)
    assert r0.keys() == r1.keys() and "bn.num_batches_tracked" in r0
    for k in r0:
        assert torch.equal(r0[k], r1[k]), k
        assert torch.all(r0[k] == 2), k  # rank 0's


def test_broadcasts_carry_every_dtype_bit_for_bit_and_refuse_a_different_model(cluster):
    address = cluster(2, server_args=["--optimizer=sgd"]).address

    def rank(w):
        g = torch.Generator().manual_seed(w.rank)
        tensors = {"f64": torch.randn(5, dtype=torch.float64, generator=g),
                   "bf16": torch.randn(3, generator=g).to(torch.bfloat16),
                   "i64": torch.randint(-2**62, 2**62, (4,), generator=g),
                   "bool": torch.rand(3, generator=g) > 0.5, "scalar": torch.tensor(w.rank + 7.5),
                   "nan": torch.tensor([float("nan"), float("-inf")])}
        adaps.torch.broadcast_parameters(tensors, w)
        obj = adaps.torch.broadcast_object({"rank": w.rank, "t": torch.arange(3)}, w)
        wrong = {"x": torch.zeros(2 + w.rank)} if w.rank else {"y": torch.zeros(3)}
        mismatch = None
        try:
            adaps.torch.broadcast_parameters(wrong, w)
        except ValueError as e:
            mismatch = str(e)
        return tensors, obj, mismatch
    (t0, o0, m0), (t1, o1, m1) = run_ranks(address, 2, rank)
    for k in t0:
        assert t0[k].dtype == t1[k].dtype and t0[k].shape == t1[k].shape, k
        assert _as_bytes(t0[k]) == _as_bytes(t1[k]), k
    assert float(t1["scalar"]) == 7.5
    assert o1["rank"] == 0 and torch.equal(o1["t"], torch.arange(3))
    assert m0 is None and "differ from rank 0's" in m1


def test_server_mode_trains_half_parameters_on_float32_masters(cluster):
    address = cluster(2, server_args=["--optimizer=sgd"]).address

    def rank(w):
        m = nn.Module()
        m.p = nn.Parameter(torch.zeros(4, dtype=torch.float16))
        opt = adaps.torch.DistributedOptimizer(torch.optim.SGD([m.p], lr=1e-4), m, w,
                                               server_optimizer="sgd", compression="dense")
        for _ in range(10):
            opt.zero_grad()
            m.p.sum().backward()
            opt.step()
        return m.p.detach().clone()
    for p in run_ranks(address, 2, rank):
        # fp16 alone would round 1e-4 steps; the servers' float32 masters do not.
        assert p.dtype == torch.float16
        assert torch.equal(p, torch.full((4,), -1e-3).half())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_cuda_parameters_are_staged_through_pinned_host_memory(cluster):
    address = cluster(2, server_args=["--optimizer=mean"]).address

    def rank(w):
        m = nn.Linear(3, 2).cuda()
        opt = adaps.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m, w,
                                               server_optimizer="mean", compression="dense")
        opt.zero_grad()
        m(torch.full((1, 3), float(w.rank + 1), device="cuda")).sum().backward()
        opt.step()
        assert opt._params[0].stage.is_pinned()
        return m.weight.grad.cpu(), m.weight.detach().cpu()
    (g0, w0), (g1, w1) = run_ranks(address, 2, rank)
    assert torch.equal(g0, g1) and torch.equal(w0, w1)
    assert torch.allclose(g0, torch.full((2, 3), 1.5))
