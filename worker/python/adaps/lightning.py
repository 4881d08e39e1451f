"""adaps.lightning: PyTorch Lightning (2.x) training through adaps, a two-line change.

    from adaps.lightning import AdapsStrategy                     # 1
    trainer = lightning.Trainer(strategy=AdapsStrategy(),         # 2
                                accelerator="cpu", max_epochs=3)
    trainer.fit(model, train_loader)

and start the script with `python3 -m adaps.launch -n 2 --server-optimizer mean train.py`
(every process runs the whole script; adaps.launch starts the scheduler and the servers).
AdapsStrategy(**kwargs) hands its keyword arguments to adaps.torch.DistributedOptimizer
(compression, bin_size, pull, exchange, own_updates, ...; those adaps.launch exported apply
otherwise); worker= an adaps.Worker (default: adaps.worker_from_env() when the Trainer
sets up the environment).

What it does: registers the worker at the point DDP connects its process group; ranks and
world size are the worker's; every DataLoader gets a DistributedSampler over the workers
(each trains on its own shard); after Lightning creates the optimizer and LR schedulers it
wraps the optimizer in DistributedOptimizer in local mode (schedulers keep working: they
share param_groups); accumulate_grad_batches runs the passes but the last under no_sync()
(DDP's way); a gradient exchange synchronizes right after backward so gradient clipping
clips the mean gradient; with local_steps=H the steps since the last exchange are
exchanged before each validation and when training ends
(DistributedOptimizer.exchange_now), so every rank validates and keeps the same model;
barrier, broadcast (from rank 0), reduce (mean, sum, max, min; self.log(sync_dist=True),
EarlyStopping and ModelCheckpoint decisions) and all_gather go through small dense tensors
on the servers; checkpoints are written by rank 0 only. The worker is stopped when the
process exits (or by close()), so trainer.test() may follow trainer.fit(). One
trainer.fit() per process: its tensors stay declared on the servers.

What it refuses, at setup, with what to do instead: servers that run an optimizer (server
mode): start them with --server-optimizer mean; several optimizers (e.g. a GAN's manual
optimization): one optimizer over every parameter, or adaps.torch by hand; an accelerator
other than the CPU (untested here); devices > 1 per process: adaps.launch -n N starts the
processes; backward_passes_per_step: use Trainer(accumulate_grad_batches=N).
"""
import atexit
import inspect
import os
import pickle
from contextlib import ExitStack, contextmanager

import numpy as np
import torch

try:
    import lightning.pytorch as pl
    from lightning.pytorch.accelerators import CPUAccelerator
    from lightning.pytorch.strategies.parallel import ParallelStrategy
    from lightning.pytorch.trainer.states import TrainerFn
    from lightning.pytorch.utilities.rank_zero import rank_zero_only
    from lightning_utilities.core.rank_zero import rank_zero_only as _utils_rank_zero_only
except ImportError as e:  # pragma: no cover - exercised by a subprocess test
    raise ImportError("adaps.lightning needs PyTorch Lightning 2.x: pip install lightning "
                      "(%s)" % e) from e

import adaps
import adaps.torch

__all__ = ["AdapsStrategy"]

PREFIX = "__adaps_lightning__/"
# DistributedOptimizer's arguments that the strategy decides itself.
_OWN = ("self", "optimizer", "model", "worker", "mode", "server_optimizer",
        "backward_passes_per_step")
_ALLOWED = tuple(n for n in inspect.signature(adaps.torch.DistributedOptimizer.__init__)
                 .parameters if n not in _OWN)


def _op_name(op):
    name = getattr(op, "name", None) or str(op)
    name = name.split(".")[-1].lower()
    return {"avg": "mean", "product": "prod"}.get(name, name)


