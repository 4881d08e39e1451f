"""adaps.torch on the worker library's device path (a parameter on a GPU: its residues there,
AdaComp there, only the update crossing to the host), run here with the device emulated in
host memory (adaps.Worker(emulate_devices=True)): every call of the path is made, the CPU
codec doing the GPU's part. The same training on the host path must end bit for bit where
this one does. 2 ranks in threads on a real local cluster."""
import threading

import pytest
import torch
import torch.nn as nn

import adaps
import adaps.torch
from torch_ranks import Declared, run_ranks


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 64)
        self.fc2 = nn.Linear(64, 5)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


_MODEL_LOCK = threading.Lock()


def train(address, emulate, make_opt=None, **settings):
    make_opt = make_opt or (lambda params: torch.optim.SGD(params, lr=0.1))

    def rank(w):
        rec = Declared(w)
        with _MODEL_LOCK:  # (the ranks are threads: torch's global generator is shared)
            torch.manual_seed(0)
            m = Mlp()
        opt = adaps.torch.DistributedOptimizer(make_opt(m.parameters()), m, rec, bin_size=50,
                                               **settings)
        gen = torch.Generator().manual_seed(5 + w.rank)
        for _ in range(6):
            opt.zero_grad()
            x = torch.randn(16, 20, generator=gen)
            y = torch.randint(0, 5, (16,), generator=gen)
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
        devices = {n: d.get("device", -1) for n, d in rec.declared.items()}
        traffic = {n: w.traffic(n) for n in rec.declared}
        return devices, [p.detach().clone() for p in m.parameters()], traffic
    return run_ranks(address, 2, rank, emulate_devices=emulate)


def check_same(cluster, server_kind, **settings):
    host = train(cluster(2, server_args=["--optimizer=" + server_kind]).address, False,
                 **settings)
    dev = train(cluster(2, server_args=["--optimizer=" + server_kind]).address, True,
                **settings)
    steps = 6 // settings.get("local_steps", 1)
    for (d_h, p_h, t_h), (d_d, p_d, t_d) in zip(host, dev):
        assert set(d_h.values()) == {-1}, d_h
        assert d_d["fc1.weight"] == 0 and d_d["fc2.weight"] == 0, d_d
        for a, b in zip(p_h, p_d):
            assert torch.equal(a, b)
        for n in ("fc1.weight", "fc2.weight"):
            # (The wire bytes differ: on the host small tensors share fusion buckets.)
            assert t_h[n]["pushes"] == t_d[n]["pushes"] == steps, n
            assert t_h[n]["push_dense_bytes"] == t_d[n]["push_dense_bytes"], n
    return dev


def test_server_mode_on_an_emulated_device_is_the_host_path_bit_for_bit(cluster):
    check_same(cluster, "sgd", server_optimizer="sgd", pull="recompressed")


def test_local_gradient_exchange_on_an_emulated_device_is_the_host_path_bit_for_bit(cluster):
    dev = check_same(cluster, "mean", exchange="gradient", pull="dense")
    # and the two ranks trained the same model (DDP's arithmetic)
    for a, b in zip(dev[0][1], dev[1][1]):
        assert torch.equal(a, b)


def test_local_update_exchange_defaults_with_adam_on_an_emulated_device(cluster):
    # The default of local mode with AdaComp: each worker's own Adam step pushed, the exact
    # mean pulled (sparse below 8 workers), the global second moment and the own share.
    dev = check_same(cluster, "mean",
                     make_opt=lambda params: torch.optim.Adam(params, lr=1e-2))
    for a, b in zip(dev[0][1], dev[1][1]):
        assert not torch.equal(a, b)  # (each keeps its own share of its residue)


def test_local_steps_with_recompressed_pulls_and_nesterov_on_an_emulated_device(cluster):
    # The running sum of recompressed pulls (its change taken on the device) and DiLoCo's
    # outer step, every second step.
    check_same(cluster, "mean", pull="recompressed", local_steps=2, outer="nesterov")


def test_a_library_without_cuda_says_so_and_the_host_path_stays(cluster):
    # A CUDA parameter with a library built without CUDA is staged through host memory as
    # before; asking the library for a device tensor names the reason.
    address = cluster(1).address

    def rank(w):
        v = torch.zeros(8)
        try:
            w.declare("t", v.numpy(), device=0)
        except adaps.Error as err:
            return err.code_name, str(err)
        return "OK", ""
    (code, why), = run_ranks(address, 1, rank)
    if adaps.CUDA_BUILT:
        assert code in ("OK", "UNAVAILABLE"), (code, why)
    else:
        assert code == "UNIMPLEMENTED" and "without CUDA" in why, (code, why)


def test_a_device_that_does_not_open_leaves_the_parameters_on_the_host_path(cluster,
                                                                          monkeypatch):
    # A library with CUDA on a machine whose driver is older than its runtime, or a GPU its
    # kernels were not built for: the declaration on the device fails before anything is
    # declared, adaps.torch warns once and stages those parameters as before; the model is
    # the host path's bit for bit. (Here the device is asked for a CPU parameter of a worker
    # that does not emulate devices: the library says no GPU, or no CUDA.)
    import adaps.torch_exchange as ex
    host = train(cluster(2, server_args=["--optimizer=sgd"]).address, False,
                 server_optimizer="sgd", pull="recompressed")
    monkeypatch.setattr(ex.Exchange, "_device_of", lambda self, e, pull: 0)
    monkeypatch.setattr(ex, "_device_path_off", None)
    with pytest.warns(UserWarning, match="device path cannot be used here"):
        fell = train(cluster(2, server_args=["--optimizer=sgd"]).address, False,
                     server_optimizer="sgd", pull="recompressed")
    assert ex._device_path_off is not None
    for (d_h, p_h, _), (d_f, p_f, _) in zip(host, fell):
        assert d_f["fc1.weight"] == -1, d_f  # (declared again, on the host)
        for a, b in zip(p_h, p_f):
            assert torch.equal(a, b)
