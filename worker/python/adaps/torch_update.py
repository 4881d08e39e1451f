"""adaps.torch's update exchange (local mode, exchange="update"; adaps.torch's module
docstring says what it does): each worker's torch optimizer steps on its own gradient, the
change goes out through the compressor, every replica adds the workers' mean change.

  UpdateExchange  the step: the local steps between exchanges, the exchange itself, the
                  outer step, its part of state_dict()
  RowSparse       row_sparse="exact": large embeddings exchanged as their gradient's
                  nonzero elements before the optimizer's step (DDP's arithmetic)
  OwnUpdates      own_updates: the part of this worker's residue its model holds
  LateBins        bin_schedule="auto": AdaComp's bins shrink as the learning rate falls
                  (the rule is adaps.torch_bins)
  GlobalMoments   second_moment="global": the step's denominator is the global batch's
                  estimated second moment (adaps.torch_moments)
"""
import sys
import warnings

import numpy as np
import torch

from adaps import torch_bins as _bins
from adaps import torch_moments as _moments
from adaps.torch_exchange import (Entry, Exchange, checked_local_steps, host_f32,
                                  wait_all)
from adaps.torch_settings import local_phases, phase_over

# outer="nesterov": DiLoCo's outer optimizer (SGD with Nesterov momentum on the mean of the
# workers' changes over local_steps steps), at DiLoCo's learning rate and momentum.
OUTER_LR = 0.7
OUTER_MOMENTUM = 0.9


