"""adaps.torch's exchanges of pushed gradients: what a step sends and applies, one class a
mode (DistributedOptimizer chooses one at construction; see adaps.torch).

  Exchange          the part every exchange shares: its per-parameter records, declaring
                    the tensors, the residues in state_dict(), traffic
  ServerExchange    server mode: each gradient pushed as backward produces it, the servers'
                    parameters after their step copied into the model; rank 0 sends the
                    optimizer's hyper-parameters; DGC's momentum correction
  GradientExchange  local mode, exchange="gradient": each gradient pushed as backward
                    produces it, p.grad set to the step's mean (DDP's arithmetic), with a
                    small "used" vector for the parameters no worker's backward reached

The update exchange (local mode, exchange="update") is adaps.torch_update.UpdateExchange.
"""
import functools
import warnings

import numpy as np
import torch

import adaps
from adaps import torch_server_hyper as _hyper

_USED_PREFIX = "__adaps_used__/"
# Why this process's CUDA parameters stage through host memory after the device path failed
# to open (None: it did not): a driver older than the library's CUDA runtime, a GPU its kernels
# were not built for. Warned once.
_device_path_off = None
_DEVICE_UNUSABLE = ("UNAVAILABLE", "UNIMPLEMENTED", "FAILED_PRECONDITION")


def host_f32(shape, like):
    pin = like.device.type == "cuda" and torch.cuda.is_available()
    return torch.empty(shape, dtype=torch.float32, pin_memory=pin)


def wait_all(entries):
    """Waits for every entry's handle (clearing it); the first adaps.Error, or None."""
    error = None
    for e in entries:
        try:
            e.handle.wait()
        except adaps.Error as err:
            error = error or err
        e.handle = None
    return error


def checked_local_steps(part, entries, phases):
    """A checkpoint's local-steps part, checked against local_steps' phases ([(H, end),
    ...]): (steps since the last exchange, (steps taken, phase, peak lr) or None where not
    saved, {name: anchor}, {name: outer momentum}), or None without one."""
    if part is None:
        return None
    shapes = {e.name: e.param.shape for e in entries}
    try:
        step = part["step"]
        phased = (part["steps"], part["phase"], float(part["peak_lr"])) \
            if "phase" in part else None
        anchor = {n: v.detach().clone() for n, v in part.get("anchor", {}).items()}
        momentum = {n: v.detach().to(torch.float32).clone()
                    for n, v in part.get("outer_momentum", {}).items()}
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ValueError("adaps.torch: the checkpoint's local_steps part is not the steps, "
                         "phase, anchor and outer_momentum that state_dict() writes (%r)"
                         % (err,)) from None
    if phased is None and len(phases) > 1:
        raise ValueError("adaps.torch: the checkpoint does not say which phase of "
                         "local_steps it was saved in: resume with the local_steps it was "
                         "saved with")
    if phased is not None and not (
            all(isinstance(v, int) and not isinstance(v, bool) for v in phased[:2]) and
            0 <= phased[1] < len(phases) and phased[0] >= 0):
        raise ValueError("adaps.torch: the checkpoint was saved in phase %r of local_steps "
                         "after %r steps, which these %d phases do not have: resume with "
                         "the local_steps it was saved with" % (phased[1], phased[0],
                                                                len(phases)))
    h = phases[phased[1] if phased is not None else 0][0]
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < h:
        raise ValueError("adaps.torch: the checkpoint was saved %r steps after an exchange, "
                         "which local_steps=%d does not reach: resume with the "
                         "local_steps it was saved with" % (step, h))
    for n, v in list(anchor.items()) + list(momentum.items()):
        if n not in shapes or v.numel() != shapes[n].numel():
            raise ValueError("adaps.torch: the checkpoint's local_steps part holds '%s' "
                             "of %d elements, which this optimizer does not train so"
                             % (n, v.numel()))
    missing = [n for n in shapes if n not in anchor]
    if step and missing:
        raise ValueError("adaps.torch: the checkpoint was saved %d steps after an exchange "
                         "but holds no anchor for %s" % (step, ", ".join(missing)))
    anchor = {n: v.reshape(shapes[n]) for n, v in anchor.items()}
    momentum = {n: v.reshape(shapes[n]) for n, v in momentum.items()}
    return step, phased, anchor, momentum


