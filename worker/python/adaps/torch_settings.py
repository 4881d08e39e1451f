"""adaps.torch's settings: what DistributedOptimizer is asked to do, resolved once.

    s = adaps.torch.Settings(compression="adacomp", bin_size=250)   # or Settings() alone
    opt = adaps.torch.DistributedOptimizer(inner, model, worker, settings=s)
    opt = adaps.torch.DistributedOptimizer(inner, model, worker, bin_size=250)  # the same

Each setting is resolved once, in this order: the explicit argument (Settings(...) or
DistributedOptimizer's keyword of the same name, which wins over a Settings' own), then the
environment adaps.launch exports (the ADAPS_* variable of each, from its flag), then the
default. Unknown names raise TypeError; unknown or contradictory values ValueError, before
anything collective happens; an explicit argument that overrides a different exported value
warns once.

  setting              environment (adaps.launch flag)       default
  -------------------  ------------------------------------  ------------------------------
  mode                 (from server_optimizer)               "local" with servers running
                                                             mean, else "server"
  server_optimizer     ADAPS_SERVER_OPTIMIZER                what the servers' cluster view
                       (--server-optimizer)                  says they run
  compression          ADAPS_COMPRESSION (--compression)     "adacomp" (dict per layer type:
                                                             "TYPE:NAME,..." in the env)
  pull                 ADAPS_PULL (--pull)                   decided by the optimizer (mode,
                                                             servers, worker count)
  bin_size             ADAPS_BIN_SIZE (--bin-size)           500
  conv_bin_size        ADAPS_CONV_BIN_SIZE (--conv-bin-size) 50
  bin_sizes            -                                     {} ({param name: bin size})
  topk_fraction        ADAPS_TOPK_FRACTION (--topk-fraction) 0.001
  lr                   ADAPS_LR (--lr)                       the torch optimizer's
  exchange             ADAPS_EXCHANGE (--exchange)           "update" in local mode with a
                                                             compressor, else "gradient"
  momentum_correction  -                                     with SGD momentum and a
                                                             compressor in server mode
  second_moment        ADAPS_SECOND_MOMENT (--second-moment) "global"
  own_updates          ADAPS_OWN_UPDATES (--own-updates)     "share" for optimizers with a
                                                             second moment, else "off"
  bin_schedule         ADAPS_BIN_SCHEDULE (--bin-schedule)   "auto"
  row_sparse           ADAPS_ROW_SPARSE (--row-sparse)       "exact"
  local_steps          ADAPS_LOCAL_STEPS (--local-steps)     1 (or phases, "4@lr/2,64")
  phase_bins           ADAPS_PHASE_BINS (--phase-bins)       "scale" (or "keep")
  outer                ADAPS_OUTER                           "average"

What each one does is in adaps.torch's module docstring. The settings that depend on the
model, the optimizer or the job (mode, exchange, pull, own_updates, momentum_correction)
are None here until DistributedOptimizer decides them; its `settings` attribute holds the
effective ones, and rank 0 prints them once, on one line of stderr.
"""
import os
import sys
import warnings

import adaps
from adaps import torch_server_hyper as _hyper

__all__ = ["Settings", "local_phases", "resolve_mode"]

COMPRESSIONS = adaps._COMPRESSIONS
PULLS = ("dense", "recompressed", "sparse")
EXCHANGES = ("gradient", "update")
SECOND_MOMENTS = ("global", "local")
OWN_UPDATES = ("share", "all", "off", "estimate")
BIN_SCHEDULES = ("auto", "off")
ROW_SPARSE = ("exact", "off")
OUTERS = ("average", "nesterov")
PHASE_BINS = ("keep", "scale")

# (name, environment variable or None, default, conversion of the environment's string)
_SPEC = (
    ("mode", None, None, str),
    ("server_optimizer", "ADAPS_SERVER_OPTIMIZER", None, str),
    ("compression", "ADAPS_COMPRESSION", "adacomp", adaps._parse_compression),
    ("pull", "ADAPS_PULL", None, str),
    ("bin_size", "ADAPS_BIN_SIZE", 500, int),
    ("conv_bin_size", "ADAPS_CONV_BIN_SIZE", 50, int),
    ("bin_sizes", None, None, None),
    ("topk_fraction", "ADAPS_TOPK_FRACTION", 0.001, float),
    ("lr", "ADAPS_LR", None, float),
    ("exchange", "ADAPS_EXCHANGE", None, str),
    ("momentum_correction", None, None, None),
    ("second_moment", "ADAPS_SECOND_MOMENT", "global", str),
    ("own_updates", "ADAPS_OWN_UPDATES", None, str),
    ("bin_schedule", "ADAPS_BIN_SCHEDULE", "auto", str),
    ("row_sparse", "ADAPS_ROW_SPARSE", "exact", str),
    ("local_steps", "ADAPS_LOCAL_STEPS", 1, lambda v: _local_steps_env(v)),
    ("phase_bins", "ADAPS_PHASE_BINS", "scale", str),
    ("outer", "ADAPS_OUTER", "average", str),
)
NAMES = tuple(s[0] for s in _SPEC)


