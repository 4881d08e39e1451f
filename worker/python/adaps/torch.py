"""adaps.torch: data-parallel PyTorch training through adaps, with Horovod's semantics.

    import adaps, adaps.torch
    worker = adaps.worker_from_env()
    opt = adaps.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                           model, worker)
    sched = torch.optim.lr_scheduler.StepLR(opt, 10)     # a real torch.optim.Optimizer
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()   # each gradient is pushed as soon as it is ready
        opt.step()                        # waits for the pulls, then updates the parameters

At construction (collective: every worker, same order) rank 0's parameters and buffers
(model.state_dict(): frozen parameters and BatchNorm statistics too) and rank 0's optimizer
state become everyone's (broadcast_parameters, broadcast_optimizer_state; see
adaps.torch_broadcast). The trained tensors are the parameters in the optimizer's
param_groups that require a gradient; parameters outside the optimizer are broadcast but
never pushed or changed. Each trained parameter is declared once under its qualified name
("conv1.weight") with the AdaComp bin size of its layer type (`conv_bin_size` for
convolutions, and for a parameter of a convolution kernel's shape that another module applies
with F.conv1d/2d/3d; `bin_size` otherwise; `bin_sizes={"name": T}` overrides one).

A hook on each parameter's gradient accumulator pushes its gradient the moment backward has
produced it, so compression and the network overlap the rest of backward. Two modes:

  mode     servers (--optimizer)   what step() does                 what it honours
  -------  ----------------------  -------------------------------  ----------------------------
  server   sgd, momentum,          copies the servers' parameters   torch.optim.SGD (momentum,
           nesterov, adam          after their optimizer step into  Nesterov, weight decay) and
                                   the model; rank 0 sends lr,      torch.optim.Adam, the same
                                   momentum, weight decay, betas,   hyper-parameters in every
                                   eps whenever they change (LR     group, LR schedulers. Other
                                   schedulers work)                 optimizers, differing groups
                                                                    or a gradient changed after
                                                                    backward (clip_grad_norm_,
                                                                    GradScaler) raise an error
                                                                    naming local mode.
  local    mean                    exchange="update" (default with  everything torch does: any
                                   a compressor): runs the torch    optimizer, per-group
                                   optimizer on this worker's       settings, clipping between
                                   gradient and applies the mean    synchronize() and step(),
                                   of the workers' updates;         AMP's GradScaler
                                   "gradient": sets p.grad to the
                                   step's mean over workers, then
                                   runs the torch optimizer

Parameters that get no gradient in a step (find_unused_parameters semantics, as DDP): every
worker pushes every trained tensor every step, zeros for a parameter its backward did not
reach, so a sync step always completes. Local mode then treats it as DDP does: used on some
worker -> p.grad is the sum of the gradients of the workers that used it divided by the
number of workers; used on none -> p.grad is left as it was (None after
zero_grad(set_to_none=True)), so the torch optimizer skips it. Server mode cannot skip: the
servers step with the zero mean gradient (no change under plain SGD; momentum, weight decay
and Adam still move it). Only gradients produced by backward count; a p.grad assigned by
hand is not pushed. The update exchange (exchange="update", local mode's default with a
compressor) differs: each worker's optimizer steps on its own gradient and skips a parameter
its backward did not reach, so a parameter used on some workers only (a mixture of experts'
expert, a branch) gets a step up to 1/W smaller than DDP's; the first time that happens the
worker warns, naming the parameter (exchange="gradient" is DDP's arithmetic).

Settings and their precedence (explicit arguments win, then what adaps.launch exported, then
the defaults): server_optimizer (ADAPS_SERVER_OPTIMIZER, from --server-optimizer; without
either, what the servers' --optimizer is, from the cluster view; mean -> local mode,
sgd/momentum/nesterov/adam -> server mode, checked against the torch optimizer and against
what the servers run; sum is refused), compression (ADAPS_COMPRESSION, "adacomp"; the dict form there as
"TYPE:NAME,...", e.g. "embedding:topk,conv:dense"), pull (ADAPS_PULL: in local mode
"sparse", and "recompressed" from 8 workers on for the update exchange's compressed tensors
(rank 0 decides from the job's workers); "sparse" with servers running plain SGD without
weight decay, else "dense"; "recompressed" in local mode, with the update exchange only: the servers keep the running sum
of the steps' mean updates and recompress its change at each AdaComp tensor's bin size divided
by 10, one message for every replica, about 2 pushes' bytes at any number of workers where an
exact pull carries W - 1 pushes (at 16 workers 8x fewer pull bytes), for the delay of what
the downlink holds back, which long runs do not feel: docs/accuracy.md, "Recompressed pulls in
local mode"), bin_size
(ADAPS_BIN_SIZE, 500), conv_bin_size (ADAPS_CONV_BIN_SIZE, 50), topk_fraction
(ADAPS_TOPK_FRACTION, 0.001), lr (ADAPS_LR, from --lr: when set it replaces every group's
lr at construction; unset: the torch optimizer's), exchange (ADAPS_EXCHANGE, see below),
second_moment (ADAPS_SECOND_MOMENT, "global" or "local", see below), own_updates
(ADAPS_OWN_UPDATES, "share", "all", "estimate" or "off"; unset: "share" for optimizers with a second moment, see below),
bin_schedule (ADAPS_BIN_SCHEDULE, "auto" or "off", see below), row_sparse (ADAPS_ROW_SPARSE,
"exact" or "off", see below), local_steps (ADAPS_LOCAL_STEPS, 1) and outer (ADAPS_OUTER,
"average" or "nesterov"; "Local steps" below). An explicit argument that overrides a
different exported value warns once.

What local mode sends (exchange): "gradient" sends each worker's gradient, and every worker's
torch optimizer steps on the mean (DDP's arithmetic; the default with dense pushes).
"update" (the default with a compressor) runs each worker's torch optimizer on its own
gradient, sends the change that step made to the parameters, and every replica becomes the
parameters before the step plus the mean of the workers' changes. AdaComp's error feedback
then holds back part of the *update*, not of the gradient: Adam moves an element by about lr
a step whatever the gradient's size, so a gradient that arrives in AdaComp's bursts moves it
far less than the same gradient arriving a little every step (docs/accuracy.md, the zoo).
With SGD and momentum this is DGC's momentum correction exactly. What differs from DDP, and
why: each worker's optimizer state (momentum, Adam's moments) is its own, fed by its own
gradients (rank 0's state_dict() is a valid optimizer checkpoint for any rank; its "adaps"
part, the residues, loads only into rank 0); with
torch.optim.Adam, AdamW, NAdam, RAdam, RMSprop (not centered) or Adagrad and
second_moment="global" (the default) each step's denominator is the estimate of the global
batch's second moment from this worker's own statistics, not its own batch's, which is up to
W times larger where the gradient noise dominates (adaps.torch_moments; torch's own moments
stay in the optimizer's state; "local" keeps torch's step as it is; other optimizers, Adamax
and amsgrad groups among them, take their own step); with own_updates="share" (the default for
the optimizers above, "off" for others) each worker's model is the replica plus 1/W of this
worker's own residue (Worker.residue: the part of its updates AdaComp has not sent yet),
which is where the parameters would be had its own updates all been delivered, so its next
gradient is taken there; "all" adds the whole residue (the others' residues estimated by its
own: better on the language models of docs/accuracy.md, worse on the classifiers);
"estimate" adds 1/W of it plus, element by element, the others' estimated by its own as far
as the workers' updates agree there: (1 + (W - 1) c) / W of it, c = mu^2 / (mu^2 + k s^2) from
the moments of adaps.torch_moments (the same mean gradient mu on every worker, each first
moment's own noise k s^2): near "all" where the gradient's mean dominates, near "share" where
its noise does (the language models of docs/accuracy.md 0.5-1.1% nearer dense or further
below it, but a vision transformer 0.7 pp further below: not the default; an optimizer
without those moments, or second_moment="local", falls back to "share"); the replicas
then differ by the residues (rank 0's model is what rank 0 evaluates and saves; with "off"
every replica is the same); clipping between
synchronize() and step() clips this worker's own gradient, as on one machine; a parameter
without gradient on this worker is skipped by its torch optimizer (no change sent); with
torch.cuda.amp.GradScaler a worker whose gradient has inf/NaN sends a zero update for that
step instead of skipping it (every worker must send every step); with bin_schedule="auto" (the
default) and the optimizers above, every AdaComp tensor's bin size but a convolution's is
divided by 2 while the learning rate is at most 3/4 of its mean over the last 3 D steps (D
the residues' delay: the unsent mass in units of one step's update, measured), by 4 at 3/8,
and back as it recovers, never before the optimizer has taken 10 / (1 - beta1) steps: what a
residue holds back was taken at the rates of those steps, and when the rate has fallen
since, a smaller bin delivers it sooner. It depends on how fast the rate falls against the
delay, not on the run's length: a constant rate or a plateau keeps the declared bins, a
3,000-step cosine shrinks them in its last tenth (adaps.torch_bins; "off" keeps the
declared sizes; other optimizers are not changed);
with row_sparse="exact" (the default) an nn.Embedding or nn.EmbeddingBag of at least 4096
rows, whose gradient is zero but for the rows a batch touches (and whose weight is not tied
to another layer's), is not part of the update exchange: its gradient's nonzero elements go out exactly (Top-k of every nonzero element: a
few rows' worth of bytes) and every worker's optimizer steps on their mean, as DDP's does
(a row one worker touches moves as far as in DDP, where averaging the workers' own steps
moved it up to W times less; a warning says when its gradient turns out more than 10%
nonzero, where this costs about as much as dense); an embedding's weight trained by plain
SGD (torch.optim.SGD, momentum 0) whose compression is not named (compression left to the
default, or a dict without "embedding") goes by Top-k at topk_fraction rather than AdaComp,
whose one value per slice overshoots its rarer rows every step (docs/accuracy.md "Plain SGD";
AdaComp named for it warns), and recurrent weights (nn.LSTM, nn.GRU, nn.RNN and their cells)
trained by plain SGD take conv_bin_size unless a bin size is named (bin_size, ADAPS_BIN_SIZE,
bin_sizes): with no momentum nor second moment, what their residues hold back costs most
(docs/accuracy.md "Plain SGD"). Memory: one more copy of the trained parameters (the values before the step), with own_updates a float32 copy of the
residue on the host (own_updates other than "off"), and with second_moment="global" one more
copy of the parameters (the averaged estimate of mu^2; RMSprop two, Adagrad four: adaps
keeps their first moment, and Adagrad's global sum), and with own_updates="estimate" one more
(the workers' agreement, element by element).

Local steps (local_steps=H, the update exchange only; DiLoCo, SparseLoCo): step() runs this
worker's torch optimizer on its own gradient every step, and exchanges only every H-th step:
the steps between send nothing and wait for nothing. The exchange sends the change of the
parameters since the last one (H steps' worth) through the same compressor with error
feedback (AdaComp's residue then holds back part of H steps' change, and is SparseLoCo's
error feedback), and every replica becomes where the last exchange left it plus the outer
step of the workers' mean change: that mean itself with outer="average" (the default:
outer SGD at learning rate 1 without momentum), or DiLoCo's outer SGD with Nesterov
momentum (learning rate 0.7, momentum 0.9: b = 0.9 b + mean, change = 0.7 (mean + 0.9 b)),
applied alike on every worker to the same mean, so the replicas stay equal (one more copy
of the parameters, the momentum b). H = 1 with outer="average" is the update exchange of
every step, bit for bit. Between exchanges each worker's model is where the last exchange
left it (the replica, plus its share of its own residue with own_updates) plus its own
local steps, so the replicas differ there; rank 0 evaluates and saves its own. Make the
number of steps a multiple of H, or the last steps stay each worker's own. With local
steps, a large embedding is not exchanged as its gradient's nonzeros (row_sparse: that
would exchange every step) but through the update exchange like the rest;
second_moment="global" keeps each local step's denominator at the global batch's
estimated second moment (what H steps of the global batch would have), own_updates still
adds this worker's share of its residue at each exchange, and bin_schedule still counts the
optimizer's (local) steps. state_dict() keeps the steps since the last exchange, where it
left the model, and the outer momentum (loaded into any rank). A failed exchange leaves the
model where the last exchange put it (the local steps since are lost). Measured on the zoo
(docs/local-steps.md): AdaComp's bin must shrink with H (each exchange sends H steps'
change, and what a residue holds back waits whole exchanges): local_steps=4 with
bin_size=125 and outer="average" was as accurate as every step's exchange at 40-50% of its
bytes, while the default bin lost 4.5% on a transformer at H = 4; DiLoCo's Nesterov outer
step (tuned at H in the hundreds) was worse at every H <= 16 measured.

Gradient accumulation: with the gradient exchange (server mode, and local mode with dense
pushes) each backward pass pushes what it produced, so a second pass before step() is an
error; accumulate as DDP does, the passes but the last inside `with opt.no_sync():`, or as
Horovod does, with backward_passes_per_step=N (every gradient is pushed at its N-th pass,
holding the sum of the N; step() after fewer passes pushes what was accumulated). The
update exchange sends at step() what the optimizer did, so accumulation needs neither there
(both are accepted and change nothing).

Dtypes and devices: float16/bfloat16/float64 parameters are trained with their gradients
converted to float32 at the boundary (compressed as float32; server mode keeps float32
master values on the servers). CUDA tensors are staged through host memory (pinned) on the
way out and copied back to the device on the way in.
"""
import contextlib
import os
import warnings