def _turn_device_path_off(err):
    global _device_path_off
    _device_path_off = str(err)
    warnings.warn("adaps.torch: the worker library's device path cannot be used here (%s): "
                  "CUDA parameters are staged through pinned host memory and compressed on "
                  "the CPU, as with a library built without CUDA" % err, stacklevel=4)


class Entry:
    """A trained tensor as every exchange sees it."""
    __slots__ = ("name", "param", "kind", "bin_size", "buf", "stage", "handle", "compressed",
                 "adacomp", "row_sparse", "compression", "topk_fraction", "bin_default",
                 "out_dev")

    def __init__(self, name, param, kind, bin_size):
        self.name = name
        self.param = param
        self.kind = kind
        self.bin_size = bin_size
        self.buf = None       # where pulls land: float32 host array of the param's shape
        self.stage = None     # float32 host copy of what is pushed (another dtype or device)
        self.handle = None    # the push_pull in flight this step
        self.compressed = False  # pushed with a compressor (so with error feedback)
        self.adacomp = False     # compressed with AdaComp (it has a bin size)
        self.row_sparse = False  # a large embedding: its gradient's nonzeros sent exactly
        self.compression = "adacomp"  # what it is pushed with ("adacomp", "topk", ...)
        self.topk_fraction = None     # for compression "topk"
        self.bin_default = False  # its bin is bin_size's default (nothing named, not a conv)
        self.out_dev = None   # declared on the param's device: where its pulls land there

    @classmethod
    def of(cls, e):
        """This record type's copy of a collected Entry."""
        new = cls(e.name, e.param, e.kind, e.bin_size)
        for slot in Entry.__slots__:
            setattr(new, slot, getattr(e, slot))
        return new


class GradEntry(Entry):
    """A tensor of the gradient exchanges (server mode; local mode's "gradient")."""
    __slots__ = ("zeros", "used", "pushed_grad", "pushed_version", "passes")

    def __init__(self, name, param, kind, bin_size):
        super().__init__(name, param, kind, bin_size)
        self.zeros = None     # pushed for a parameter that got no gradient this step
        self.used = False     # backward produced its gradient this step
        self.pushed_grad = None
        self.pushed_version = None
        self.passes = 0       # backward passes since the last step


class ServerEntry(GradEntry):
    __slots__ = ("velocity",)

    def __init__(self, name, param, kind, bin_size):
        super().__init__(name, param, kind, bin_size)
        self.velocity = None  # momentum correction: what this worker pushes