def setting(name, explicit, env, default, conv=str, stacklevel=3):
    """One setting: the explicit value, else the environment's `env`, else the default
    (warns when an explicit value overrides a different exported one)."""
    value = os.environ.get(env) if env else None
    if explicit is not None:
        if value is not None and not isinstance(explicit, dict) and str(explicit) != value:
            warnings.warn("adaps.torch: %s=%r given to DistributedOptimizer overrides %s=%s "
                          "(set by adaps.launch)" % (name, explicit, env, value),
                          stacklevel=stacklevel)
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


def servers_agree(worker, server_kind, mode):
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


def local_phases(local_steps):
    """local_steps as its phases, [(H, end), ..., (H, None)]: exchange every H steps until
    `end`, the last H to the end. An int H is [(H, None)]. A string of phases H@END,...,H
    ends each phase at a step (END a number of steps taken: "4@1536,64" is [(4, ("step",
    1536)), (64, None)]) or where the learning rate has fallen (END "lr/K": at the first
    exchange where the lr of the optimizer's first group is at most its peak / K; "4@lr/2,64"
    is [(4, ("lr", 2.0)), (64, None)]); docs/local-steps.md, "An H that grows". A phase that
    ends at a step must last a multiple of its H (it ends at an exchange). ValueError for
    anything else."""
    if isinstance(local_steps, int) and not isinstance(local_steps, bool):
        if local_steps < 1:
            raise ValueError("adaps.torch: local_steps must be an int >= 1 (1: exchange every "
                             "step) or phases like \"4@lr/2,64\", got %r" % (local_steps,))
        return [(local_steps, None)]
    if not isinstance(local_steps, str) or "@" not in local_steps:
        raise ValueError("adaps.torch: local_steps must be an int >= 1 (1: exchange every "
                         "step) or phases like \"4@lr/2,64\", got %r" % (local_steps,))
    phases, start = [], 0
    parts = local_steps.replace(" ", "").split(",")
    for k, part in enumerate(parts):
        h, at, end = part.partition("@")
        last = k == len(parts) - 1
        lr = _factor(end[3:]) if end.startswith("lr/") else None
        if not h.isdigit() or int(h) < 1 or bool(at) == last or \
                (at and not end.isdigit() and lr is None):
            raise ValueError(
                "adaps.torch: local_steps=%r: phases are H@END,...,H (exchange every H steps "
                "until END, the last H to the end; END a step, or lr/K: where the learning "
                "rate is at most its peak / K, K > 1), e.g. \"4@lr/2,64\" or \"4@1536,64\""
                % (local_steps,))
        h = int(h)
        if last:
            phases.append((h, None))
        elif lr is not None:
            phases.append((h, ("lr", lr)))
        else:
            end = int(end)
            if end <= start or (end - start) % h:
                raise ValueError(
                    "adaps.torch: local_steps=%r: the phase %d@%d is not a positive multiple "
                    "of %d steps long (it runs from step %d): each phase ends at an exchange"
                    % (local_steps, h, end, h, start))
            phases.append((h, ("step", end)))
            start = end
    return phases


def phase_over(end, steps, lr, peak_lr):
    """Whether a phase's `end` (local_phases) is reached after `steps` steps, the learning
    rate now `lr` and at most `peak_lr` so far."""
    if end is None:
        return False
    if end[0] == "step":
        return steps >= end[1]
    return lr <= peak_lr / end[1]


def _factor(text):
    try:
        k = float(text)
    except ValueError:
        return None
    return k if 1 < k < float("inf") else None


def _local_steps_env(text):
    """ADAPS_LOCAL_STEPS: H, or phases (checked with the rest)."""
    if "@" in text:
        return text
    return int(text)


def _choice(name, value, choices, spelled):
    if value is not None and value not in choices:
        raise ValueError("adaps.torch: unknown %s %r (%s)" % (name, value, spelled))