def optimizer_steps(optimizer):
    """The steps a torch optimizer has taken (its state's "step" of the first parameter that
    has one; 0 before the first)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            step = optimizer.state.get(p, {}).get("step")
            if step is not None:
                return int(step)
    return 0


class UpdateEntry(Entry):
    __slots__ = ("snap", "held", "row_steps", "row_nonzero", "replica")

    def __init__(self, name, param, kind, bin_size):
        super().__init__(name, param, kind, bin_size)
        self.snap = None      # the parameter where the last exchange left it
        self.held = None      # own_updates: the part of this worker's residue in the model
        self.row_steps = 0    # row_sparse: steps whose density was looked at (the first 5)
        self.row_nonzero = 0.0  # row_sparse: the highest fraction of nonzero elements seen
        self.replica = None   # recompressed pulls: the running sum it last pulled


class GlobalMoments:
    """second_moment="global": each parameter's estimate of mu^2, averaged over v's window
    (not in state_dict(): a resumed run averages afresh)."""

    def __init__(self, agreement):
        self.mu2 = {}
        self.agreement = agreement

    def around_step(self, optimizer, workers, exclude):
        """Sets the optimizer's denominators; returns what restores torch's own."""
        return _moments.global_second_moment(optimizer, workers, self.mu2, exclude=exclude,
                                             agreement=self.agreement)

    def corr(self, param):
        return getattr(self.mu2.get(param), "corr", None)


class OwnUpdates:
    """own_updates ("share", "all", "estimate"): this worker's model is the replica plus a
    part of its own residue (Worker.residue)."""

    def __init__(self, kind, worker, moments):
        self.kind = kind
        self.worker = worker
        self.moments = moments
        self._host = {}  # {name: host buffer} for the device path's entries

    def change(self, e, workers):
        """The change of this worker's share since the last exchange (e.held becomes the
        new share). e.snap is the replica plus e.held (the share before this push); the
        push's input buffer (e.stage) is free again and takes the new one. (The share
        follows the live worker count, which joins change.)"""
        w = workers
        share = e.stage
        if share.device.type != "cpu":  # the device path's push buffer: a host one instead
            share = self._host.get(e.name)
            if share is None:
                share = self._host[e.name] = host_f32(e.buf.shape, e.param)
        if e.held is None:
            e.held = torch.zeros(share.shape, dtype=torch.float32)
        self.worker.residue(e.name, share.numpy())
        corr = self.moments.corr(e.param) if self.moments is not None else None
        if corr is not None:
            # (own_updates="estimate") The others' residues estimated by this worker's,
            # element by element as far as their updates correlate (torch_moments).
            share.mul_(corr.reshape(share.shape).to(share.device).mul(w - 1.0).add_(1.0)
                       .div_(w))
        else:
            share.mul_(1.0 if self.kind == "all" else 1.0 / w)
        change = (share - e.held).view(e.param.shape)
        e.held.copy_(share)
        return change


# Recompressed pulls hold an update back twice, in the worker's residue and in the servers'
# downlink (at the declared bin / 10): the push bins of the tensors pulled so (convolutions
# aside) are this many times finer than declared, the bin schedule dividing further up to
# torch_bins.MAX_TOTAL_DIVISOR. A 4x finer bin about halves the residues' delay (about 13,
# 9 and 6 steps at bins 500, 250, 125 on the zoo's transformer) for pushes about twice as
# large, paid out of what the recompressed downlink saves: the transformer at 16 workers
# over 300 steps went from +5.4% against dense at 88x in all to +1.2% at 66x (seeds 1, 2;
# docs/accuracy.md). Exact pulls (below 8 workers by default) keep the declared bins.
RECOMPRESSED_PUSH_DIVISOR = 4

# Local steps: the default bin divided by H stops here (H > 20 at the bin of 500), and so
# does a phase's (phase_bins="scale"): at H = 64 500 / H = 7 pushed every element at 16
# workers (at a quarter of it), while 25 ended the transformers below dense over 3,072 steps
# at 4 and 16 workers (docs/local-steps.md).
LOCAL_STEPS_MIN_BIN = 25


class LateBins:
    """bin_schedule="auto" (adaps.torch_bins): after the optimizer's step, before the push,
    every AdaComp tensor's bin but a convolution's follows the schedule's divisor
    (UpdateExchange.set_push_bins sets them)."""

    def __init__(self, start_step, worker, optimizer):
        self.schedule = _bins.BinSchedule(start_step)
        self.worker = worker
        self.optimizer = optimizer

    def after_step(self, entries, local_step, scale=(1, 1)):
        """Measures the residues' delay now and then and records the learning rate; True
        when the schedule's divisor changed (the bins are to be set again). scale: the
        phase's push bins against the declared, (first phase's H, this phase's)."""
        # The residues' delay is measured now and then: the unsent mass against this
        # step's update (e.snap is where the last exchange left the parameters).
        steps = optimizer_steps(self.optimizer)
        if self.schedule.wants_measure(steps):
            residue_mass = update_mass = 0.0
            with torch.no_grad():
                for e in entries:
                    if not e.adacomp or e.kind == "conv" or e.row_sparse or e.snap is None:
                        continue
                    r = np.zeros(e.buf.shape, np.float32)
                    self.worker.residue(e.name, r)
                    # (On the declared bins: phase_bins="scale" makes them finer.)
                    residue_mass += float(np.abs(r).sum()) * scale[1] / scale[0]
                    update_mass += float((e.param.detach().float() - e.snap.float())
                                         .abs().sum())
            self.schedule.measured(residue_mass, update_mass, local_step + 1)
        before = self.schedule.divisor
        divisor = self.schedule.update(max(g["lr"] for g in self.optimizer.param_groups),
                                       steps)
        return divisor != before