class Exchange:
    """What every exchange shares. `entries` are the trained tensors (adaps.torch collects
    them), `settings` the effective adaps.torch.Settings."""
    Record = Entry
    amp_scaling = False   # GradScaler.step(opt) calls step() on an inf/NaN gradient too
    no_sync = False       # inside DistributedOptimizer.no_sync()

    def __init__(self, worker, optimizer, entries, settings):
        self.worker = worker
        self.optimizer = optimizer
        self.entries = [self.Record.of(e) for e in entries]
        self.settings = settings
        self.pull = settings.pull

    # -- set-up ---------------------------------------------------------------------------
    def entry_pull(self, e):
        # Local mode's recompressed pulls are for the update exchange's AdaComp tensors; a
        # tensor sent dense or by Top-k, or a large embedding's exact gradient, keeps the
        # step's exact mean (sparse pulls).
        if self.pull == "recompressed" and (e.row_sparse or not e.adacomp):
            return "sparse"
        return self.pull

    def _initial(self, buf, e):
        buf.zero_()  # local mode: the servers answer each step's mean, not parameters

    def _running(self, pull):
        # Local mode, recompressed: the servers answer the running sum of the steps' means.
        return pull == "recompressed"

    def _keeps_sum(self, e, pull):
        # Whether the servers keep e's running sum beside exact pulls of the step's mean
        # (TensorSpec::keep_sum), for a worker that joins: the update exchange's.
        return False

    def joinable(self, e):
        """Local mode: whether a worker that joins a running job can start e where every
        replica is, the servers holding e's model as the running sum of the update
        exchange's means (adaps.torch._check_local_join)."""
        pull = self.entry_pull(e)
        return self._running(pull) or self._keeps_sum(e, pull)

    def declare(self, pull_bin_divisor):
        """Declares every tensor (collective, in order)."""
        for e in self.entries:
            self._declare(e, self.entry_pull(e), pull_bin_divisor)

    def _declare(self, e, pull, pull_bin_divisor):
        shape = list(e.param.shape) or [1]
        buf = host_f32(shape, e.param)
        self._initial(buf, e)
        e.buf = buf.numpy()
        # A row_sparse table is exchanged before the optimizer's step, the update exchange's
        # tensors after it: a fusion bucket holding both would wait for itself.
        running = self._running(pull)
        keep_sum = self._keeps_sum(e, pull)
        device = self._device_of(e, pull) if _device_path_off is None else -1
        declare = functools.partial(
            self.worker.declare, e.name, e.buf, shape=shape, bin_size=e.bin_size,
            compression=e.compression, topk_fraction=e.topk_fraction, pull=pull,
            fuse=not e.row_sparse, pull_bin_divisor=pull_bin_divisor if running else 1,
            keep_sum=keep_sum)
        try:
            declare(device=device)
        except adaps.Error as err:
            # The device did not open (nothing was declared yet): this worker stages its
            # CUDA parameters through host memory, as a library without CUDA does.
            if device < 0 or getattr(err, "code_name", "") not in _DEVICE_UNUSABLE:
                raise
            _turn_device_path_off(err)
            device = -1
            declare(device=device)
        if device >= 0:
            e.out_dev = torch.zeros(e.param.shape, dtype=torch.float32,
                                    device=e.param.device)
        if running:
            # The servers' running sum of the steps' means (0 at the start): each step's
            # delivered mean is its change. (Pinned as e.buf is: the two swap each step; on
            # the device path a device tensor, swapped with e.out_dev.)
            if device >= 0:
                e.replica = torch.from_numpy(e.buf).view(e.param.shape).to(
                    e.param.device, copy=True)
            else:
                replica = host_f32(shape, e.param)
                e.replica = replica.numpy()
                e.replica[...] = e.buf
        if (running or keep_sum) and self.worker.rejoined:
            # A worker that joined a running job: every replica is the job's start (its
            # parameters now, from rank 0's broadcast) plus the servers' running sum (what
            # its declaration brought); so is its own.
            with torch.no_grad():
                e.param.add_(torch.from_numpy(e.buf).view(e.param.shape).to(e.param))

    def _device_of(self, e, pull):
        """The device e is declared on, or -1: host memory. The worker library's device path
        (its residues on the GPU, AdaComp there, only the update crossing to the host) takes
        a float32 CUDA parameter pushed with AdaComp or dense when the library was built with
        CUDA; otherwise its pushes are staged through pinned host memory. (A worker that
        emulates devices, for tests: CPU parameters.)"""
        p = e.param
        if p.dtype != torch.float32 or e.row_sparse or \
                e.compression not in ("adacomp", "dense"):
            return -1
        if getattr(self.worker, "emulates_devices", False):
            return 0 if p.device.type == "cpu" else -1
        if p.device.type == "cuda" and adaps.CUDA_BUILT:
            return p.device.index if p.device.index is not None else 0
        return -1

    @staticmethod
    def push_device(worker, e, g):
        """Pushes the device tensor g (the param's shape, float32) for e, its pull landing in
        e.out_dev, ordered after the work given so far to the current stream."""
        g = g.contiguous()
        stream = torch.cuda.current_stream(g.device).cuda_stream if g.is_cuda else 0
        e.handle = worker.push_pull_device(e.name, g.data_ptr(), e.out_dev.data_ptr(),
                                           stream, [g, e.out_dev])

    @staticmethod
    def pulled(e):
        """What e's pull wrote, as a tensor of the param's shape (on its device when e is
        pulled there)."""
        if e.out_dev is not None:
            return e.out_dev.view_as(e.param)
        return torch.from_numpy(e.buf).view_as(e.param)

    def declare_more(self):
        """Anything declared after the tensors (before the fusion buckets close)."""

    def start(self, hook_registry):
        """After every declaration: the hooks, the first hyper-parameters."""

    # -- the training loop ----------------------------------------------------------------
    def synchronize(self):
        """Returns whether the step's exchange is done (else step() does it)."""
        return True

    def pull_parameters(self):
        """Local mode: nothing to do (the servers hold no parameters)."""

    def exchange_now(self):
        """Whether an exchange was pending and is now done: never here (every step
        exchanges); UpdateExchange's local steps."""
        return False

    # -- state_dict() ---------------------------------------------------------------------
    def state_part(self):
        residues, velocity, held = {}, {}, {}
        for e in self.entries:
            if e.compressed:
                r = np.zeros(e.buf.shape, np.float32)
                self.worker.residue(e.name, r)
                residues[e.name] = torch.from_numpy(r)
            if getattr(e, "velocity", None) is not None:
                velocity[e.name] = e.velocity.clone()
            if getattr(e, "held", None) is not None:
                held[e.name] = e.held.clone()
        return {"rank": self.worker.rank, "residues": residues, "velocity": velocity,
                "held": held, "bin_schedule": None}

    def check_state(self, extra):
        """Checks a checkpoint's "adaps" part before anything is loaded; what
        load_checked() takes."""
        checked_local_steps(extra.get("local_steps"), self.entries, [(1, None)])
        return None

    def load_checked(self, checked):
        """Loads what check_state() returned (any rank's)."""

    def load_state(self, extra):
        """Loads this rank's residues, velocities and own shares."""
        by_name = {e.name: e for e in self.entries}
        for kind in ("residues", "velocity", "held"):
            for name in extra.get(kind, {}):
                if name not in by_name:
                    raise ValueError("adaps.torch: the checkpoint's %s holds '%s', which this "
                                     "optimizer does not train" % (kind, name))
        for name, value in extra.get("residues", {}).items():
            e = by_name[name]
            if e.compressed:
                self.worker.set_residue(name, value.detach().to(torch.float32).contiguous()
                                        .reshape(e.buf.shape).numpy())
        for kind in ("velocity", "held"):
            for name, value in extra.get(kind, {}).items():
                e = by_name[name]
                if hasattr(type(e), kind):  # (another exchange's part: nothing to hold it)
                    setattr(e, kind, value.detach().to(torch.float32).clone())