import numpy as np
import torch

import adaps
from adaps import torch_bins as _bins
from adaps import torch_moments as _moments
from adaps import torch_server_hyper as _hyper
from adaps.torch_broadcast import (broadcast_object, broadcast_optimizer_state,
                                   broadcast_parameters)

__all__ = ["DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state",
           "broadcast_object", "layer_type", "pull_bin_divisor"]

_CONV_TYPES = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.ConvTranspose1d,
               torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d)
_COMPRESSIONS = adaps._COMPRESSIONS
_PULLS = ("dense", "recompressed", "sparse")
_EXCHANGES = ("gradient", "update")
_SECOND_MOMENTS = ("global", "local")
_OWN_UPDATES = ("share", "all", "off", "estimate")
_BIN_SCHEDULES = ("auto", "off")
_ROW_SPARSE = ("exact", "off")
_OUTERS = ("average", "nesterov")
# outer="nesterov": DiLoCo's outer optimizer (SGD with Nesterov momentum on the mean of the
# workers' changes over local_steps steps), at DiLoCo's learning rate and momentum.
_OUTER_LR = 0.7
_OUTER_MOMENTUM = 0.9
# row_sparse="exact": embeddings of at least this many rows (a batch touches few of them).
_ROW_SPARSE_MIN_ROWS = 4096
# Local mode's recompressed pulls: the servers' downlink recompresses what all the workers
# sent at each tensor's bin size divided by this (an AdaComp bin of 500 pulled at 50), at any
# number of workers, so that what a worker receives per step does not grow with them (about
# two pushes' bytes from 4 to 64 workers, tests/python/test_downlink_scale.py). It was 2.5 W
# (the same at 4 workers): the mean of W pushes holds up to W times one push's elements,
# and a downlink that followed them cost a worker W/4 times the bytes.
_PULL_BIN_DIVISOR = 10
# ... and from this many workers on it is local mode's default (the update exchange with a
# compressor): the exact pull costs W - 1 pushes there, at least 3.5x the recompressed one,
# so about 4x fewer bytes in all at 16 workers for a delay that long runs do not feel (the
# zoo's transformer at 16 workers over 1,500 steps, seeds 1 and 2: -0.1% against dense at
# 90x in all after step 300, exact pulls -0.0% at 26x; docs/accuracy.md). Below it the exact
# pull costs at most about 3 pushes against 2, not worth the delay.
_RECOMPRESSED_FROM_WORKERS = 8
_USED_PREFIX = "__adaps_used__/"


def pull_bin_divisor(workers):
    """The divisor of an AdaComp tensor's bin size for local mode's recompressed pulls at
    `workers` workers: the same at any number of them (the downlink's bytes stay flat)."""
    del workers
    return _PULL_BIN_DIVISOR


def layer_type(module):
    """"conv", "recurrent", "linear", "embedding" or "other" for a module."""
    if isinstance(module, _CONV_TYPES):
        return "conv"
    if isinstance(module, (torch.nn.RNNBase, torch.nn.RNNCellBase)):
        return "recurrent"
    if isinstance(module, torch.nn.Linear):
        return "linear"
    if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
        return "embedding"
    return "other"


def _kernel_shaped(p):
    """A parameter shaped as a convolution's kernel (out channels, in channels, then 1 to 3
    spatial sizes of at most 11): what F.conv1d/2d/3d takes from a module of its own (weight
    standardization, a modulated convolution). Not a ViT's positions or class token (one
    leading row), fused experts or a position table (larger trailing sizes)."""
    return 3 <= p.dim() <= 5 and p.shape[0] > 1 and all(1 <= k <= 11 for k in p.shape[2:])


def _plain_sgd_params(optimizer):
    """The ids of the parameters torch.optim.SGD trains without momentum (plain SGD)."""
    if not isinstance(optimizer, torch.optim.SGD):
        return set()
    return {id(p) for g in optimizer.param_groups if not g.get("momentum", 0)
            for p in g["params"]}


def _kind_compression(compression, kind):
    """The compression of a layer type: a name for every kind, or a dict (adacomp if missing)."""
    return compression.get(kind, "adacomp") if isinstance(compression, dict) else compression


def _compressed(compression):
    """Whether any layer type's compression (a name or a dict of names) is not dense."""
    names = compression.values() if isinstance(compression, dict) else [compression]
    return any(c != "dense" for c in names)


def _wait_all(entries):
    """Waits for every entry's handle (clearing it); the first adaps.Error, or None."""
    error = None
    for e in entries:
        try:
            e.handle.wait()
        except adaps.Error as err:
            error = error or err
        e.handle = None
    return error