class RowSparse:
    """row_sparse="exact": each large embedding's gradient (its nonzero elements, exactly)
    goes out and its mean comes back as the gradient the torch optimizer steps on, on every
    worker alike (DDP's arithmetic). A skipped step (GradScaler) sends zeros: every worker
    sends every step."""

    def __init__(self, entries, worker):
        self.entries = entries
        self.worker = worker

    def exchange(self, skip):
        if not self.entries:
            return
        sparse = {}
        with torch.no_grad():
            for e in self.entries:
                if e.stage is None:
                    e.stage = host_f32(e.buf.shape, e.param)
                g = e.param.grad
                if g is not None and g.is_sparse:
                    # (nn.Embedding(sparse=True): SparseAdam wants one back, rows sparse)
                    sparse[e.name] = g.sparse_dim()
                if skip or g is None:
                    e.stage.zero_()
                else:
                    if g.is_sparse:
                        g = g.to_dense()
                    e.stage.copy_(g.reshape(e.stage.shape))
                    self._check_density(e)
                e.handle = self.worker.push_pull(e.name, e.stage, e.buf)
            error = wait_all(self.entries)
            if error is not None:
                raise error
            for e in self.entries:
                mean = torch.from_numpy(e.buf).view(e.param.shape)
                grad = mean.to(device=e.param.device, dtype=e.param.dtype, copy=True)
                e.param.grad = grad.to_sparse(sparse[e.name]) if e.name in sparse else grad

    @staticmethod
    def _check_density(e):
        # Sent exactly, a gradient costs about 39 bits a nonzero element: past ~10% nonzero
        # the exact path is barely smaller than dense. Said once, after the first steps.
        if e.row_steps >= 5:
            return
        e.row_steps += 1
        e.row_nonzero = max(e.row_nonzero,
                            float(np.count_nonzero(e.stage.numpy())) / e.stage.numel())
        if e.row_steps == 5 and e.row_nonzero > 0.1:
            warnings.warn("adaps.torch: %s (an embedding of %d rows) is exchanged as its "
                          "gradient's nonzero elements (row_sparse=\"exact\"), but %.0f%% of "
                          "them are nonzero a step: that is nearly dense traffic; "
                          "row_sparse=\"off\" sends it through AdaComp's update exchange "
                          "instead" % (e.name, e.param.shape[0],
                                       100 * e.row_nonzero), stacklevel=5)


