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
"sparse", and "recompressed" from 8 workers on (with local_steps other than 1 from 2) for the
update exchange's compressed tensors (rank 0 decides from the job's workers); "sparse" with
servers running plain SGD without weight decay, else "dense"; "recompressed" in local mode, with the update exchange only: the servers keep the running sum
of the steps' mean updates and recompress its change at each AdaComp tensor's bin size divided
by 10, one message for every replica, about 2 pushes' bytes at any number of workers where an
exact pull carries W - 1 pushes (at 16 workers 8x fewer pull bytes), for the delay of what
the downlink holds back; to make up for it the workers push those tensors at a quarter of
their bin (convolutions aside; adaps.torch_update.RECOMPRESSED_PUSH_DIVISOR):
docs/accuracy.md, "Where users train"), bin_size
(ADAPS_BIN_SIZE, 500), conv_bin_size (ADAPS_CONV_BIN_SIZE, 50), topk_fraction
(ADAPS_TOPK_FRACTION, 0.001), lr (ADAPS_LR, from --lr: when set it replaces every group's
lr at construction; unset: the torch optimizer's), exchange (ADAPS_EXCHANGE, see below),
second_moment (ADAPS_SECOND_MOMENT, "global" or "local", see below), own_updates
(ADAPS_OWN_UPDATES, "share", "all", "estimate" or "off"; unset: "share" for optimizers with a second moment, see below),
bin_schedule (ADAPS_BIN_SCHEDULE, "auto" or "off", see below), row_sparse (ADAPS_ROW_SPARSE,
"exact" or "off", see below), local_steps (ADAPS_LOCAL_STEPS, 1), phase_bins
(ADAPS_PHASE_BINS, "scale" or "keep") and outer (ADAPS_OUTER, "average" or "nesterov";
"Local steps" below). An explicit argument that overrides a
different exported value warns once. Together they are one adaps.torch.Settings
(adaps.torch_settings has the table of their variables and defaults), resolved and checked
once: DistributedOptimizer(..., settings=Settings(bin_size=250)) is
DistributedOptimizer(..., bin_size=250); rank 0 prints the effective ones on one line of
stderr ("adaps.torch: local mode, update exchange, compression=adacomp, pull=sparse, ...").

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

Local steps (local_steps=H, the update exchange only; DiLoCo, SparseLoCo): step() runs
this worker's torch optimizer on its own gradient every step, and exchanges only every
H-th step: the steps between send nothing and wait for nothing. The exchange sends the
change of the parameters since the last one (H steps' worth) through the same compressor
with error feedback (AdaComp's residue then holds back part of H steps' change, and is
SparseLoCo's error feedback), and every replica becomes where the last exchange left it
plus the outer step of the workers' mean change: that mean itself with outer="average"
(the default: outer SGD at learning rate 1 without momentum), or DiLoCo's outer SGD with
Nesterov momentum (learning rate 0.7, momentum 0.9: b = 0.9 b + mean, change = 0.7 (mean +
0.9 b)), applied alike on every worker to the same mean, so the replicas stay equal (one
more copy of the parameters, the momentum b). H = 1 with outer="average" is the update
exchange of every step, bit for bit. Between exchanges each worker's model is where the
last exchange left it (the replica, plus its share of its own residue with own_updates)
plus its own local steps, so the replicas differ there; rank 0 evaluates and saves its
own. Make the number of steps a multiple of H, or call exchange_now() (collective) at the
end: else the last steps stay each worker's own. local_steps may also be phases,
"H@END,...,H": every H steps until END, then the next phase's H, END a step count
("4@1536,64") or "lr/K", the first exchange where the first param group's lr is at most
its highest so far / K ("4@lr/2,64"; every worker must step the same lr schedule);
state_dict() keeps the phase; a worker that joins is refused; rank 0 says on stderr when a
phase begins, at which step and why (docs/local-steps.md, "An H that grows"). With phases,
phase_bins="scale" (the default) pushes each phase at the AdaComp bins times the first
phase's H / its own, down to 25 (4@896,16 at bin 2000: 2000 in the first phase, 500 after;
at the default bin each phase's 500 / H, as local_steps=H alone declares; divided as below
for recompressed pulls and the bin schedule; convolutions keep theirs); "keep" pushes
every phase at the first phase's bins (docs/local-steps.md, "Push bins that follow the
phase's H"). With local steps, a large embedding is not exchanged as its gradient's
nonzeros (row_sparse: that would exchange every step) but through the update exchange like
the rest; second_moment="global" keeps each local step's denominator at the global batch's
estimated second moment (what H steps of the global batch would have), own_updates still
adds this worker's share of its residue at each exchange, and bin_schedule still counts
the optimizer's (local) steps. state_dict() keeps the steps since the last exchange, where
it left the model, and the outer momentum (loaded into any rank). A failed exchange leaves
the model where the last exchange put it (the local steps since are lost). AdaComp's bin
shrinks with H (each exchange sends H steps' change, and what a residue holds back waits
whole exchanges): unless a bin size is named (bin_size, bin_sizes), a tensor at the
default bin is declared at bin_size / H (500 / H, down to 25; its pushes and recompressed
pulls follow from it as at H = 1), convolutions keeping theirs; at the undivided bin the
transformer lost 4.5% at H = 4 (docs/local-steps.md). The pulls default to recompressed
from 2 workers on (pushed at a quarter of the bin): at 4 workers exact pulls of pushes at
the bin cost the transformer 4.1% where recompressed ones held it. DiLoCo's Nesterov outer
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
master values on the servers). A float32 CUDA parameter pushed with AdaComp (or dense) takes
the worker library's device path when the library was built with CUDA (adaps.CUDA_BUILT): its
residue stays on the GPU, AdaComp runs there on the current stream's gradient and only the
update crosses to the host; what the pull answers lands in a CUDA buffer (docs/gpu.md). Other
CUDA tensors (another dtype, a large embedding's exact rows, Top-k), and all of a process
whose device did not open (warned once), are staged through pinned host memory on the way
out and copied back to the device on the way in.
"""
import contextlib
import inspect
import warnings

import torch

import adaps
from adaps import torch_moments as _moments
from adaps import torch_settings as _settings
from adaps.torch_broadcast import (broadcast_object, broadcast_optimizer_state,
                                   broadcast_parameters)
from adaps.torch_exchange import Entry, GradientExchange, ServerExchange
from adaps.torch_settings import Settings, resolve_mode
from adaps.torch_settings import servers_agree as _servers_agree
from adaps.torch_settings import setting as _setting  # noqa: F401 (adaps.hf)
from adaps.torch_update import LOCAL_STEPS_MIN_BIN, UpdateExchange
from adaps.torch_update import optimizer_steps as _optimizer_steps  # noqa: F401

__all__ = ["DistributedOptimizer", "Settings", "broadcast_parameters",
           "broadcast_optimizer_state", "broadcast_object", "layer_type", "pull_bin_divisor"]

_CONV_TYPES = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.ConvTranspose1d,
               torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d)
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
_RECOMPRESSED_FROM_WORKERS = adaps._RECOMPRESSED_FROM_WORKERS


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


# -- what is trained, and how each tensor is sent ---------------------------------------------
def _collect(optimizer, model, bin_size, conv_bin_size, bin_sizes, bin_size_named=False):
    """The trained tensors (Entry records, in the optimizer's order), each with its layer
    type and bin size; `row_sparse` marks the large embeddings that may go exactly."""
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
            default = kind != "conv" and t == bin_size and not bin_size_named and \
                name not in bin_sizes
            t = bin_sizes.pop(name, t)
            out.append(Entry(name, p, kind, int(t)))
            out[-1].row_sparse = id(p) in large
            out[-1].bin_default = default
    if bin_sizes:
        raise ValueError("adaps.torch: bin_sizes names parameters that are not trained "
                         "(not in the optimizer or not requiring a gradient): %s"
                         % sorted(bin_sizes))
    return out


def _choose_compression(entries, optimizer, compression, named, topk_fraction):
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
    for e in entries:
        e.compression = _kind_compression(compression, e.kind)
        e.topk_fraction = topk_fraction
        if e.row_sparse:
            e.compression, e.topk_fraction = "topk", 1.0
        elif e.kind == "embedding" and id(e.param) in plain and e.compression == "adacomp":
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
                    "dense" % e.name, stacklevel=4)
        e.compressed = _compressed(e.compression)
        e.adacomp = e.compression == "adacomp"


# -- the choice of the exchange, once ---------------------------------------------------------
def _decide(settings, optimizer, entries, mode, server_kind, compressing):
    """The effective settings (all but a local-mode pull left to rank 0) and the step after
    which the bins shrink (None: never). Raises before anything collective happened."""
    exchange = settings.exchange
    if exchange is None:
        # Local mode with a compressor sends each worker's update (its own optimizer's
        # step), with error feedback on the update; dense pushes send the gradient, which
        # is then exact DDP. Server mode: the servers run the optimizer on gradients.
        exchange = "update" if mode == "local" and compressing else "gradient"
    elif exchange == "update" and mode != "local":
        raise ValueError("adaps.torch: exchange='update' needs local mode (servers with "
                         "--optimizer=mean, adaps.launch --server-optimizer mean): in "
                         "server mode the servers run the optimizer on the gradients")
    update = exchange == "update"
    phases = _settings.local_phases(settings.local_steps)
    if (phases != [(1, None)] or settings.outer != "average") and not update:
        # The gradient exchange (server mode, dense pushes in local mode) sends every
        # step's gradient: there is no local step to take.
        raise ValueError(
            "adaps.torch: local_steps=%s, outer=%r need local mode's update exchange: "
            "servers running --optimizer=mean (adaps.launch --server-optimizer mean) and "
            "exchange=\"update\" (the default with a compressor; with "
            "compression=\"dense\" name it); this optimizer is in %s mode with "
            "exchange=%r" % (settings.local_steps, settings.outer, mode, exchange))
    own_updates = settings.own_updates
    if own_updates is None:
        # Default: this worker's share for optimizers with a second moment (Adam's
        # family, RMSprop, Adagrad); off for the rest (SGD with momentum: the residue holds
        # velocity, and the Fashion-MNIST MLP/CNN lost 1.4/2.3 pp with all of it;
        # docs/accuracy.md). "estimate" helps the language models and costs a vision
        # transformer ("Each worker's share of its own residue, estimated").
        own_updates = "share" if _moments.changes_step(optimizer) else "off"
    # The model holds this worker's residue only where there is one: the update
    # exchange of a compressor with error feedback.
    if not update or not compressing:
        own_updates = "off"
    # The step of the optimizer after which the bins shrink (None: never): optimizers
    # with a second moment (adaps.torch_moments.changes_step) in the update exchange of
    # AdaComp tensors; 10 / (1 - beta1) steps (100 without betas).
    bins_from = None
    if settings.bin_schedule == "auto" and update and _moments.changes_step(optimizer):
        beta1 = optimizer.param_groups[0].get("betas", (0.9, 0.999))[0]
        if beta1 < 1:
            bins_from = max(1, int(round(10.0 / (1.0 - beta1))))
    if mode == "local" and settings.pull == "recompressed" and not update:
        # A recompressed pull from servers running mean is the running sum of the steps'
        # means: right for the update exchange (the sum of the updates is where the
        # parameters are), wrong for mean gradients (what the downlink holds back would
        # come back steps late, and a run with momentum diverges).
        raise ValueError("adaps.torch: recompressed pulls in local mode need the update "
                         "exchange (exchange=\"update\", the default with a "
                         "compressor): with exchange=\"gradient\" take sparse (each "
                         "step's exact mean) or dense pulls")
    if update and compressing and \
            any(g.get("nesterov") and g.get("momentum", 0) for g in optimizer.param_groups):
        # Not refused (it trains, as plain momentum does), but not what DDP gives either.
        warnings.warn("adaps.torch: SGD with nesterov=True in local mode with compression: "
                      "AdaComp delivers each element's updates in bursts, over which "
                      "Nesterov's lookahead cancels out, so the run trains as plain momentum "
                      "does (a ResNet measured 0.9 pp below dense with Nesterov, 0.7 pp "
                      "above dense with plain momentum; docs/accuracy.md \"Two recipes added "
                      "last\"); nesterov=False, or compression=\"dense\", avoids the "
                      "difference", stacklevel=3)
    if settings.lr is not None:
        for g in optimizer.param_groups:
            g["lr"] = settings.lr
    for e in entries:
        # row_sparse="exact": in the update exchange, a large embedding sends its
        # gradient's nonzero elements exactly (Top-k of every nonzero) and every worker's
        # optimizer steps on their mean, as DDP's does (docs/accuracy.md). Not with local
        # steps: that would exchange every step; the table goes with the rest.
        e.row_sparse = e.row_sparse and settings.row_sparse == "exact" and update and \
            phases == [(1, None)] and \
            _compressed(_kind_compression(settings.compression, e.kind))
        if phases[0][0] > 1 and e.bin_default:
            # Local steps: an exchange sends H steps' change, and what a residue holds back
            # waits whole exchanges, so the default bin is divided by H (convolutions and
            # named bins are kept), down to LOCAL_STEPS_MIN_BIN. The transformer at H = 16
            # over 1,024 steps: +1.2% against dense at 4 workers, -2.1% at 16, where the
            # undivided bin lost 4-16% over 320 steps; at H = 64 over 3,072 steps the bin of
            # 25 ended 1.8% and 8.8% below dense at 4 and 16 workers, where 500 / 64 = 7 would
            # push every element at 16 workers (pushed at a quarter of it: docs/local-steps.md).
            # With phases, the first phase's H.
            e.bin_size = max(min(e.bin_size, LOCAL_STEPS_MIN_BIN),
                             e.bin_size // phases[0][0])
    _choose_compression(entries, optimizer, settings.compression, settings.compression_named,
                        settings.topk_fraction)
    correction, pull = False, settings.pull
    if mode == "server":
        trained = {id(e.param) for e in entries}
        correction = ServerExchange.resolve_correction(
            optimizer, trained, settings.momentum_correction, compressing)
        # (raises before anything collective happened)
        hyper = ServerExchange.hyper_settings(optimizer, trained, correction, server_kind)[0]
        if pull is None:
            # Sparse pulls (the step's exact change at the elements some worker sent; dense
            # when that is smaller) wherever the servers' step changes only those elements:
            # servers known to run plain SGD with no weight decay (e.g. under momentum
            # correction). Elsewhere the servers would refuse them: dense.
            pull = "sparse" if server_kind == "sgd" and not hyper.get("momentum", 0) and \
                not hyper.get("weight_decay", 0) else "dense"
    elif pull is None:
        pull = "sparse"  # local mode: the servers' mean changes only what was sent
    return settings.effective(mode=mode, server_optimizer=server_kind, exchange=exchange,
                              own_updates=own_updates, momentum_correction=correction,
                              pull=pull), bins_from


def _check_local_join(exchange, settings):
    """A worker that joined a running local-mode job (or registered again into it after a
    restart) starts where every replica is, the job's initial parameters (rank 0's broadcast)
    plus the servers' running sum of the exchanges' means, when the servers keep that sum for
    every tensor (the update exchange's: compressed local mode, exchange="update") and the
    outer step is the mean itself. Anything else (exchange="gradient", where the servers hold
    only each step's mean gradient; outer="nesterov", whose momentum is each worker's own; a
    row_sparse table, stepped by each worker's optimizer): the joiner would train from its own
    start, offset from the others for good: refused (RuntimeError), saying why. So are
    local_steps phases ("4@1536,64"): the joiner counts its steps from its own first, not
    from the job's, and would take the job's phase for the first."""
    phases = _settings.local_phases(settings.local_steps)
    if len(phases) > 1:
        raise RuntimeError(
            "adaps.torch: this worker joined a running job with local_steps=%r: its steps "
            "count from its own first, so it cannot tell which phase the job is in. Give "
            "the joiner the H the job exchanges at now (local_steps=%d once the job is in "
            "its last phase: each worker pushes once an exchange whatever its H), or restart "
            "the whole job from a checkpoint (state_dict() keeps the phase)"
            % (settings.local_steps, phases[-1][0]))
    held = [e.name for e in exchange.entries if not exchange.joinable(e)]
    if not held and settings.outer == "average":
        warnings.warn(
            "adaps.torch: this worker joined a running local-mode job: it starts where "
            "every replica is (the job's initial parameters plus the servers' running sum of "
            "the exchanges' means), with its own residues empty and its torch optimizer's "
            "state as at the job's start (rank 0's broadcast; Adam's moments warm up again)",
            stacklevel=4)
        return
    why = ("outer=%r (DiLoCo's momentum is each worker's own state)" % settings.outer
           if settings.outer != "average" else
           "the servers do not hold %s%s (%s)" % (
               ", ".join(held[:3]), ", ..." if len(held) > 3 else "",
               "exchange=\"gradient\": each step's mean gradient only"
               if settings.exchange == "gradient" else
               "row_sparse tables, which each worker's optimizer steps"))
    raise RuntimeError(
        "adaps.torch: this worker joined a running job (or registered again into it after a "
        "restart) whose servers run --optimizer=mean (local mode), where the servers hold the "
        "model only as the running sum of the update exchange's means (compressed local "
        "mode, exchange=\"update\", with outer=\"average\"); here %s. It would train from its "
        "own start, offset from the others for good. Workers can join such a job with "
        "exchange=\"update\" and outer=\"average\", or in server mode (the servers hold the "
        "parameters and a joiner pulls them); else restart the whole job with the new worker "
        "count, from a checkpoint, as torchrun does" % why)


def _make_exchange(settings, worker, optimizer, entries, backward_passes_per_step, bins_from):
    """The exchange of the effective settings: the one place that tests mode and exchange."""
    if settings.mode == "server":
        return ServerExchange(worker, optimizer, entries, settings, backward_passes_per_step,
                              {id(e.param) for e in entries})
    if settings.exchange == "gradient":
        return GradientExchange(worker, optimizer, entries, settings,
                                backward_passes_per_step)
    return UpdateExchange(worker, optimizer, entries, settings, bins_from)


def _read_only(name, doc):
    return property(lambda self: getattr(self.settings, name), doc=doc)


class DistributedOptimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer that trains `model` over adaps; see the module docstring.

    Args:
      optimizer: the torch optimizer over the parameters to train (it shares its
        param_groups and state with this object; state_dict() is its state_dict() plus
        this worker's exchange state under "adaps": residues, velocities, own shares).
      model: the torch.nn.Module (names, layer types, the state broadcast at start), or
        the torch.compile of one (its names are the module's own).
      worker: an adaps.Worker (default: adaps.worker_from_env()).
      settings: an adaps.torch.Settings (default: Settings(), the environment's).
      backward_passes_per_step: Horovod's gradient accumulation (the gradient exchange).
      **overrides: any setting by name, winning over `settings` (adaps.torch_settings):
        mode, server_optimizer, compression, bin_size, conv_bin_size, bin_sizes,
        topk_fraction, pull, lr, exchange, momentum_correction, second_moment, own_updates,
        bin_schedule, row_sparse, local_steps, phase_bins, outer.

    The exchange (ServerExchange, GradientExchange or UpdateExchange) is chosen once, here;
    this object hooks backward, steps, and hands the rest to it.
    """

    def __init__(self, optimizer, model, worker=None, settings=None,
                 backward_passes_per_step=1, **overrides):
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
        unknown = sorted(set(overrides) - set(_settings.NAMES))
        if unknown:
            raise TypeError("DistributedOptimizer.__init__() got an unexpected keyword "
                            "argument %r" % (unknown[0],))
        if settings is None:
            settings = Settings(_stacklevel=3, **overrides)
        elif not isinstance(settings, Settings):
            raise TypeError("adaps.torch: settings must be an adaps.torch.Settings, got %s"
                            % type(settings).__name__)
        elif overrides:
            settings = settings.replace(_stacklevel=3, **overrides)
        if worker is None and settings.server_optimizer is None and settings.mode is None:
            # Neither the launcher nor the script says what the servers run: they say it
            # in the cluster view (registering now; every rank does the same).
            worker = adaps.worker_from_env()
        mode, server_kind = resolve_mode(
            settings.mode, _servers_agree(worker, settings.server_optimizer, settings.mode))
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
        entries = _collect(optimizer, model, settings.bin_size, settings.conv_bin_size,
                           settings.bin_sizes, settings.bin_size_named)
        # The optimizer's parameters frozen now: not exchanged; step() refuses one that has
        # a gradient later (unfrozen after wrapping).
        trained = {id(e.param) for e in entries}
        self._frozen = [(names.get(id(p), "__group%d.param%d" % (gi, pi)), p)
                        for gi, g in enumerate(optimizer.param_groups)
                        for pi, p in enumerate(g["params"])
                        if id(p) not in trained and p.numel() > 0]
        # Whether anything trained is pushed with a compressor (a kind a dict leaves out is
        # AdaComp's): the defaults follow what is sent, not the names given.
        compressing = any(_compressed(_kind_compression(settings.compression, e.kind))
                          for e in entries)
        if isinstance(backward_passes_per_step, bool) or \
                not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise ValueError("adaps.torch: backward_passes_per_step must be an int >= 1, got %r"
                             % (backward_passes_per_step,))
        self.backward_passes_per_step = backward_passes_per_step
        effective, bins_from = _decide(settings, optimizer, entries, mode, server_kind,
                                       compressing)
        self.settings = effective
        self.optimizer = optimizer
        # Every check is done: from here on the calls are collective.
        self.worker = worker if worker is not None else adaps.worker_from_env()
        if worker is None:  # (made just now: what its servers run is checked as above)
            _servers_agree(self.worker, server_kind, mode)
        broadcast_parameters(model.state_dict(), self.worker)
        broadcast_optimizer_state(optimizer, self.worker)
        if settings.pull is None and effective.exchange == "update" and compressing:
            # Where the exact pull carries the others' pushes (W - 1 of them) and the
            # recompressed one about two, the recompressed one is the default; with local
            # steps at any number of workers from 2 (its pushes at a quarter of the bin held
            # the transformer at 4 workers where exact pulls of pushes at the bin lost 4.1%,
            # at about the same bytes: docs/local-steps.md). Rank 0 decides from the job's
            # workers; a worker that joins later takes its decision (every worker must
            # declare a tensor's pulls alike).
            local = _settings.local_phases(effective.local_steps) != [(1, None)]
            workers = self.worker.num_workers
            self.settings = effective.effective(pull=broadcast_object(
                "recompressed" if workers >= _RECOMPRESSED_FROM_WORKERS or
                (local and workers >= 2) else "sparse", self.worker))
        super().__init__(optimizer.param_groups, optimizer.defaults)
        self._bind()
        self._synchronized = False
        self._hooks = []
        # This optimizer's small tensors are fused only with each other: a trainer that steps
        # two optimizers at different times (a GAN) must not have one wait for the other's.
        self.worker.close_fusion_buckets()
        self._exchange = _make_exchange(self.settings, self.worker, optimizer, entries,
                                        backward_passes_per_step, bins_from)
        if mode == "local" and self.worker.rejoined:
            # (Before the tensors are declared: the job's workers wait for nothing of this one.)
            _check_local_join(self._exchange, self.settings)
        self._exchange.declare(pull_bin_divisor(self.worker.live_workers))
        self._exchange.declare_more()
        self.worker.close_fusion_buckets()
        self._exchange.start(self._hooks)
        self.settings.announce(self.worker.rank)
        self._ready = True

    # -- the effective settings (read-only) -------------------------------------------------
    mode = _read_only("mode", '"server" or "local"')
    server_kind = _read_only("server_optimizer", "what the servers run (None: not said)")
    exchange = _read_only("exchange", '"gradient" or "update"')
    compression = _read_only("compression", "a name, or a dict per layer type")
    pull = _read_only("pull", '"sparse", "dense" or "recompressed"')
    second_moment = _read_only("second_moment", '"global" or "local"')
    own_updates = _read_only("own_updates", '"share", "all", "estimate" or "off"')
    bin_schedule = _read_only("bin_schedule", '"auto" or "off"')
    row_sparse = _read_only("row_sparse", '"exact" or "off"')
    local_steps = _read_only("local_steps", "the update exchange every local_steps steps")
    phase_bins = _read_only("phase_bins", '"scale" or "keep" (push bins with phases)')
    outer = _read_only("outer", '"average" or "nesterov"')
    momentum_correction = _read_only("momentum_correction", "DGC's, in server mode")

    # (What tests and tools read of the exchange's state.)
    _collect = staticmethod(_collect)

    @property
    def _params(self):
        return self._exchange.entries

    def _entry_pull(self, e):
        return self._exchange.entry_pull(e)

    @property
    def _local_step(self):
        return getattr(self._exchange, "local_step", 0)

    @property
    def _bins(self):
        bins = getattr(self._exchange, "bins", None)
        return bins.schedule if bins is not None else None

    # -- set-up ---------------------------------------------------------------------------
    def _bind(self):
        # This object and the torch optimizer share one list of groups and one state.
        self.param_groups = self.optimizer.param_groups
        self.state = self.optimizer.state
        self.defaults = self.optimizer.defaults

    def add_param_group(self, param_group):
        if getattr(self, "_ready", False):
            raise NotImplementedError("adaps.torch: add a param group to the torch optimizer "
                                      "before wrapping it (tensors are declared collectively "
                                      "at construction)")
        super().add_param_group(param_group)

    # -- the training-loop API ------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate into p.grad without pushing (DDP's
        model.no_sync()); the first pass after it pushes the sum, or step() does."""
        before, self._exchange.no_sync = self._exchange.no_sync, True
        try:
            yield
        finally:
            self._exchange.no_sync = before

    def synchronize(self):
        """Pushes zeros for what backward did not reach, waits for every pull and applies
        it: server mode writes the pulled parameters into the model, local mode sets each
        p.grad to the step's mean over workers (so it can be clipped before step()).
        step() calls it unless it was called since the last step.

        With exchange="update" there is nothing to wait for yet: p.grad stays this worker's
        own gradient (clip it here as you would on one machine) and step() exchanges the
        update."""
        self._synchronized = self._exchange.synchronize()

    @property
    def _step_supports_amp_scaling(self):
        # GradScaler.step(opt) then calls step() (see step's docstring) instead of
        # skipping it on an inf/NaN gradient: every worker must push every step (a worker
        # that skipped would leave the others waiting), so a skipped local step pushes a
        # zero update.
        return getattr(getattr(self, "_exchange", None), "amp_scaling", False)

    def _amp_skip(self, grad_scaler):
        """Whether AMP's GradScaler found an inf/NaN in this worker's gradient (unscaling
        it first where it has not been)."""
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
        return skip

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
        result = self._exchange.step(self, grad_scaler, self._synchronized)
        return loss if closure is not None else result

    def exchange_now(self):
        """Local steps: sends now what the steps since the last exchange changed, as the next
        exchange would have, and waits for it, so every worker's model is the same (what
        DDP's always is); the next interval counts from here. Collective: every worker calls
        it after the same step. Call it at the end of training, before the model is
        evaluated or saved, when the number of steps is not a multiple of H (with phases it
        rarely is); adaps.lightning and adaps.hf call it there. Returns whether it
        exchanged: False when the last step did (or without local steps: every step
        exchanges). Raises adaps.Error when the cluster fails (the model is then where the
        last exchange left it, as for a failed step)."""
        return self._exchange.exchange_now()

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
        self._exchange.pull_parameters()

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
        sd = self.optimizer.state_dict()
        sd["adaps"] = self._exchange.state_part()
        for hook in getattr(self, "_optimizer_state_dict_post_hooks", {}).values():
            result = hook(self, sd)
            sd = sd if result is None else result
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
        checked = self._exchange.check_state(extra or {})  # before anything is loaded
        self.optimizer.load_state_dict(state_dict)
        self._bind()
        if extra is None:
            return
        self._exchange.load_checked(checked)
        if extra.get("rank") != self.worker.rank:
            warnings.warn("adaps.torch: the exchange state (residues) of rank %s is not loaded "
                          "into rank %d; only the optimizer's state is"
                          % (extra.get("rank"), self.worker.rank), stacklevel=3)
            return
        self._exchange.load_state(extra)

    def traffic(self):
        """{layer type: {"push_dense", "push_wire", "pull_dense", "pull_wire": bytes,
        "params": count}} over pushes and pulls so far."""
        out = {}
        for e in self._exchange.entries:
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
        return [e.name for e in self._exchange.entries]

    def remove_hooks(self):
        for _, h in self._hooks:
            h.remove()
        self._hooks = []


# The settings' names as keyword parameters in the signature (adaps.lightning and tools read
# it); **overrides takes them.
DistributedOptimizer.__init__.__signature__ = inspect.signature(
    DistributedOptimizer.__init__).replace(parameters=[
        p for p in inspect.signature(DistributedOptimizer.__init__).parameters.values()
        if p.kind != inspect.Parameter.VAR_KEYWORD] + [
        inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None)
        for n in _settings.NAMES])