def _optimizer_steps(optimizer):
    """The steps a torch optimizer has taken (its state's "step" of the first parameter that
    has one; 0 before the first)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            step = optimizer.state.get(p, {}).get("step")
            if step is not None:
                return int(step)
    return 0


def _setting(name, explicit, env, default, conv=str):
    value = os.environ.get(env)
    if explicit is not None:
        if value is not None and not isinstance(explicit, dict) and str(explicit) != value:
            warnings.warn("adaps.torch: %s=%r given to DistributedOptimizer overrides %s=%s "
                          "(set by adaps.launch)" % (name, explicit, env, value), stacklevel=3)
        return explicit
    if value is not None and value != "":
        try:
            return conv(value)
        except ValueError:
            raise ValueError("adaps.torch: %s=%r is not a valid %s" % (env, value, name))
    return default


def resolve_mode(mode, server_kind):
    """(mode, server kind or None) from the arguments; ValueError for a contradiction."""
    known = ("mean", "sum") + _hyper.SERVER_KINDS
    if server_kind is not None and server_kind not in known:
        raise ValueError("adaps.torch: unknown server optimizer %r (%s)"
                         % (server_kind, ", ".join(known)))
    if server_kind == "sum":
        raise ValueError("adaps.torch: servers with --optimizer=sum answer a running sum, "
                         "whose differences lose precision as training goes on; start them "
                         "with --optimizer=mean (adaps.launch --server-optimizer mean) for "
                         "local mode")
    if mode is None:
        mode = "local" if server_kind == "mean" else "server"
    if mode not in ("server", "local"):
        raise ValueError("adaps.torch: mode must be 'server' or 'local', got %r" % (mode,))
    if mode == "local" and server_kind not in (None, "mean"):
        raise ValueError("adaps.torch: local mode needs servers with --optimizer=mean, they "
                         "run %s" % server_kind)
    if mode == "server" and server_kind == "mean":
        raise ValueError("adaps.torch: server mode needs servers that run an optimizer "
                         "(sgd, momentum, nesterov, adam); they run mean (local mode)")
    return mode, server_kind


def _servers_agree(worker, server_kind, mode):
    """The servers' optimizer as their cluster view reports it (else server_kind); ValueError
    where the argument, ADAPS_SERVER_OPTIMIZER or the mode says otherwise: a worker that took
    the servers' mean gradients for parameters (or parameters for gradients) would train on
    garbage without a word."""
    reported = getattr(worker, "server_optimizer", "") if worker is not None else ""
    if not isinstance(reported, str) or not reported:
        return server_kind  # servers that do not say (an older adaps-server), or no worker
    if server_kind is not None and server_kind != reported:
        raise ValueError("adaps.torch: server_optimizer=%r (the argument or "
                         "ADAPS_SERVER_OPTIMIZER) but the job's servers run --optimizer=%s: "
                         "a pull answers %s there" % (
                             server_kind, reported,
                             "the step's mean gradient" if reported == "mean"
                             else "parameters"))
    resolve_mode(mode, reported)
    return reported


class _Param:
    __slots__ = ("name", "param", "kind", "bin_size", "buf", "stage", "handle", "zeros",
                 "used", "pushed_grad", "pushed_version", "snap", "velocity", "held",
                 "compressed", "adacomp", "row_sparse", "row_steps", "row_nonzero", "passes",
                 "compression", "topk_fraction", "replica")

    def __init__(self, name, param, kind, bin_size):
        self.name = name
        self.param = param
        self.kind = kind
        self.bin_size = bin_size
        self.buf = None       # where pulls land: float32 host array of the param's shape
        self.stage = None     # float32 host copy of a gradient of another dtype or device
        self.handle = None    # the push_pull in flight this step
        self.zeros = None     # pushed for a parameter that got no gradient this step
        self.used = False     # backward produced its gradient this step
        self.pushed_grad = None
        self.pushed_version = None
        self.snap = None      # update exchange: the parameter before the local step
        self.velocity = None  # momentum correction: what this worker pushes
        self.held = None      # own_updates: the part of this worker's residue in the model
        self.compressed = False  # pushed with a compressor (so with error feedback)
        self.adacomp = False     # compressed with AdaComp (it has a bin size)
        self.row_sparse = False  # a large embedding: its gradient's nonzeros sent exactly
        self.compression = "adacomp"  # what it is pushed with ("adacomp", "topk", ...)
        self.topk_fraction = None     # for compression "topk"
        self.row_steps = 0       # row_sparse: steps whose density was looked at (the first 5)
        self.row_nonzero = 0.0   # row_sparse: the highest fraction of nonzero elements seen
        self.passes = 0          # gradient exchange: backward passes since the last step
        self.replica = None      # local mode, recompressed: the running sum it last pulled


def _host_f32(shape, like):
    pin = like.device.type == "cuda" and torch.cuda.is_available()
    return torch.empty(shape, dtype=torch.float32, pin_memory=pin)


class DistributedOptimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer that trains `model` over adaps; see the module docstring.

    Args:
      optimizer: the torch optimizer over the parameters to train (it shares its
        param_groups and state with this object; state_dict() is its state_dict() plus
        this worker's exchange state under "adaps": residues, velocities, own shares).
      model: the torch.nn.Module (names, layer types, the state broadcast at start), or
        the torch.compile of one (its names are the module's own).
      worker: an adaps.Worker (default: adaps.worker_from_env()).
      mode: "server" or "local" (default: from server_optimizer).
      server_optimizer: what the servers run: mean, sgd, momentum, nesterov or adam.
      compression: "adacomp", "dense", "topk" or "sign"; or a dict from layer type ("conv",
        "linear", "recurrent", "embedding", "other") to one of those (adacomp if missing).
      bin_size, conv_bin_size: AdaComp bin sizes; bin_sizes: {param name: bin size}.
      topk_fraction: for compression="topk". pull: "sparse", "dense" or "recompressed".
      lr: replaces every group's learning rate at construction.
      exchange: local mode only: "update" (default when some trained tensor is compressed)
        or "gradient" (default when every one is pushed dense); see the module docstring.
      momentum_correction, second_moment, own_updates, bin_schedule, row_sparse: see the
        module docstring.
      local_steps, outer: the update exchange every local_steps steps (default 1), and the
        outer step over the workers' mean change there ("average" or "nesterov"); see the
        module docstring, "Local steps".
    """

    def __init__(self, optimizer, model, worker=None, mode=None, compression=None,
                 bin_size=None, conv_bin_size=None, bin_sizes=None, topk_fraction=None,
                 pull=None, server_optimizer=None, lr=None, exchange=None,
                 momentum_correction=None, second_moment=None, own_updates=None,
                 bin_schedule=None, row_sparse=None, backward_passes_per_step=1,
                 local_steps=None, outer=None):
        if not isinstance(optimizer, torch.optim.Optimizer) or \
                isinstance(optimizer, DistributedOptimizer):
            raise TypeError("adaps.torch: DistributedOptimizer wraps a torch.optim.Optimizer, "
                            "got %s" % type(optimizer).__name__)
        if isinstance(optimizer, torch.optim.LBFGS):
            # Its step evaluates the closure several times (line search), each a backward
            # pass over this worker's batch; a step of adaps exchanges one gradient or update.
            raise ValueError("adaps.torch: torch.optim.LBFGS is not supported: its step "
                             "evaluates the closure several times (a line search), and each "
                             "evaluation would be a step of its own for the other workers; "
                             "use an optimizer that takes one gradient a step")
        self._ready = False
        server_kind = _setting("server_optimizer", server_optimizer,
                               "ADAPS_SERVER_OPTIMIZER", None)
        if worker is None and server_kind is None and mode is None:
            # Neither the launcher nor the script says what the servers run: they say it
            # in the cluster view (registering now; every rank does the same).
            worker = adaps.worker_from_env()
        server_kind = _servers_agree(worker, server_kind, mode)
        self.mode, self.server_kind = resolve_mode(mode, server_kind)
        compression_named = compression is not None or \
            bool(os.environ.get("ADAPS_COMPRESSION"))
        compression = _setting("compression", compression, "ADAPS_COMPRESSION", "adacomp",
                               adaps._parse_compression)
        pull = _setting("pull", pull, "ADAPS_PULL", None)
        bin_size_named = bin_size is not None or bool(os.environ.get("ADAPS_BIN_SIZE"))
        bin_size = _setting("bin_size", bin_size, "ADAPS_BIN_SIZE", 500, int)
        conv_bin_size = _setting("conv_bin_size", conv_bin_size, "ADAPS_CONV_BIN_SIZE", 50, int)
        topk_fraction = _setting("topk_fraction", topk_fraction, "ADAPS_TOPK_FRACTION", 0.001,
                                 float)
        lr = _setting("lr", lr, "ADAPS_LR", None, float)
        exchange = _setting("exchange", exchange, "ADAPS_EXCHANGE", None)
        second_moment = _setting("second_moment", second_moment, "ADAPS_SECOND_MOMENT",
                                 "global")
        self._check_names(compression, pull)
        # A torch.compile'd model (torch 2.x) wraps the module as _orig_mod: names, layer
        # types and the broadcast state are the module's own, the same compiled or not.
        model = getattr(model, "_orig_mod", model)
        names = {}
        for name, p in model.named_parameters():
            names[id(p)] = name
            if torch.nn.parameter.is_lazy(p):
                # (nn.LazyLinear and the like: no shape until their first forward pass.)
                raise ValueError("adaps.torch: parameter %r of the model is not initialized "
                                 "yet (a lazy module): run one forward pass before wrapping "
                                 "the optimizer, as DistributedDataParallel requires" % (name,))
        self._params = self._collect(optimizer, model, bin_size, conv_bin_size, bin_sizes,
                                     bin_size_named)
        # The optimizer's parameters frozen now: not exchanged; step() refuses one that has
        # a gradient later (unfrozen after wrapping).
        trained = {id(e.param) for e in self._params}
        self._frozen = [(names.get(id(p), "__group%d.param%d" % (gi, pi)), p)
                        for gi, g in enumerate(optimizer.param_groups)
                        for pi, p in enumerate(g["params"])
                        if id(p) not in trained and p.numel() > 0]
        # Whether anything trained is pushed with a compressor (a kind a dict leaves out is
        # AdaComp's): the defaults below follow what is sent, not the names given.
        compressing = any(_compressed(_kind_compression(compression, e.kind))
                          for e in self._params)
        self.exchange = self._resolve_exchange(exchange, compressing)
        self._resolve_local_steps(local_steps, outer)
        if second_moment not in _SECOND_MOMENTS:
            raise ValueError("adaps.torch: unknown second_moment %r (global or local)"
                             % (second_moment,))
        self.second_moment = second_moment
        # second_moment="global": each parameter's estimate of mu^2, averaged over v's window
        # (adaps.torch_moments; not in state_dict(): a resumed run averages afresh).
        self._mu2 = {}
        own_updates = _setting("own_updates", own_updates, "ADAPS_OWN_UPDATES", None)
        if own_updates is None:
            # Default: this worker's share for optimizers with a second moment (Adam's
            # family, RMSprop, Adagrad); off for the rest (SGD with momentum: the residue holds
            # velocity, and the Fashion-MNIST MLP/CNN lost 1.4/2.3 pp with all of it;
            # docs/accuracy.md). "estimate" helps the language models and costs a vision
            # transformer ("Each worker's share of its own residue, estimated").
            own_updates = "share" if _moments.changes_step(optimizer) else "off"
        if own_updates not in _OWN_UPDATES:
            raise ValueError("adaps.torch: unknown own_updates %r (share, all, estimate or off)"
                             % (own_updates,))
        # The model holds this worker's residue only where there is one: the update
        # exchange of a compressor with error feedback.
        if self.exchange != "update" or not compressing:
            own_updates = "off"
        self.own_updates = own_updates
        bin_schedule = _setting("bin_schedule", bin_schedule, "ADAPS_BIN_SCHEDULE", "auto")
        if bin_schedule not in _BIN_SCHEDULES:
            raise ValueError("adaps.torch: unknown bin_schedule %r (auto or off)"
                             % (bin_schedule,))
        self.bin_schedule = bin_schedule
        if isinstance(backward_passes_per_step, bool) or \
                not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise ValueError("adaps.torch: backward_passes_per_step must be an int >= 1, got %r"
                             % (backward_passes_per_step,))
        self.backward_passes_per_step = backward_passes_per_step
        self._no_sync = False
        row_sparse = _setting("row_sparse", row_sparse, "ADAPS_ROW_SPARSE", "exact")
        if row_sparse not in _ROW_SPARSE:
            raise ValueError("adaps.torch: unknown row_sparse %r (exact or off)" % (row_sparse,))
        self.row_sparse = row_sparse
        # The step of the optimizer after which the bins shrink (None: never): optimizers
        # with a second moment (adaps.torch_moments.changes_step) in the update exchange of
        # AdaComp tensors; 10 / (1 - beta1) steps (100 without betas).
        self._bins = None
        self._warned_no_grad = False
        if bin_schedule == "auto" and self.exchange == "update" and \
                _moments.changes_step(optimizer):
            beta1 = optimizer.param_groups[0].get("betas", (0.9, 0.999))[0]
            if beta1 < 1:
                self._bins = _bins.BinSchedule(max(1, int(round(10.0 / (1.0 - beta1)))))
        if self.mode == "local" and pull == "recompressed" and self.exchange != "update":
            # A recompressed pull from servers running mean is the running sum of the steps'
            # means: right for the update exchange (the sum of the updates is where the
            # parameters are), wrong for mean gradients (what the downlink holds back would
            # come back steps late, and a run with momentum diverges).
            raise ValueError("adaps.torch: recompressed pulls in local mode need the update "
                             "exchange (exchange=\"update\", the default with a "
                             "compressor): with exchange=\"gradient\" take sparse (each "
                             "step's exact mean) or dense pulls")
        self.compression = compression
        if self.exchange == "update" and compressing and \
                any(g.get("nesterov") and g.get("momentum", 0) for g in optimizer.param_groups):
            # Not refused (it trains, as plain momentum does), but not what DDP gives either.
            warnings.warn("adaps.torch: SGD with nesterov=True in local mode with compression: "
                          "AdaComp delivers each element's updates in bursts, over which "
                          "Nesterov's lookahead cancels out, so the run trains as plain momentum "
                          "does (a ResNet measured 0.9 pp below dense with Nesterov, 0.7 pp "
                          "above dense with plain momentum; docs/accuracy.md \"Two recipes added "
                          "last\"); nesterov=False, or compression=\"dense\", avoids the "
                          "difference", stacklevel=2)
        if lr is not None:
            for g in optimizer.param_groups:
                g["lr"] = lr
        self.optimizer = optimizer
        self._trained_ids = {id(e.param) for e in self._params}
        for e in self._params:
            # row_sparse="exact": in the update exchange, a large embedding sends its
            # gradient's nonzero elements exactly (Top-k of every nonzero) and every worker's
            # optimizer steps on their mean, as DDP's does (docs/accuracy.md). Not with local
            # steps: that would exchange every step; the table goes with the rest.
            e.row_sparse = e.row_sparse and self.row_sparse == "exact" and \
                self.exchange == "update" and self.local_steps == 1 and \
                _compressed(_kind_compression(compression, e.kind))
        self._choose_compression(optimizer, compression, compression_named, topk_fraction)
        self.momentum_correction = False
        if self.mode == "server":
            self.momentum_correction = self._resolve_correction(momentum_correction,
                                                                compressing)
            self._server_settings()  # raises before anything collective happened
        self.pull = pull if pull is not None else self._default_pull()
        # Every check is done: from here on the calls are collective.
        self.worker = worker if worker is not None else adaps.worker_from_env()
        if worker is None:  # (made just now: what its servers run is checked as above)
            _servers_agree(self.worker, self.server_kind, self.mode)
        broadcast_parameters(model.state_dict(), self.worker)
        broadcast_optimizer_state(optimizer, self.worker)
        if pull is None and self.mode == "local" and self.exchange == "update" and \
                compressing:
            # Where the exact pull carries the others' pushes (W - 1 of them) and the
            # recompressed one about two, the recompressed one is the default. Rank 0
            # decides from the job's workers; a worker that joins later takes its decision
            # (every worker must declare a tensor's pulls alike).
            self.pull = broadcast_object(
                "recompressed" if self.worker.num_workers >= _RECOMPRESSED_FROM_WORKERS
                else "sparse", self.worker)
        super().__init__(optimizer.param_groups, optimizer.defaults)
        self._bind()
        self._sent_hyper = None
        self._synchronized = False
        self._hyper_checked = False
        self._hooks = []
        # This optimizer's small tensors are fused only with each other: a trainer that steps
        # two optimizers at different times (a GAN) must not have one wait for the other's.
        self.worker.close_fusion_buckets()
        self._pull_bin_divisor = pull_bin_divisor(self.worker.live_workers)
        for e in self._params:
            self._declare(e, e.compression, e.topk_fraction, self._entry_pull(e))
        self._used = None
        if self.exchange == "gradient" and self.mode == "local" and self._params:
            self._used_name = _USED_PREFIX + str(sum(
                1 for n in self.worker.tensor_names() if n.startswith(_USED_PREFIX)))
            self._used = np.zeros(len(self._params), dtype=np.float32)
            self._used_out = np.zeros(len(self._params), dtype=np.float32)
            self.worker.declare(self._used_name, self._used_out, compression="dense")
        self.worker.close_fusion_buckets()
        if self.exchange == "gradient":
            for e in self._params:
                self._register_hook(e)
        if self.mode == "server":
            self._sync_hyper()
            self._hyper_checked = True  # already sent for the first step
        self._ready = True

    # -- set-up ---------------------------------------------------------------------------
    def _choose_compression(self, optimizer, compression, named, topk_fraction):
        """Sets each trained tensor's compression (e.compression, e.topk_fraction,
        e.compressed, e.adacomp). The one named for its layer type, except:
          - row_sparse: a large embedding sends its gradient's nonzero elements exactly
            (Top-k of every nonzero);
          - an embedding's weight trained by plain SGD (torch.optim.SGD with momentum 0)
            whose compression is left to the default goes by Top-k at topk_fraction, not
            AdaComp: each AdaComp slice's selected elements go out at one scale, which
            overshoots the rarer rows' elements every step (docs/accuracy.md "Plain SGD").
            Named AdaComp for it warns instead."""
        plain = _plain_sgd_params(optimizer)
        default = not named or (isinstance(compression, dict) and "embedding" not in compression)
        for e in self._params:
            e.compression = _kind_compression(compression, e.kind)
            e.topk_fraction = topk_fraction
            if e.row_sparse:
                e.compression, e.topk_fraction = "topk", 1.0
            elif e.kind == "embedding" and id(e.param) in plain and \
                    e.compression == "adacomp":
                if default:
                    e.compression = "topk"
                else:
                    warnings.warn(
                        "adaps.torch: %s (an embedding) is trained by plain SGD (momentum=0) "
                        "and compression=\"adacomp\" was asked for it: each slice's selected "
                        "elements go out at one scale, which overshoots the rarer rows' "
                        "elements every step (PyTorch's word-language-model example, a tied "
                        "embedding at lr 20, measured 7.9%% above dense held-out loss; "
                        "docs/accuracy.md \"Plain SGD\"); the default for it, "
                        "compression=\"topk\", sends exact values and trained it as well as "
                        "dense" % e.name, stacklevel=3)
            e.compressed = _compressed(e.compression)
            e.adacomp = e.compression == "adacomp"

    def _resolve_exchange(self, exchange, compressing):
        if exchange is None:
            # Local mode with a compressor sends each worker's update (its own optimizer's
            # step), with error feedback on the update; dense pushes send the gradient, which
            # is then exact DDP. Server mode: the servers run the optimizer on gradients.
            return "update" if self.mode == "local" and compressing else "gradient"
        if exchange not in _EXCHANGES:
            raise ValueError("adaps.torch: unknown exchange %r (gradient or update)"
                             % (exchange,))
        if exchange == "update" and self.mode != "local":
            raise ValueError("adaps.torch: exchange='update' needs local mode (servers with "
                             "--optimizer=mean, adaps.launch --server-optimizer mean): in "
                             "server mode the servers run the optimizer on the gradients")
        return exchange

    def _resolve_local_steps(self, local_steps, outer):
        # local_steps=H: the update exchange every H steps (DiLoCo, SparseLoCo); sets
        # self.local_steps, self.outer and the state between exchanges.
        local_steps = _setting("local_steps", local_steps, "ADAPS_LOCAL_STEPS", 1, int)
        if isinstance(local_steps, bool) or not isinstance(local_steps, int) or \
                local_steps < 1:
            raise ValueError("adaps.torch: local_steps must be an int >= 1 (1: exchange every "
                             "step), got %r" % (local_steps,))
        outer = _setting("outer", outer, "ADAPS_OUTER", "average")
        if outer not in _OUTERS:
            raise ValueError("adaps.torch: unknown outer %r (average or nesterov)" % (outer,))
        if (local_steps > 1 or outer != "average") and self.exchange != "update":
            # The gradient exchange (server mode, dense pushes in local mode) sends every
            # step's gradient: there is no local step to take.
            raise ValueError(
                "adaps.torch: local_steps=%d, outer=%r need local mode's update exchange: "
                "servers running --optimizer=mean (adaps.launch --server-optimizer mean) and "
                "exchange=\"update\" (the default with a compressor; with "
                "compression=\"dense\" name it); this optimizer is in %s mode with "
                "exchange=%r" % (local_steps, outer, self.mode, self.exchange))
        self.local_steps, self.outer = local_steps, outer
        self._local_step = 0        # steps taken since the last exchange
        self._outer_momentum = {}   # outer="nesterov": {name: float32 buffer}
        self._had_grad = set()      # the entries that got a gradient since the last exchange

    def _resolve_correction(self, wanted, compressing):
        # DGC's momentum correction: with a compressor, each worker keeps the velocity
        # u = momentum * u + (gradient + weight_decay * p) and pushes u, and the servers run
        # plain SGD on the mean velocity. With dense pushes that is the servers' momentum
        # exactly; with AdaComp the residue holds back velocity, so what is sent late is not
        # left out of the momentum (the servers' momentum over a sparse mean gradient is).
        groups = [g for g in self.optimizer.param_groups
                  if any(id(p) in self._trained_ids for p in g["params"])]
        settings = _hyper.group_settings(self.optimizer, groups) if groups else {}
        can = (type(self.optimizer) is torch.optim.SGD and settings.get("momentum", 0) > 0
               and not settings.get("nesterov") and not settings.get("dampening", 0))
        if wanted is None:
            return can and compressing
        if wanted and not can:
            raise ValueError("adaps.torch: momentum_correction needs server mode with "
                             "torch.optim.SGD with momentum > 0, no Nesterov, no dampening")
        return bool(wanted)

    @staticmethod
    def _check_names(compression, pull):
        names = compression.values() if isinstance(compression, dict) else [compression]
        for c in names:
            if c not in _COMPRESSIONS:
                raise ValueError("adaps.torch: unknown compression %r (%s)"
                                 % (c, ", ".join(_COMPRESSIONS)))
        if pull is not None and pull not in _PULLS:
            raise ValueError("adaps.torch: unknown pull %r (dense, recompressed or sparse)"
                             % (pull,))

    def _default_pull(self):
        # Sparse pulls (the step's exact change at the elements some worker sent; dense when
        # that is smaller) wherever the servers' step changes only those elements: local
        # mode's mean, and servers known to run plain SGD with no weight decay (e.g. under
        # momentum correction). Elsewhere the servers would refuse them: dense.
        if self.mode == "local":
            return "sparse"
        settings = self._server_settings()
        if self.server_kind == "sgd" and not settings.get("momentum", 0) and \
                not settings.get("weight_decay", 0):
            return "sparse"
        return "dense"

    def _entry_pull(self, e):
        # Local mode's recompressed pulls are for the update exchange's AdaComp tensors; a
        # tensor sent dense or by Top-k, or a large embedding's exact gradient, keeps the
        # step's exact mean (sparse pulls).
        if self.mode == "local" and self.pull == "recompressed" and \
                (e.row_sparse or not e.adacomp):
            return "sparse"
        return self.pull

    @staticmethod
    def _collect(optimizer, model, bin_size, conv_bin_size, bin_sizes, bin_size_named=False):
        plain_sgd = _plain_sgd_params(optimizer)
        names, kinds, large, shared = {}, {}, set(), set()
        for module_name, module in model.named_modules(remove_duplicate=False):
            for pname, p in module.named_parameters(recurse=False):
                if id(p) in names:
                    # A weight tied to another module's (a language model's output layer
                    # sharing the embedding): its gradient is not row-sparse.
                    if layer_type(module) != "embedding":
                        shared.add(id(p))
                    continue
                names[id(p)] = module_name + "." + pname if module_name else pname
                kinds[id(p)] = layer_type(module)
                if kinds[id(p)] == "embedding" and \
                        getattr(module, "num_embeddings", 0) >= _ROW_SPARSE_MIN_ROWS:
                    large.add(id(p))
        large -= shared
        bin_sizes = dict(bin_sizes or {})
        out, seen = [], set()
        for gi, group in enumerate(optimizer.param_groups):
            for pi, p in enumerate(group["params"]):
                if not p.requires_grad or id(p) in seen or p.numel() == 0:
                    continue  # (nothing to exchange in a tensor without elements)
                seen.add(id(p))
                name = names.get(id(p), "__group%d.param%d" % (gi, pi))
                kind = kinds.get(id(p), "other")
                if kind == "other" and _kernel_shaped(p):
                    kind = "conv"  # (applied with F.conv2d and the like: a conv's weight)
                t = conv_bin_size if kind == "conv" else bin_size
                if kind == "recurrent" and not bin_size_named and id(p) in plain_sgd:
                    # Plain SGD's recurrent weights: the small bin (docs/accuracy.md "Plain
                    # SGD": the char-LSTM with plain SGD +5.5% at 500, +1.7% at 50).
                    t = conv_bin_size
                t = bin_sizes.pop(name, t)
                out.append(_Param(name, p, kind, int(t)))
                out[-1].row_sparse = id(p) in large
        if bin_sizes:
            raise ValueError("adaps.torch: bin_sizes names parameters that are not trained "
                             "(not in the optimizer or not requiring a gradient): %s"
                             % sorted(bin_sizes))
        return out

    def _bind(self):
        # This object and the torch optimizer share one list of groups and one state.
        self.param_groups = self.optimizer.param_groups
        self.state = self.optimizer.state
        self.defaults = self.optimizer.defaults

    def _declare(self, e, compression, topk_fraction, pull):
        shape = list(e.param.shape) or [1]
        buf = _host_f32(shape, e.param)
        if self.mode == "server":
            # The model's values in, rank 0's values out (already everyone's: broadcast).
            with torch.no_grad():
                buf.copy_(e.param.detach().reshape(shape))
        else:
            buf.zero_()  # the servers answer each step's mean gradient, not parameters
        e.buf = buf.numpy()
        # A row_sparse table is exchanged before the optimizer's step, the update exchange's
        # tensors after it: a fusion bucket holding both would wait for itself.
        running = self.mode == "local" and pull == "recompressed"
        self.worker.declare(e.name, e.buf, shape=shape, bin_size=e.bin_size,
                            compression=compression, topk_fraction=topk_fraction, pull=pull,
                            fuse=not e.row_sparse,
                            pull_bin_divisor=self._pull_bin_divisor if running else 1)
        if running:
            # The servers' running sum of the steps' means (0 at the start): each step's
            # delivered mean is its change. (Pinned as e.buf is: the two swap each step.)
            replica = _host_f32(shape, e.param)
            e.replica = replica.numpy()
            e.replica[...] = e.buf
        if self.mode == "server":
            with torch.no_grad():
                e.param.copy_(torch.from_numpy(e.buf).view_as(e.param))

    def _register_hook(self, e):
        # The AccumulateGrad node of the parameter fires once p.grad holds the full
        # gradient of this backward pass (torch 1.13 has no post-accumulate hook).
        acc = e.param.expand_as(e.param).grad_fn.next_functions[0][0]

        def hook(*unused):
            e.passes += 1
            if self._no_sync or e.passes < self.backward_passes_per_step:
                return  # accumulating: p.grad sums the passes, pushed at the last one
            self._push(e, e.param.grad)

        self._hooks.append((acc, acc.register_hook(hook)))

    def add_param_group(self, param_group):
        if getattr(self, "_ready", False):
            raise NotImplementedError("adaps.torch: add a param group to the torch optimizer "
                                      "before wrapping it (tensors are declared collectively "
                                      "at construction)")
        super().add_param_group(param_group)

    # -- pushing --------------------------------------------------------------------------
    def _push(self, e, grad):
        if e.handle is not None:
            raise adaps._error(
                adaps.FAILED_PRECONDITION, "adaps.torch: gradient of %s produced by more "
                "backward passes than backward_passes_per_step=%d before step(); to "
                "accumulate gradients, run the passes but the last inside opt.no_sync() (as "
                "DDP's model.no_sync()) or set backward_passes_per_step (as Horovod)"
                % (e.name, self.backward_passes_per_step))
        if self.mode == "server" and not self._hyper_checked:
            # Before this worker's first push of the step: rank 0's new learning rate
            # reaches the servers before they can complete the step.
            self._sync_hyper()
            self._hyper_checked = True
        g = grad.detach()
        if g.is_sparse:
            g = g.to_dense()
        if g.dtype != torch.float32 or g.device.type != "cpu":
            if e.stage is None:
                e.stage = _host_f32(e.buf.shape, g)
            e.stage.copy_(g.reshape(e.stage.shape))  # converts; waits for a device copy
            g = e.stage
        elif not g.is_contiguous():
            g = g.contiguous()
        if self.momentum_correction:
            g = self._velocity(e, g)
        e.handle = self.worker.push_pull(e.name, g, e.buf)
        e.used = True
        e.pushed_grad, e.pushed_version = grad, grad._version

    def _push_unused(self, e):
        if e.zeros is None:
            e.zeros = np.zeros(e.buf.shape, dtype=np.float32)
        g = self._velocity(e, torch.from_numpy(e.zeros)) if self.momentum_correction \
            else e.zeros
        e.handle = self.worker.push_pull(e.name, g, e.buf)
        e.used = False

    def _velocity(self, e, g):
        momentum, weight_decay = self._velocity_settings
        g = g.reshape(e.buf.shape)
        if e.velocity is None:
            e.velocity = torch.zeros(e.buf.shape, dtype=torch.float32)
        e.velocity.mul_(momentum).add_(g)
        if weight_decay:
            # e.buf holds the parameters the model was given after the last step.
            e.velocity.add_(torch.from_numpy(e.buf), alpha=weight_decay)
        return e.velocity

    # -- hyper-parameters (server mode) ---------------------------------------------------
    def _server_settings(self):
        groups = [g for g in self.optimizer.param_groups
                  if any(id(p) in self._trained_ids for p in g["params"])]
        settings = _hyper.group_settings(self.optimizer, groups)
        if settings and self.momentum_correction:
            # The workers apply momentum and weight decay; the servers run plain SGD.
            self._velocity_settings = (float(settings["momentum"]),
                                       float(settings.get("weight_decay", 0.0)))
            settings = dict(settings, momentum=0.0, weight_decay=0.0)
        if settings:
            _hyper.check_kind(self.optimizer, settings, self.server_kind)
        return settings

    def _sync_hyper(self):
        settings = self._server_settings()
        h = _hyper.hyper_list(settings) if settings else []
        if h != self._sent_hyper:
            if self.worker.rank == 0 and h:
                self.worker.set_hyper(h)
            self._sent_hyper = h

    def _check_unmodified(self):
        for e in self._params:
            if e.used and (e.param.grad is not e.pushed_grad or
                           e.param.grad._version != e.pushed_version):
                if self.mode == "server":
                    why = ("in server mode the servers step with the gradient backward "
                           "produced, so this cannot take effect (the model was not updated "
                           "this step); " + _hyper.LOCAL_HINT)
                else:
                    # The gradient exchange: the mean would overwrite the change silently
                    # (and a GradScaler's unscale_ of this worker's own gradient would leave
                    # the optimizer stepping on the scaled mean).
                    why = ("with the gradient exchange, step() replaces p.grad by the mean of "
                           "what the workers pushed, which would undo it (the model was not "
                           "updated this step); call opt.synchronize() after backward, then "
                           "clip or unscale the mean gradient, then step(), as Horovod does")
                raise adaps._error(
                    adaps.FAILED_PRECONDITION,
                    "adaps.torch: the gradient of %s changed after backward pushed it (e.g. "
                    "clip_grad_norm_ or GradScaler.unscale_); %s" % (e.name, why))

    # -- the training-loop API ------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate into p.grad without pushing (DDP's
        model.no_sync()); the first pass after it pushes the sum, or step() does."""
        before, self._no_sync = self._no_sync, True
        try:
            yield
        finally:
            self._no_sync = before

    def synchronize(self):
        """Pushes zeros for what backward did not reach, waits for every pull and applies
        it: server mode writes the pulled parameters into the model, local mode sets each
        p.grad to the step's mean over workers (so it can be clipped before step()).
        step() calls it unless it was called since the last step.

        With exchange="update" there is nothing to wait for yet: p.grad stays this worker's
        own gradient (clip it here as you would on one machine) and step() exchanges the
        update."""
        if self.exchange == "update":
            self._synchronized = True
            return
        for e in self._params:
            if e.handle is None:
                if e.passes > 0 and e.param.grad is not None:
                    self._push(e, e.param.grad)  # accumulated over fewer passes than expected
                else:
                    self._push_unused(e)
            e.passes = 0
        used_handle = None
        if self._used is not None:
            for i, e in enumerate(self._params):
                self._used[i] = 1.0 if e.used else 0.0
            used_handle = self.worker.push_pull(self._used_name, self._used, self._used_out)
        error = None
        for h in [e.handle for e in self._params] + [used_handle]:
            try:
                if h is not None:
                    h.wait()
            except adaps.Error as err:
                error = error or err
        for e in self._params:
            e.handle = None
        if error is not None:
            raise error
        self._apply()
        self._synchronized = True

    def _apply(self):
        with torch.no_grad():
            self._check_unmodified()  # both modes: before anything is written
            if self.mode == "server":
                for e in self._params:
                    e.param.copy_(torch.from_numpy(e.buf).view_as(e.param))
                return
            for i, e in enumerate(self._params):
                if self._used_out[i] <= 0.0:
                    continue  # no worker's backward reached it: left as it is (DDP)
                mean = torch.from_numpy(e.buf).view_as(e.param)
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

    @property
    def _step_supports_amp_scaling(self):
        # GradScaler.step(opt) then calls step() (see step's docstring) instead of
        # skipping it on an inf/NaN gradient: every worker must push every step (a worker
        # that skipped would leave the others waiting), so a skipped local step pushes a
        # zero update.
        return getattr(self, "exchange", None) == "update"

    def _step_update(self, grad_scaler):
        skip = False
        if grad_scaler is not None:
            state = grad_scaler._per_optimizer_states[id(self)]
            if state["stage"].name != "UNSCALED":
                grad_scaler.unscale_(self)
            skip = bool(sum(v.item() for v in state["found_inf_per_device"].values()))
        elif getattr(self, "found_inf", None) is not None:
            # torch 2.x's GradScaler: found_inf says this worker's gradient had an inf or a
            # NaN; grad_scale, unless its unscale_ ran already, that they are still scaled.
            skip = bool(self.found_inf.item())
            scale = getattr(self, "grad_scale", None)
            if scale is not None and not skip:
                inv = 1.0 / float(scale)
                with torch.no_grad():
                    for group in self.param_groups:
                        for p in group["params"]:
                            if p.grad is not None:
                                p.grad.mul_(inv)
        self._exchange_row_sparse(skip)  # raises before anything changed
        if self._local_step == 0:
            # The first step since the last exchange: e.snap is where it left the model (the
            # replica, plus this worker's own share with own_updates); every change from
            # here to the next exchange is sent then.
            with torch.no_grad():
                for e in self._params:
                    if e.snap is None:
                        e.snap = torch.empty_like(e.param)
                    e.snap.copy_(e.param)
            self._had_grad = set()
        # Parameters this worker's backward did not reach in any step since the last
        # exchange: its optimizer skipped them (see the warning below).
        if not self._warned_no_grad:
            self._had_grad.update(id(e) for e in self._params if e.param.grad is not None)
        result = None
        if not skip:
            # Adam, AdamW, NAdam, RAdam, RMSprop, Adagrad: the step's denominator estimates
            # the global batch's second moment (adaps.torch_moments); torch's own v stays in
            # the state.
            restore = _moments.global_second_moment(
                self.optimizer, self.worker.live_workers, self._mu2,
                exclude={id(e.param) for e in self._params if e.row_sparse},
                agreement=self.own_updates == "estimate") \
                if self.second_moment == "global" else None
            try:
                result = self.optimizer.step()
            finally:
                if restore is not None:
                    restore()
            self._maybe_late_bins()
        self._local_step += 1
        if self._local_step < self.local_steps:
            return result  # a local step: nothing sent until the local_steps-th
        self._local_step = 0
        no_grad = None if self._warned_no_grad else \
            {id(e) for e in self._params if id(e) not in self._had_grad and not e.row_sparse}
        error = None
        # own_updates: the part of this worker's residue its model holds.
        w = max(1, self.worker.live_workers)
        own_share = 1.0 if self.own_updates == "all" else 1.0 / w
        with torch.no_grad():
            for e in self._params:
                if e.row_sparse:
                    continue  # stepped on the mean gradient, the same on every worker
                if e.stage is None:
                    e.stage = _host_f32(e.buf.shape, e.param)
                # The change since the last exchange (the local steps'), float32 on the
                # host: what this worker sends.
                if e.param.dtype == torch.float32 and e.param.device.type == "cpu":
                    torch.sub(e.param.reshape(e.stage.shape), e.snap.reshape(e.stage.shape),
                              out=e.stage)
                else:
                    e.stage.copy_((e.param.float() - e.snap.float()).reshape(e.stage.shape))
                e.handle = self.worker.push_pull(e.name, e.stage, e.buf)
            error = _wait_all(e for e in self._params if not e.row_sparse)
            for e in self._params:
                if e.row_sparse and error is None:
                    continue
                if error is None:
                    # Every replica: the same start plus the same mean update.
                    if e.replica is not None:
                        # Recompressed: the servers' running sum; the mean delivered this
                        # step is its change (e.buf becomes it, e.replica the sum).
                        np.subtract(e.buf, e.replica, out=e.replica)
                        e.replica, e.buf = e.buf, e.replica
                    mean = torch.from_numpy(e.buf).view(e.param.shape)
                    if no_grad and id(e) in no_grad and not self._warned_no_grad and \
                            bool(mean.any()):
                        self._warned_no_grad = True
                        warnings.warn(
                            "adaps.torch: parameter %r got no gradient on this worker this "
                            "step (with local_steps: since the last exchange), but other "
                            "workers' updates moved it: with "
                            "exchange=\"update\" each worker's optimizer steps on its own "
                            "gradient and skips a parameter without one (no momentum, weight "
                            "decay or Adam step from this worker), where DDP steps it on "
                            "every worker with the mean gradient, so its step here is up to "
                            "1/W smaller (a mixture of experts, a branch some batches skip); "
                            "exchange=\"gradient\" steps it as DDP does (warned once)"
                            % (e.name,), stacklevel=4)
                    if self.own_updates != "off":
                        # This worker's model: the replica plus its share of its own residue.
                        # e.snap is the replica plus e.held (the share before this push); the
                        # push's input buffer (e.stage) is free again and takes the new one.
                        # (The share follows the live worker count, which joins change.)
                        if e.held is None:
                            e.held = torch.zeros(e.stage.shape, dtype=torch.float32)
                        self.worker.residue(e.name, e.stage.numpy())
                        corr = getattr(self._mu2.get(e.param), "corr", None)
                        if corr is not None:
                            # (own_updates="estimate") The others' residues estimated by this
                            # worker's, element by element as far as their updates correlate
                            # (torch_moments).
                            e.stage.mul_(corr.reshape(e.stage.shape).mul(w - 1.0).add_(1.0)
                                         .div_(w))
                        else:
                            e.stage.mul_(own_share)
                        change = self._outer_change(e, mean) + \
                            (e.stage - e.held).view(e.param.shape)
                        e.held.copy_(e.stage)
                    else:
                        change = self._outer_change(e, mean)
                    if e.param.dtype == torch.float32 and e.param.device.type == "cpu":
                        torch.add(e.snap, change, out=e.param)
                    else:
                        e.param.copy_(e.snap.float() + change.to(e.param.device))
                else:
                    e.param.copy_(e.snap)
        if error is not None:
            raise error
        return result

    def _outer_change(self, e, mean):
        # What every replica adds to where the last exchange left it: the workers' mean
        # change itself (outer="average"), or DiLoCo's outer step, SGD with Nesterov momentum
        # (torch's arithmetic, the outer gradient being -mean): b = momentum * b + mean,
        # change = lr * (mean + momentum * b). Every worker has the same mean, so the same
        # buffer and change: the replicas stay equal.
        if self.outer == "average":
            return mean
        b = self._outer_momentum.get(e.name)
        if b is None:
            b = self._outer_momentum[e.name] = torch.zeros(mean.shape, dtype=torch.float32)
        b.mul_(_OUTER_MOMENTUM).add_(mean)
        return mean.add(b, alpha=_OUTER_MOMENTUM).mul_(_OUTER_LR)

    def _exchange_row_sparse(self, skip):
        # row_sparse="exact": each large embedding's gradient (its nonzero elements, exactly)
        # goes out and its mean comes back as the gradient the torch optimizer steps on, on
        # every worker alike (DDP's arithmetic). A skipped step (GradScaler) sends zeros:
        # every worker sends every step.
        entries = [e for e in self._params if e.row_sparse]
        if not entries:
            return
        sparse = {}
        with torch.no_grad():
            for e in entries:
                if e.stage is None:
                    e.stage = _host_f32(e.buf.shape, e.param)
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
                    self._check_row_density(e)
                e.handle = self.worker.push_pull(e.name, e.stage, e.buf)
            error = _wait_all(entries)
            if error is not None:
                raise error
            for e in entries:
                mean = torch.from_numpy(e.buf).view(e.param.shape)
                grad = mean.to(device=e.param.device, dtype=e.param.dtype, copy=True)
                e.param.grad = grad.to_sparse(sparse[e.name]) if e.name in sparse else grad

    def _check_row_density(self, e):
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
                                       100 * e.row_nonzero), stacklevel=4)

    def _maybe_late_bins(self):
        # bin_schedule="auto" (adaps.torch_bins): after the optimizer's step, before the
        # push. The residues' delay is measured now and then: the unsent mass against this
        # step's update (e.snap is where the last exchange left the parameters).
        if self._bins is None:
            return
        steps = _optimizer_steps(self.optimizer)
        if self._bins.wants_measure(steps):
            residue_mass = update_mass = 0.0
            with torch.no_grad():
                for e in self._params:
                    if not e.adacomp or e.kind == "conv" or e.row_sparse or e.snap is None:
                        continue
                    r = np.zeros(e.buf.shape, np.float32)
                    self.worker.residue(e.name, r)
                    residue_mass += float(np.abs(r).sum())
                    update_mass += float((e.param.detach().float() - e.snap.float())
                                         .abs().sum())
            self._bins.measured(residue_mass, update_mass, self._local_step + 1)
        before = self._bins.divisor
        divisor = self._bins.update(max(g["lr"] for g in self.optimizer.param_groups), steps)
        if divisor != before:
            for e in self._params:
                if e.adacomp and e.kind != "conv":
                    self.worker.set_bin_size(e.name, max(1, e.bin_size // divisor))

    def _check_unfrozen(self):
        # A parameter frozen when the optimizer was wrapped was never declared: stepped now,
        # it would move on this worker's gradient alone and the replicas would drift apart
        # (DDP and Horovod leave that silent). Refused before anything of the step changed.
        for name, p in self._frozen:
            if p.grad is not None:
                raise ValueError(
                    "adaps.torch: parameter %r had requires_grad=False when the optimizer was "
                    "wrapped, so it is not exchanged, and it has a gradient now: stepped, it "
                    "would follow this worker's batch alone. To unfreeze it later, leave it "
                    "requires_grad=True when DistributedOptimizer is constructed and freeze it "
                    "(requires_grad_(False)) right after: a parameter without gradient "
                    "sends nothing" % (name,))

    def step(self, closure=None, **kwargs):
        """Server mode: the parameters after the servers' step. Local mode: the torch
        optimizer's step over the averaged gradients. A closure (torch's step(closure)) is
        evaluated once first, with gradients enabled, and its loss returned. Raises
        adaps.Error when the cluster fails (the parameters are then left as they were).
        AMP's GradScaler.step(opt) calls it (the update exchange): torch 1.x's passes
        grad_scaler=itself; torch 2.x's, seeing no such parameter, sets this object's
        found_inf and grad_scale instead."""
        grad_scaler = kwargs.pop("grad_scaler", None)
        if kwargs:
            raise TypeError("adaps.torch: step() got unexpected keyword arguments %s"
                            % sorted(kwargs))
        loss = None
        if closure is not None:
            # As torch's optimizers (and Horovod's) do: the closure recomputes the loss and
            # its gradient once (its backward pushes as any other), then the step runs.
            with torch.enable_grad():
                loss = closure()
        self._check_unfrozen()
        if self.exchange == "update":
            self._synchronized = False
            result = self._step_update(grad_scaler)
            return loss if closure is not None else result
        try:
            if not self._synchronized:
                self.synchronize()
            elif self.mode == "server":
                with torch.no_grad():
                    self._check_unmodified()
        finally:
            self._synchronized = False
            self._hyper_checked = False
            for e in self._params:
                e.pushed_grad = None
                e.passes = 0
        if self.mode == "server":
            # The torch optimizer's own step never runs here: a scheduler made on it must
            # still see a step before its own (torch 1.x counts _step_count, 2.x reads
            # _opt_called), or it warns that the order is wrong.
            if hasattr(self.optimizer, "_step_count"):
                self.optimizer._step_count += 1
            self.optimizer._opt_called = True
            return loss
        result = self.optimizer.step()
        return loss if closure is not None else result

    def pull_parameters(self):
        """Server mode: loads the servers' parameters as of their last completed step into
        the model, exactly (one dense pull per trained tensor; not collective: any worker
        may call it, each on its own). With pull="recompressed" the model that step() leaves
        is this worker's replica, which trails the servers' parameters by what the downlink
        has not sent yet (the servers' residue); call this once at the end of training,
        before evaluating or saving, to get the trained model itself, as a server checkpoint
        holds it. The next step() writes the replica again. Local mode: nothing to do (the
        servers hold no parameters; the model already is every worker's). Call it between
        steps, not while one is in flight."""
        if self.mode != "server":
            return
        if any(e.handle is not None for e in self._params):
            raise adaps._error(adaps.FAILED_PRECONDITION,
                               "adaps.torch: pull_parameters() while a step is in flight "
                               "(backward pushed gradients that step() has not waited for); "
                               "call it after step()")
        with torch.no_grad():
            for e in self._params:
                self.worker.pull_parameters(e.name, e.buf)
                e.param.copy_(torch.from_numpy(e.buf).view_as(e.param))

    def state_dict(self):
        """The torch optimizer's state_dict() plus, under "adaps", this worker's part of the
        exchange: each compressed parameter's error-feedback residue (what it has not sent
        yet), its momentum-correction velocity and its own-update share, the learning rate as
        the bin schedule has seen it (its peak, and since when it has been what it is), and
        the rank. Each
        worker saves its own to resume exactly; torch's load_state_dict ignores the key.
        Hooks registered on this object (torch 2.x's register_state_dict_pre_hook and
        _post_hook, and the load_state_dict ones) run as on a torch optimizer."""
        for hook in getattr(self, "_optimizer_state_dict_pre_hooks", {}).values():
            hook(self)
        sd = self._state_dict()
        for hook in getattr(self, "_optimizer_state_dict_post_hooks", {}).values():
            result = hook(self, sd)
            sd = sd if result is None else result
        return sd

    def _state_dict(self):
        sd = self.optimizer.state_dict()
        residues, velocity, held = {}, {}, {}
        for e in self._params:
            if e.compressed:
                r = np.zeros(e.buf.shape, np.float32)
                self.worker.residue(e.name, r)
                residues[e.name] = torch.from_numpy(r)
            if e.velocity is not None:
                velocity[e.name] = e.velocity.clone()
            if e.held is not None:
                held[e.name] = e.held.clone()
        sd["adaps"] = {"rank": self.worker.rank, "residues": residues, "velocity": velocity,
                       "held": held,
                       "bin_schedule": self._bins.state_dict() if self._bins else None}
        if self.local_steps > 1 or self.outer != "average":
            # Local steps: the steps since the last exchange, where it left the model (the
            # changes since are sent at the next one), and the outer momentum.
            anchor = {e.name: e.snap.clone() for e in self._params
                      if self._local_step and e.snap is not None}
            sd["adaps"]["local_steps"] = {
                "step": self._local_step, "anchor": anchor,
                "outer_momentum": {n: b.clone() for n, b in self._outer_momentum.items()}}
        return sd

    def load_state_dict(self, state_dict):
        """Loads a state_dict(): the torch optimizer's part, and this worker's exchange state
        when the "adaps" part was saved by the same rank (another rank's residues would send
        that rank's mass twice: it is then left out, with a warning)."""
        for hook in getattr(self, "_optimizer_load_state_dict_pre_hooks", {}).values():
            result = hook(self, state_dict)
            state_dict = state_dict if result is None else result
        self._load_state_dict(state_dict)
        for hook in getattr(self, "_optimizer_load_state_dict_post_hooks", {}).values():
            hook(self)

    def _load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        extra = state_dict.pop("adaps", None)
        # The bin schedule's rates and delay (the same on every rank): a resumed run keeps
        # its bins where they were. Checked before anything is loaded.
        bins = (extra or {}).get("bin_schedule")
        if bins is not None and self._bins is not None:
            checked = _bins.BinSchedule(self._bins.start_step)
            checked.load_state_dict(bins)
            bins = checked
        else:
            bins = None
        local = self._checked_local_steps((extra or {}).get("local_steps"))
        self.optimizer.load_state_dict(state_dict)
        self._bind()
        if extra is None:
            return
        if bins is not None:
            self._bins.rates, self._bins.delay = bins.rates, bins.delay
        if local is not None:
            # (Any rank's: the counter and the outer momentum are the same on every rank, and
            # the anchor goes with the model that is loaded, rank 0's as a rule.)
            self._local_step, anchor, self._outer_momentum = local
            for e in self._params:
                if e.name in anchor:
                    e.snap = anchor[e.name].to(device=e.param.device, dtype=e.param.dtype)
            self._had_grad = {id(e) for e in self._params}  # (no warning for the steps before)
        if extra.get("rank") != self.worker.rank:
            warnings.warn("adaps.torch: the exchange state (residues) of rank %s is not loaded "
                          "into rank %d; only the optimizer's state is"
                          % (extra.get("rank"), self.worker.rank), stacklevel=2)
            return
        by_name = {e.name: e for e in self._params}
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
        for name, value in extra.get("velocity", {}).items():
            by_name[name].velocity = value.detach().to(torch.float32).clone()
        for name, value in extra.get("held", {}).items():
            by_name[name].held = value.detach().to(torch.float32).clone()

    def _checked_local_steps(self, part):
        # A checkpoint's local-steps part, checked: (steps since the last exchange, {name:
        # anchor}, {name: outer momentum}), or None without one.
        if part is None:
            return None
        shapes = {e.name: e.param.shape for e in self._params}
        try:
            step = part["step"]
            anchor = {n: v.detach().clone() for n, v in part.get("anchor", {}).items()}
            momentum = {n: v.detach().to(torch.float32).clone()
                        for n, v in part.get("outer_momentum", {}).items()}
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError("adaps.torch: the checkpoint's local_steps part is not the step, "
                             "anchor and outer_momentum that state_dict() writes (%r)"
                             % (err,)) from None
        if isinstance(step, bool) or not isinstance(step, int) or \
                not 0 <= step < self.local_steps:
            raise ValueError("adaps.torch: the checkpoint was saved %r steps after an exchange, "
                             "which local_steps=%d does not reach: resume with the "
                             "local_steps it was saved with" % (step, self.local_steps))
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
        return step, anchor, momentum

    def traffic(self):
        """{layer type: {"push_dense", "push_wire", "pull_dense", "pull_wire": bytes,
        "params": count}} over pushes and pulls so far."""
        out = {}
        for e in self._params:
            t = self.worker.traffic(e.name)
            d = out.setdefault(e.kind, {"push_dense": 0, "push_wire": 0, "pull_dense": 0,
                                        "pull_wire": 0, "params": 0})
            d["push_dense"] += t["push_dense_bytes"]
            d["push_wire"] += t["push_wire_bytes"]
            d["pull_dense"] += t["pull_dense_bytes"]
            d["pull_wire"] += t["pull_wire_bytes"]
            d["params"] += e.param.numel()
        return out

    def traffic_report(self):
        """One line per layer type: push compression (dense bytes / wire bytes)."""
        lines = []
        for kind, d in sorted(self.traffic().items()):
            ratio = d["push_dense"] / d["push_wire"] if d["push_wire"] else float("nan")
            lines.append("%-10s %9d params  push %10.0f KB dense -> %9.1f KB wire  (%6.1fx)  "
                         "pull %8.1f KB wire" % (kind, d["params"], d["push_dense"] / 1e3,
                                                 d["push_wire"] / 1e3, ratio,
                                                 d["pull_wire"] / 1e3))
        return "\n".join(lines)

    def trained_names(self):
        """The declared (trained) parameter names, in declaration order."""
        return [e.name for e in self._params]

    def remove_hooks(self):
        for _, h in self._hooks:
            h.remove()
        self._hooks = []