class Settings:
    """DistributedOptimizer's settings, resolved once (see the module docstring): explicit
    keyword arguments, then the environment adaps.launch exports, then the defaults. The
    attributes are the resolved values (None: decided by DistributedOptimizer from the
    model, the optimizer or the job). Two Settings are equal when their values are."""

    def __init__(self, _stacklevel=2, **explicit):
        unknown = sorted(set(explicit) - set(NAMES))
        if unknown:
            raise TypeError("adaps.torch: Settings() got an unexpected keyword argument %r"
                            % (unknown[0],))
        self._explicit = {k: v for k, v in explicit.items() if v is not None}
        self._resolve(_stacklevel + 2, warn=NAMES)

    def _resolve(self, stacklevel, warn):
        for name, env, default, conv in _SPEC:
            explicit = self._explicit.get(name)
            if name not in warn:
                # (resolved before, and warned about then)
                env = env if explicit is None else None
            value = setting(name, explicit, env, default, conv, stacklevel=stacklevel)
            setattr(self, name, value)
        # Whether the compression and the bin size were named (the argument or the
        # environment): some defaults follow what was left unnamed.
        self.compression_named = "compression" in self._explicit or \
            bool(os.environ.get("ADAPS_COMPRESSION"))
        self.bin_size_named = "bin_size" in self._explicit or \
            bool(os.environ.get("ADAPS_BIN_SIZE"))
        self._check()

    def _check(self):
        resolve_mode(self.mode, self.server_optimizer)
        names = self.compression.values() if isinstance(self.compression, dict) \
            else [self.compression]
        for c in names:
            if c not in COMPRESSIONS:
                raise ValueError("adaps.torch: unknown compression %r (%s)"
                                 % (c, ", ".join(COMPRESSIONS)))
        _choice("pull", self.pull, PULLS, "dense, recompressed or sparse")
        _choice("exchange", self.exchange, EXCHANGES, "gradient or update")
        _choice("second_moment", self.second_moment, SECOND_MOMENTS, "global or local")
        _choice("own_updates", self.own_updates, OWN_UPDATES, "share, all, estimate or off")
        _choice("bin_schedule", self.bin_schedule, BIN_SCHEDULES, "auto or off")
        _choice("row_sparse", self.row_sparse, ROW_SPARSE, "exact or off")
        local_phases(self.local_steps)  # raises for anything else
        _choice("phase_bins", self.phase_bins, PHASE_BINS, "keep or scale")
        _choice("outer", self.outer, OUTERS, "average or nesterov")

    def replace(self, _stacklevel=2, **overrides):
        """These settings with `overrides` (explicit values) winning over their own; only
        the overrides are checked against the environment again."""
        unknown = sorted(set(overrides) - set(NAMES))
        if unknown:
            raise TypeError("adaps.torch: DistributedOptimizer() got an unexpected keyword "
                            "argument %r" % (unknown[0],))
        overrides = {k: v for k, v in overrides.items() if v is not None}
        new = object.__new__(Settings)
        new._explicit = dict(self._explicit, **overrides)
        new._resolve(_stacklevel + 2, warn=tuple(overrides))
        return new

    def effective(self, **decided):
        """A copy with the values DistributedOptimizer decided (mode, exchange, pull, ...)."""
        new = object.__new__(Settings)
        new.__dict__.update(self.__dict__)
        for name, value in decided.items():
            if name not in NAMES:
                raise TypeError("adaps.torch: no setting %r" % (name,))
            setattr(new, name, value)
        return new

    def as_dict(self):
        return {name: getattr(self, name) for name in NAMES}

    def __eq__(self, other):
        return isinstance(other, Settings) and self.as_dict() == other.as_dict()

    def __ne__(self, other):
        return not self == other

    __hash__ = None

    def __repr__(self):
        return "Settings(%s)" % ", ".join("%s=%r" % kv for kv in self.as_dict().items())

    def line(self):
        """One line: "adaps.torch: local mode, update exchange, compression=adacomp, ..."."""
        parts = ["adaps.torch: %s mode" % self.mode, "%s exchange" % self.exchange]
        c = self.compression
        parts.append("compression=%s" % (",".join("%s:%s" % kv for kv in sorted(c.items()))
                                         if isinstance(c, dict) else c))
        for name in ("pull", "bin_size", "conv_bin_size", "topk_fraction", "server_optimizer",
                     "lr", "momentum_correction", "second_moment", "own_updates",
                     "bin_schedule", "row_sparse", "local_steps", "phase_bins", "outer"):
            parts.append("%s=%s" % (name, getattr(self, name)))
        if self.bin_sizes:
            parts.append("bin_sizes=%s" % ",".join("%s:%s" % kv
                                                   for kv in sorted(self.bin_sizes.items())))
        return ", ".join(parts)

    def announce(self, rank, stream=None):
        """Prints line() once, on rank 0."""
        if rank == 0:
            stream = stream if stream is not None else sys.stderr
            stream.write(self.line() + "\n")
            stream.flush()