class _PushedGradients(Exchange):
    """The gradient exchanges: a hook on each parameter's gradient accumulator pushes its
    gradient the moment backward has produced it; synchronize() waits for the pulls."""
    Record = GradEntry

    def __init__(self, worker, optimizer, entries, settings, backward_passes_per_step):
        super().__init__(worker, optimizer, entries, settings)
        self.backward_passes_per_step = backward_passes_per_step

    def start(self, hook_registry):
        for e in self.entries:
            self._register_hook(e, hook_registry)

    def _register_hook(self, e, hooks):
        # The AccumulateGrad node of the parameter fires once p.grad holds the full
        # gradient of this backward pass (torch 1.13 has no post-accumulate hook).
        acc = e.param.expand_as(e.param).grad_fn.next_functions[0][0]

        def hook(*unused):
            e.passes += 1
            if self.no_sync or e.passes < self.backward_passes_per_step:
                return  # accumulating: p.grad sums the passes, pushed at the last one
            self._push(e, e.param.grad)

        hooks.append((acc, acc.register_hook(hook)))

    def _before_push(self):
        """Before each push (server mode: the hyper-parameters of the step)."""

    def _outgoing(self, e, g):
        return g

    def _device_of(self, e, pull):
        # Not a running sum (recompressed pulls in local mode), and nothing added to the
        # gradient on the host before the push (DGC's momentum correction, whose velocity is
        # there).
        if self._running(pull) or getattr(self, "momentum_correction", False):
            return -1
        return super()._device_of(e, pull)

    def _push_device(self, e, grad):
        g = grad.detach()
        self.push_device(self.worker, e, g.to_dense() if g.is_sparse else g)

    def _push(self, e, grad):
        if e.handle is not None:
            raise adaps._error(
                adaps.FAILED_PRECONDITION, "adaps.torch: gradient of %s produced by more "
                "backward passes than backward_passes_per_step=%d before step(); to "
                "accumulate gradients, run the passes but the last inside opt.no_sync() (as "
                "DDP's model.no_sync()) or set backward_passes_per_step (as Horovod)"
                % (e.name, self.backward_passes_per_step))
        self._before_push()
        if e.out_dev is not None:
            self._push_device(e, grad)
            e.used = True
            e.pushed_grad, e.pushed_version = grad, grad._version
            return
        g = grad.detach()
        if g.is_sparse:
            g = g.to_dense()
        if g.dtype != torch.float32 or g.device.type != "cpu":
            if e.stage is None:
                e.stage = host_f32(e.buf.shape, g)
            e.stage.copy_(g.reshape(e.stage.shape))  # converts; waits for a device copy
            g = e.stage
        elif not g.is_contiguous():
            g = g.contiguous()
        g = self._outgoing(e, g)
        e.handle = self.worker.push_pull(e.name, g, e.buf)
        e.used = True
        e.pushed_grad, e.pushed_version = grad, grad._version

    def _push_unused(self, e):
        if e.out_dev is not None:
            if e.zeros is None:
                e.zeros = torch.zeros_like(e.out_dev)
            self._push_device(e, e.zeros)
            e.used = False
            return
        if e.zeros is None:
            e.zeros = np.zeros(e.buf.shape, dtype=np.float32)
        e.handle = self.worker.push_pull(e.name, self._outgoing(e, e.zeros), e.buf)
        e.used = False

    def _extra_handle(self):
        return None

    def synchronize(self):
        for e in self.entries:
            if e.handle is None:
                if e.passes > 0 and e.param.grad is not None:
                    self._push(e, e.param.grad)  # accumulated over fewer passes than expected
                else:
                    self._push_unused(e)
            e.passes = 0
        extra = self._extra_handle()
        error = None
        for h in [e.handle for e in self.entries] + [extra]:
            try:
                if h is not None:
                    h.wait()
            except adaps.Error as err:
                error = error or err
        for e in self.entries:
            e.handle = None
        if error is not None:
            raise error
        with torch.no_grad():
            self.check_unmodified()  # before anything is written
            self._apply()
        return True

    _unmodified_why = ""

    def check_unmodified(self):
        for e in self.entries:
            if e.used and (e.param.grad is not e.pushed_grad or
                           e.param.grad._version != e.pushed_version):
                raise adaps._error(
                    adaps.FAILED_PRECONDITION,
                    "adaps.torch: the gradient of %s changed after backward pushed it (e.g. "
                    "clip_grad_norm_ or GradScaler.unscale_); %s"
                    % (e.name, self._unmodified_why))

    def _check_after_synchronize(self):
        """step() after synchronize(): what the step checks again."""

    def _reset(self):
        for e in self.entries:
            e.pushed_grad = None
            e.passes = 0

    def step(self, owner, grad_scaler, synchronized):
        try:
            if not synchronized:
                owner.synchronize()
            else:
                with torch.no_grad():
                    self._check_after_synchronize()
        finally:
            owner._synchronized = False
            self._reset()
        return self._finish_step()