class UpdateExchange(Exchange):
    """Local mode, exchange="update" (with local_steps and outer): see the module docstring.
    Collaborators: RowSparse, OwnUpdates, LateBins, GlobalMoments (None where unused)."""
    Record = UpdateEntry
    amp_scaling = True  # a skipped step (inf/NaN) sends a zero update: every worker sends

    def __init__(self, worker, optimizer, entries, settings, bins_from=None):
        super().__init__(worker, optimizer, entries, settings)
        self.phases = local_phases(settings.local_steps)  # [(H, end), ..., (H, None)]
        self.local_steps, self.outer = self.phases[0][0], settings.outer  # H now
        self.local_step = 0         # steps taken since the last exchange
        self.steps = 0              # steps taken since the first (the phases' count)
        self.phase = 0              # the phase in force (self.phases[self.phase])
        self.peak_lr = 0.0          # the first group's highest learning rate so far
        self.outer_momentum = {}    # outer="nesterov": {name: float32 buffer}
        self._had_grad = set()      # the entries that got a gradient since the last exchange
        self._warned_no_grad = False
        self.moments = GlobalMoments(settings.own_updates == "estimate") \
            if settings.second_moment == "global" else None
        self.own = OwnUpdates(settings.own_updates, worker, self.moments) \
            if settings.own_updates != "off" else None
        self.bins = LateBins(bins_from, worker, optimizer) if bins_from is not None else None
        # phase_bins="scale": each phase pushes at the bins times the first phase's H / its
        # own (first, now); set_push_bins.
        self.scale_bins = settings.phase_bins == "scale" and len(self.phases) > 1
        self.bin_scale = (1, 1)
        self.fixed = {}             # {name: the bin's own divisor} (recompressed pulls)
        self._push_bins = {}        # {name: the push bin last set} (absent: the declared)
        self.row_sparse = RowSparse([e for e in self.entries if e.row_sparse], worker)

    def _keeps_sum(self, e, pull):
        # Every replica adds each exchange's exact mean: the servers keep their sum too, which
        # a worker that joins starts from (a row_sparse table is stepped on the mean gradient
        # by each worker's own optimizer: the servers do not hold it).
        return not e.row_sparse and not self._running(pull)

    def declare(self, pull_bin_divisor):
        super().declare(pull_bin_divisor)
        self.fixed = {e.name: RECOMPRESSED_PUSH_DIVISOR for e in self.entries
                      if e.adacomp and e.kind != "conv" and
                      self.entry_pull(e) == "recompressed"}
        if self.bins is not None:
            self.bins.schedule.fixed_divisor = RECOMPRESSED_PUSH_DIVISOR if self.fixed else 1
        self.set_push_bins()

    def set_push_bins(self):
        """Every non-convolution AdaComp tensor's push bin (Worker.set_bin_size, where it
        changed): the declared bin, scaled with the phase's H (phase_bins="scale": times the
        first phase's H / this one's, down to LOCAL_STEPS_MIN_BIN), divided by the
        recompressed pulls' divisor and the bin schedule's (together at most
        torch_bins.MAX_TOTAL_DIVISOR)."""
        divisor = self.bins.schedule.divisor if self.bins is not None else 1
        first, now = self.bin_scale
        for e in self.entries:
            if not e.adacomp or e.kind == "conv":
                continue
            size = e.bin_size if first == now else \
                max(min(e.bin_size, LOCAL_STEPS_MIN_BIN), e.bin_size * first // now)
            total = min(_bins.MAX_TOTAL_DIVISOR, divisor * self.fixed.get(e.name, 1))
            size = max(1, size // total)
            if self._push_bins.get(e.name, e.bin_size) != size:
                self.worker.set_bin_size(e.name, size)
                self._push_bins[e.name] = size

    def step(self, owner, grad_scaler, synchronized):
        owner._synchronized = False
        skip = owner._amp_skip(grad_scaler)
        self.row_sparse.exchange(skip)  # raises before anything changed
        if self.local_step == 0:
            # The first step since the last exchange: e.snap is where it left the model (the
            # replica, plus this worker's own share with own_updates); every change from
            # here to the next exchange is sent then.
            with torch.no_grad():
                for e in self.entries:
                    if e.snap is None:
                        e.snap = torch.empty_like(e.param)
                    e.snap.copy_(e.param)
            self._had_grad = set()
            if len(self.phases) > 1:
                self._next_phase()  # (reads the lr: not on every step of a single H)
        # Parameters this worker's backward did not reach in any step since the last
        # exchange: its optimizer skipped them (see the warning in _exchange).
        if not self._warned_no_grad:
            self._had_grad.update(id(e) for e in self.entries if e.param.grad is not None)
        result = None
        if not skip:
            # Adam, AdamW, NAdam, RAdam, RMSprop, Adagrad: the step's denominator estimates
            # the global batch's second moment (adaps.torch_moments); torch's own v stays in
            # the state.
            restore = self.moments.around_step(
                self.optimizer, self.worker.live_workers,
                {id(e.param) for e in self.row_sparse.entries}) \
                if self.moments is not None else None
            try:
                result = self.optimizer.step()
            finally:
                if restore is not None:
                    restore()
            if self.bins is not None and \
                    self.bins.after_step(self.entries, self.local_step, self.bin_scale):
                self.set_push_bins()
        self.local_step += 1
        self.steps += 1
        if self.local_step < self.local_steps:
            return result  # a local step: nothing sent until the local_steps-th
        self.local_step = 0
        self._exchange()
        return result

    def exchange_now(self):
        # The steps since the last exchange (local_step of them, the same on every worker:
        # they all step alike), sent now; the next interval counts from here. Nothing when
        # the last step exchanged.
        if self.local_step == 0:
            return False
        self.local_step = 0
        self._exchange()
        return True

    def _next_phase(self):
        # At the first step of an interval: local_steps' next phase once this one's end is
        # reached (a step count, or the learning rate at most its peak / K: every worker
        # steps the same schedule, so they move on at the same exchange).
        group = self.optimizer.param_groups[0]
        lr = float(group["lr"])
        self.peak_lr = max(self.peak_lr, lr, float(group.get("initial_lr", 0.0)))
        was = self.phase
        while self.phase + 1 < len(self.phases) and \
                phase_over(self.phases[self.phase][1], self.steps, lr, self.peak_lr):
            self.phase += 1
        self._enter_phase()
        if self.phase != was and self.worker.rank == 0:
            # The job's traffic changes here: said once, where the settings' line was.
            end = self.phases[self.phase - 1][1]
            h0, h = self.phases[0][0], self.local_steps
            sys.stderr.write(
                "adaps.torch: local_steps phase %d of %d from step %d: an exchange every %d "
                "steps%s%s\n" % (
                    self.phase + 1, len(self.phases), self.steps, h,
                    ", the push bins x %d/%d (phase_bins=scale)" % (h0, h)
                    if self.scale_bins and h != h0 else "",
                    "; the lr %.3g is at most its peak %.3g / %g" % (lr, self.peak_lr, end[1])
                    if end[0] == "lr" else ""))
            sys.stderr.flush()

    def _enter_phase(self):
        self.local_steps = self.phases[self.phase][0]
        if self.scale_bins and self.bin_scale != (self.phases[0][0], self.local_steps):
            self.bin_scale = (self.phases[0][0], self.local_steps)
            self.set_push_bins()

    def _exchange(self):
        no_grad = None if self._warned_no_grad else \
            {id(e) for e in self.entries if id(e) not in self._had_grad and not e.row_sparse}
        w = max(1, self.worker.live_workers)
        sent = [e for e in self.entries if not e.row_sparse]
        with torch.no_grad():
            for e in sent:
                if e.out_dev is not None:
                    # The device path: the change since the last exchange in a float32
                    # buffer on the device (e.held's slot for own_updates stays the host's).
                    if e.stage is None or e.stage.device != e.param.device:
                        e.stage = torch.empty_like(e.param, dtype=torch.float32)
                    torch.sub(e.param, e.snap, out=e.stage)
                    self.push_device(self.worker, e, e.stage)
                    continue
                if e.stage is None:
                    e.stage = host_f32(e.buf.shape, e.param)
                # The change since the last exchange (the local steps'), float32 on the
                # host: what this worker sends.
                if e.param.dtype == torch.float32 and e.param.device.type == "cpu":
                    torch.sub(e.param.reshape(e.stage.shape), e.snap.reshape(e.stage.shape),
                              out=e.stage)
                else:
                    e.stage.copy_((e.param.float() - e.snap.float()).reshape(e.stage.shape))
                e.handle = self.worker.push_pull(e.name, e.stage, e.buf)
            error = wait_all(sent)
            for e in self.entries:
                if e.row_sparse and error is None:
                    continue  # stepped on the mean gradient, the same on every worker
                if error is not None:
                    e.param.copy_(e.snap)
                    continue
                # Every replica: the same start plus the same mean update.
                if e.replica is not None:
                    # Recompressed: the servers' running sum; the mean delivered this step
                    # is its change (e.buf becomes it, e.replica the sum; on the device
                    # path e.out_dev).
                    if e.out_dev is not None:
                        torch.sub(e.out_dev, e.replica, out=e.replica)
                        e.replica, e.out_dev = e.out_dev, e.replica
                    else:
                        np.subtract(e.buf, e.replica, out=e.replica)
                        e.replica, e.buf = e.buf, e.replica
                mean = self.pulled(e).view(e.param.shape)
                if no_grad and id(e) in no_grad and not self._warned_no_grad and \
                        bool(mean.any()):
                    self._warn_no_grad(e)
                change = self._outer_change(e, mean)
                if self.own is not None:
                    change = change + self.own.change(e, w).to(change.device)
                if e.param.dtype == torch.float32 and e.param.device.type == "cpu":
                    torch.add(e.snap, change, out=e.param)
                else:
                    e.param.copy_(e.snap.float() + change.to(e.param.device))
        if error is not None:
            raise error

    def _warn_no_grad(self, e):
        self._warned_no_grad = True
        warnings.warn(
            "adaps.torch: parameter %r got no gradient on this worker this step (with "
            "local_steps: since the last exchange), but other workers' updates moved it: "
            "with exchange=\"update\" each worker's optimizer steps on its own gradient and "
            "skips a parameter without one (no momentum, weight decay or Adam step from this "
            "worker), where DDP steps it on every worker with the mean gradient, so its step "
            "here is up to 1/W smaller (a mixture of experts, a branch some batches skip); "
            "exchange=\"gradient\" steps it as DDP does (warned once)" % (e.name,),
            stacklevel=5)

    def _outer_change(self, e, mean):
        # What every replica adds to where the last exchange left it: the workers' mean
        # change itself (outer="average"), or DiLoCo's outer step, SGD with Nesterov momentum
        # (torch's arithmetic, the outer gradient being -mean): b = momentum * b + mean,
        # change = lr * (mean + momentum * b). Every worker has the same mean, so the same
        # buffer and change: the replicas stay equal.
        if self.outer == "average":
            return mean
        b = self.outer_momentum.get(e.name)
        if b is None:
            b = self.outer_momentum[e.name] = torch.zeros(mean.shape, dtype=torch.float32,
                                                          device=mean.device)
        b.mul_(OUTER_MOMENTUM).add_(mean)
        return mean.add(b, alpha=OUTER_MOMENTUM).mul_(OUTER_LR)

    # -- state_dict() ---------------------------------------------------------------------
    def state_part(self):
        part = super().state_part()
        part["bin_schedule"] = self.bins.schedule.state_dict() if self.bins else None
        if self.phases != [(1, None)] or self.outer != "average":
            # Local steps: the steps since the last exchange and since the first (the
            # phases'), where the last exchange left the model (the changes since are sent
            # at the next one), and the outer momentum.
            anchor = {e.name: e.snap.clone() for e in self.entries
                      if self.local_step and e.snap is not None}
            part["local_steps"] = {
                "step": self.local_step, "steps": self.steps, "phase": self.phase,
                "peak_lr": self.peak_lr, "anchor": anchor,
                "outer_momentum": {n: b.clone() for n, b in self.outer_momentum.items()}}
        return part

    def check_state(self, extra):
        # The bin schedule's rates and delay (the same on every rank): a resumed run keeps
        # its bins where they were. Checked before anything is loaded.
        bins = extra.get("bin_schedule")
        if bins is not None and self.bins is not None:
            checked = _bins.BinSchedule(self.bins.schedule.start_step)
            checked.load_state_dict(bins)
            bins = checked
        else:
            bins = None
        return bins, checked_local_steps(extra.get("local_steps"), self.entries,
                                         self.phases)

    def load_checked(self, checked):
        bins, local = checked
        if bins is not None:
            self.bins.schedule.rates, self.bins.schedule.delay = bins.rates, bins.delay
        if local is not None:
            # (Any rank's: the counter and the outer momentum are the same on every rank, and
            # the anchor goes with the model that is loaded, rank 0's as a rule.)
            self.local_step, phased, anchor, self.outer_momentum = local
            if phased is not None:
                self.steps, self.phase, self.peak_lr = phased
                self._enter_phase()
            for e in self.entries:
                if e.name in anchor:
                    e.snap = anchor[e.name].to(device=e.param.device, dtype=e.param.dtype)
            self._had_grad = {id(e) for e in self.entries}  # (no warning for the steps before)