class AdapsStrategy(ParallelStrategy):
    """Lightning's ParallelStrategy over adaps (local mode); see the module docstring."""

    strategy_name = "adaps"

    def __init__(self, worker=None, accelerator=None, checkpoint_io=None,
                 precision_plugin=None, **optimizer_kwargs):
        super().__init__(accelerator=accelerator, checkpoint_io=checkpoint_io,
                         precision_plugin=precision_plugin)
        if "backward_passes_per_step" in optimizer_kwargs:
            raise ValueError("AdapsStrategy: backward_passes_per_step is Lightning's "
                             "Trainer(accumulate_grad_batches=N) here; pass that instead")
        unknown = sorted(set(optimizer_kwargs) - set(_ALLOWED))
        if unknown:
            raise TypeError("AdapsStrategy: unknown argument(s) %s; it takes worker= and "
                            "DistributedOptimizer's %s" % (", ".join(unknown),
                                                           ", ".join(_ALLOWED)))
        self._worker = worker
        self._owns_worker = False
        self._optimizer_kwargs = optimizer_kwargs
        self._wrapped = []          # the DistributedOptimizers made by setup_optimizers
        self._blocked = False       # inside block_backward_sync (an accumulation pass)
        self._declared = set()

    # -- the worker, ranks and devices -----------------------------------------------
    @property
    def worker(self):
        if self._worker is None:
            raise RuntimeError("AdapsStrategy: no adaps worker yet (it registers when the "
                               "Trainer sets up its environment, at fit/validate/test)")
        return self._worker

    @property
    def is_distributed(self):
        return True  # Lightning's accelerator connector asks custom strategies this

    @property
    def root_device(self):
        return torch.device("cpu")

    @property
    def global_rank(self):
        return self._worker.rank if self._worker is not None else 0

    @property
    def local_rank(self):
        return self.global_rank  # one process per worker; nothing is chosen per node

    @property
    def node_rank(self):
        return 0

    @property
    def world_size(self):
        return self._worker.num_workers if self._worker is not None else 1

    @property
    def distributed_sampler_kwargs(self):
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def model_to_device(self):
        self.model.to(self.root_device)

    def _check_accelerator(self):
        if self.accelerator is not None and not isinstance(self.accelerator, CPUAccelerator):
            raise ValueError(
                "AdapsStrategy: only the CPU accelerator is supported (got %s): use "
                "Trainer(accelerator=\"cpu\"), or adaps.torch.DistributedOptimizer by hand on "
                "a GPU" % type(self.accelerator).__name__)
        if self.parallel_devices is not None and len(self.parallel_devices) > 1:
            raise ValueError(
                "AdapsStrategy: one device per process (got devices=%d): adaps.launch -n N "
                "starts the N processes; use Trainer(devices=1)" % len(self.parallel_devices))

    def setup_environment(self):
        self._check_accelerator()
        super().setup_environment()
        if self._worker is None:
            self._worker = adaps.worker_from_env()
            self._owns_worker = True
            atexit.register(self.close)
        kind = getattr(self._worker, "server_optimizer", "") or \
            os.environ.get("ADAPS_SERVER_OPTIMIZER", "")
        if kind and kind != "mean":
            raise ValueError(
                "AdapsStrategy: the job's servers run --optimizer=%s (adaps' server mode); "
                "the strategy trains in local mode, where Lightning's optimizer runs on "
                "every worker: start the job with `python3 -m adaps.launch "
                "--server-optimizer mean`, or use adaps.torch.DistributedOptimizer by hand "
                "for server mode" % kind)
        rank_zero_only.rank = _utils_rank_zero_only.rank = self.global_rank

    def close(self):
        """Stops the worker this strategy registered (also done at exit); idempotent."""
        if self._owns_worker and self._worker is not None:
            w, self._worker, self._owns_worker = self._worker, None, False
            w.stop()

    # -- optimizers ---------------------------------------------------------------------
    def setup(self, trainer):
        super().setup(trainer)
        if trainer.state.fn != TrainerFn.FITTING:
            # No optimizer to broadcast at its construction: start every replica from rank
            # 0's parameters and buffers, as DDP does outside fitting.
            adaps.torch.broadcast_parameters(self.lightning_module.state_dict(), self.worker)

    def setup_optimizers(self, trainer):
        super().setup_optimizers(trainer)
        real = [o for o in self.optimizers if isinstance(o, torch.optim.Optimizer)
                and type(o).__name__ != "_MockOptimizer"]
        if len(real) > 1:
            raise ValueError(
                "AdapsStrategy: configure_optimizers returned %d optimizers; adaps exchanges "
                "what one optimizer steps (several stepped separately, as a GAN's manual "
                "optimization does, would wait on each other): use one optimizer with a "
                "parameter group per part, or adaps.torch.DistributedOptimizer by hand"
                % len(real))
        wrapped = []
        for opt in self.optimizers:
            if any(opt is o for o in real):
                opt = adaps.torch.DistributedOptimizer(
                    opt, self.lightning_module, self.worker, mode="local",
                    **self._optimizer_kwargs)
                self._wrapped.append(opt)
            wrapped.append(opt)
        self.optimizers = wrapped  # the schedulers keep the torch optimizer (same groups)

    def backward(self, closure_loss, optimizer, *args, **kwargs):
        loss = super().backward(closure_loss, optimizer, *args, **kwargs)
        if not self._blocked:
            # The gradient exchange: p.grad becomes the workers' mean now, so Lightning's
            # gradient clipping (after backward, before step) clips that, as under DDP.
            # (The update exchange only notes it: clipping clips this worker's gradient.)
            for opt in self._wrapped:
                opt.synchronize()
        return loss

    @contextmanager
    def block_backward_sync(self):
        """accumulate_grad_batches: the passes but the last push nothing (no_sync)."""
        with ExitStack() as stack:
            for opt in self._wrapped:
                stack.enter_context(opt.no_sync())
            before, self._blocked = self._blocked, True
            try:
                yield None
            finally:
                self._blocked = before

    # -- collectives ----------------------------------------------------------------------
    def barrier(self, name=None):
        if self._worker is not None:
            self._worker.barrier()

    def broadcast(self, obj, src=0):
        if src != 0:
            raise ValueError("AdapsStrategy.broadcast: only src=0 is supported (adaps "
                             "broadcasts rank 0's values), got src=%r" % (src,))
        if self._worker is None or self.world_size == 1:
            return obj
        data = pickle.dumps(obj) if self.global_rank == 0 else b""
        t = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else \
            torch.zeros(0, dtype=torch.uint8)
        t = adaps.torch.broadcast_object(t, self._worker)
        return pickle.loads(t.numpy().tobytes())

    def _mean(self, kind, flat):
        """The mean over the workers of float32 `flat` (every rank the same size), through
        a dense tensor declared once per size (every rank calls in the same order)."""
        name = "%s%s/%d" % (PREFIX, kind, flat.size)
        if name not in self._declared:
            self._worker.declare(name, np.zeros(flat.size, np.float32),
                                 compression="dense", fuse=False)
            self._declared.add(name)
        out = np.empty(flat.size, np.float32)
        self._worker.push_pull(name, np.ascontiguousarray(flat, np.float32), out).wait()
        return out

    def reduce(self, tensor, group=None, reduce_op="mean"):
        if not isinstance(tensor, torch.Tensor) or self._worker is None:
            return tensor
        op = _op_name(reduce_op if reduce_op is not None else "mean")
        if op in ("max", "min"):
            g = self.all_gather(tensor)
            return g.amax(0) if op == "max" else g.amin(0)
        if op not in ("mean", "sum"):
            raise ValueError("AdapsStrategy.reduce: %r is not supported (mean, sum, max, min)"
                             % (reduce_op,))
        src = tensor.detach().to("cpu", torch.float32).reshape(-1).numpy()
        out = self._mean("reduce", src)
        if op == "sum":
            out = out * self.world_size
        if not tensor.is_floating_point():
            out = np.rint(out)
        dtype = tensor.dtype if tensor.is_floating_point() or op == "sum" else torch.float32
        return torch.from_numpy(out).view(tensor.shape).to(tensor.device, dtype)

    def reduce_boolean_decision(self, decision, all=True):
        total = int(self.reduce(torch.tensor(int(bool(decision))), reduce_op="sum").item())
        return total == self.world_size if all else total > 0

    def all_gather(self, tensor, group=None, sync_grads=False):
        """Every rank's `tensor` (same shape and dtype on each), stacked: shape (W, ...).
        Exact for every dtype: its bytes travel as 16-bit integers in the sender's slot."""
        if sync_grads:
            raise ValueError("AdapsStrategy.all_gather: sync_grads=True is not supported "
                             "(no gradient flows back through adaps)")
        if not isinstance(tensor, torch.Tensor):
            tensor = torch.as_tensor(tensor)
        w = self.world_size
        if self._worker is None or w == 1:
            return tensor.unsqueeze(0)
        t = tensor.detach().to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy()
        if raw.size % 2:
            raw = np.concatenate([raw, np.zeros(1, np.uint8)])
        n16 = raw.size // 2
        buf = np.zeros(max(1, n16) * w, np.float32)
        buf[self.global_rank * n16:(self.global_rank + 1) * n16] = raw.view(np.uint16)
        out = np.rint(self._mean("gather", buf) * w)
        parts = []
        for r in range(w):
            b = out[r * n16:(r + 1) * n16].astype(np.uint16).tobytes()[:t.numel() * t.element_size()]
            parts.append(torch.frombuffer(bytearray(b), dtype=torch.uint8).view(t.dtype)
                         .view(t.shape) if b else torch.zeros_like(t))
        return torch.stack(parts).to(tensor.device)

    # -- local steps: the job's model where it is evaluated and where training ends ----------
    def on_validation_start(self):
        # Every rank validates the same model, as under DDP: the local steps since the last
        # exchange (local_steps=H) are exchanged first (collective: every rank validates at
        # the same step). Nothing to send otherwise.
        self._exchange_now()
        super().on_validation_start()

    def on_train_end(self):
        # A run whose steps are not a multiple of H ends with every replica the same.
        self._exchange_now()
        super().on_train_end()

    def _exchange_now(self):
        for opt in self._wrapped:
            opt.exchange_now()

    # -- the end ----------------------------------------------------------------------------
    def teardown(self):
        for opt in self._wrapped:
            opt.remove_hooks()
        self._wrapped = []
        if self._worker is not None:
            self._worker.barrier()  # nobody leaves while another still reduces
        super().teardown()