class ServerExchange(_PushedGradients):
    """Server mode: the servers run the optimizer; step() copies their parameters in."""
    Record = ServerEntry
    _unmodified_why = ("in server mode the servers step with the gradient backward "
                       "produced, so this cannot take effect (the model was not updated "
                       "this step); " + _hyper.LOCAL_HINT)

    def __init__(self, worker, optimizer, entries, settings, backward_passes_per_step,
                 trained_ids):
        super().__init__(worker, optimizer, entries, settings, backward_passes_per_step)
        self.server_kind = settings.server_optimizer
        self.momentum_correction = settings.momentum_correction
        self._trained_ids = trained_ids
        self._sent_hyper = None
        self._hyper_checked = False
        self.server_settings()  # raises before anything collective happened

    def entry_pull(self, e):
        return self.pull

    def _initial(self, buf, e):
        # The model's values in, rank 0's values out (already everyone's: broadcast).
        with torch.no_grad():
            buf.copy_(e.param.detach().reshape(buf.shape))

    def _running(self, pull):
        return False

    def _declare(self, e, pull, pull_bin_divisor):
        super()._declare(e, pull, pull_bin_divisor)
        with torch.no_grad():
            e.param.copy_(torch.from_numpy(e.buf).view_as(e.param))

    def start(self, hook_registry):
        super().start(hook_registry)
        self._sync_hyper()
        self._hyper_checked = True  # already sent for the first step

    # -- hyper-parameters -----------------------------------------------------------------
    @staticmethod
    def resolve_correction(optimizer, trained_ids, wanted, compressing):
        """Whether to apply DGC's momentum correction: with a compressor, each worker keeps
        the velocity u = momentum * u + (gradient + weight_decay * p) and pushes u, and the
        servers run plain SGD on the mean velocity. With dense pushes that is the servers'
        momentum exactly; with AdaComp the residue holds back velocity, so what is sent late
        is not left out of the momentum (the servers' momentum over a sparse mean gradient
        is)."""
        groups = [g for g in optimizer.param_groups
                  if any(id(p) in trained_ids for p in g["params"])]
        settings = _hyper.group_settings(optimizer, groups) if groups else {}
        can = (type(optimizer) is torch.optim.SGD and settings.get("momentum", 0) > 0
               and not settings.get("nesterov") and not settings.get("dampening", 0))
        if wanted is None:
            return can and compressing
        if wanted and not can:
            raise ValueError("adaps.torch: momentum_correction needs server mode with "
                             "torch.optim.SGD with momentum > 0, no Nesterov, no dampening")
        return bool(wanted)

    @staticmethod
    def hyper_settings(optimizer, trained_ids, momentum_correction, server_kind):
        """(What the servers run, the workers' (momentum, weight decay) under momentum
        correction or None); ValueError where the servers cannot run the optimizer."""
        groups = [g for g in optimizer.param_groups
                  if any(id(p) in trained_ids for p in g["params"])]
        settings = _hyper.group_settings(optimizer, groups)
        velocity = None
        if settings and momentum_correction:
            # The workers apply momentum and weight decay; the servers run plain SGD.
            velocity = (float(settings["momentum"]), float(settings.get("weight_decay", 0.0)))
            settings = dict(settings, momentum=0.0, weight_decay=0.0)
        if settings:
            _hyper.check_kind(optimizer, settings, server_kind)
        return settings, velocity

    def server_settings(self):
        settings, velocity = self.hyper_settings(self.optimizer, self._trained_ids,
                                                 self.momentum_correction, self.server_kind)
        if velocity is not None:
            self._velocity_settings = velocity
        return settings

    def _sync_hyper(self):
        settings = self.server_settings()
        h = _hyper.hyper_list(settings) if settings else []
        if h != self._sent_hyper:
            if self.worker.rank == 0 and h:
                self.worker.set_hyper(h)
            self._sent_hyper = h

    def _before_push(self):
        if not self._hyper_checked:
            # Before this worker's first push of the step: rank 0's new learning rate
            # reaches the servers before they can complete the step.
            self._sync_hyper()
            self._hyper_checked = True

    # -- pushing --------------------------------------------------------------------------
    def _outgoing(self, e, g):
        if not self.momentum_correction:
            return g
        if isinstance(g, np.ndarray):
            g = torch.from_numpy(g)
        # DGC's momentum correction: u = momentum * u + (gradient + weight_decay * p).
        momentum, weight_decay = self._velocity_settings
        g = g.reshape(e.buf.shape)
        if e.velocity is None:
            e.velocity = torch.zeros(e.buf.shape, dtype=torch.float32)
        e.velocity.mul_(momentum).add_(g)
        if weight_decay:
            # e.buf holds the parameters the model was given after the last step.
            e.velocity.add_(torch.from_numpy(e.buf), alpha=weight_decay)
        return e.velocity

    def _apply(self):
        for e in self.entries:
            e.param.copy_(self.pulled(e))

    def _check_after_synchronize(self):
        self.check_unmodified()

    def _reset(self):
        super()._reset()
        self._hyper_checked = False

    def _finish_step(self):
        # The torch optimizer's own step never runs here: a scheduler made on it must
        # still see a step before its own (torch 1.x counts _step_count, 2.x reads
        # _opt_called), or it warns that the order is wrong.
        if hasattr(self.optimizer, "_step_count"):
            self.optimizer._step_count += 1
        self.optimizer._opt_called = True
        return None

    def pull_parameters(self):
        if any(e.handle is not None for e in self.entries):
            raise adaps._error(adaps.FAILED_PRECONDITION,
                               "adaps.torch: pull_parameters() while a step is in flight "
                               "(backward pushed gradients that step() has not waited for); "
                               "call it after step()")
        with torch.no_grad():
            for e in self.entries:
                self.worker.pull_parameters(e.name, e.buf)
                e.param.copy_(torch.from_numpy(e.buf).view_as(e.param))


class GradientExchange(_PushedGradients):
    """Local mode, exchange="gradient": p.grad becomes the step's mean over workers."""
    _unmodified_why = (
        # The mean would overwrite the change silently (and a GradScaler's unscale_ of this
        # worker's own gradient would leave the optimizer stepping on the scaled mean).
        "with the gradient exchange, step() replaces p.grad by the mean of what the workers "
        "pushed, which would undo it (the model was not updated this step); call "
        "opt.synchronize() after backward, then clip or unscale the mean gradient, then "
        "step(), as Horovod does")

    def declare_more(self):
        # Which parameters some worker's backward reached: one small dense tensor.
        self._used = None
        if self.entries:
            self._used_name = _USED_PREFIX + str(sum(
                1 for n in self.worker.tensor_names() if n.startswith(_USED_PREFIX)))
            self._used = np.zeros(len(self.entries), dtype=np.float32)
            self._used_out = np.zeros(len(self.entries), dtype=np.float32)
            self.worker.declare(self._used_name, self._used_out, compression="dense")

    def _extra_handle(self):
        if self._used is None:
            return None
        for i, e in enumerate(self.entries):
            self._used[i] = 1.0 if e.used else 0.0
        return self.worker.push_pull(self._used_name, self._used, self._used_out)

    def _apply(self):
        for i, e in enumerate(self.entries):
            if self._used_out[i] <= 0.0:
                continue  # no worker's backward reached it: left as it is (DDP)
            mean = self.pulled(e)
            if e.param.grad is None:
                e.param.grad = mean.to(device=e.param.device, dtype=e.param.dtype,
                                       copy=True)
            elif e.param.grad.is_sparse:
                # nn.Embedding(sparse=True): the mean goes back sparse (SparseAdam takes
                # nothing else), over the same sparse dimensions (rows for an embedding).
                e.param.grad = mean.to(device=e.param.device, dtype=e.param.dtype,
                                       copy=True).to_sparse(e.param.grad.sparse_dim())
            else:
                e.param.grad.copy_(mean)

    def _finish_step(self):
        return self.optimizer.step()
