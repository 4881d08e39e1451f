"""What the servers can run for a torch optimizer (server mode of adaps.torch).

The servers hold one optimizer for every tensor (adaps-server --optimizer=sgd|momentum|
nesterov|adam) with one set of hyper-parameters, so server mode is exact only for
torch.optim.SGD and torch.optim.Adam with the same hyper-parameters in every param group.
Anything else raises ValueError naming local mode, where the torch optimizer itself runs.
"""
import torch

LOCAL_HINT = ("use local mode instead: servers with --optimizer=mean (python3 -m adaps.launch "
              "--server-optimizer mean), where the torch optimizer runs on every worker over "
              "each step's mean gradient")

# Keys of a param group that decide what the servers compute, per optimizer class.
_SGD_KEYS = ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize")
_ADAM_KEYS = ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize")

SERVER_KINDS = ("sgd", "momentum", "nesterov", "adam")


def _keys(optimizer):
    if type(optimizer) is torch.optim.SGD:
        return _SGD_KEYS
    if type(optimizer) is torch.optim.Adam:
        return _ADAM_KEYS
    if type(optimizer) is torch.optim.AdamW:
        raise ValueError("adaps.torch: torch.optim.AdamW cannot run on the servers: their Adam "
                         "applies weight decay as torch.optim.Adam does (L2, added to the "
                         "gradient before the moments), not decoupled from them as AdamW "
                         "does; " + LOCAL_HINT)
    raise ValueError("adaps.torch: server mode runs only torch.optim.SGD (with or without "
                     "momentum/Nesterov) and torch.optim.Adam on the servers; %s cannot run "
                     "there; %s" % (type(optimizer).__name__, LOCAL_HINT))


def group_settings(optimizer, groups):
    """The server-relevant settings shared by `groups` (ValueError when they differ)."""
    keys = _keys(optimizer)
    first = None
    for i, g in enumerate(groups):
        s = tuple((k, _plain(g.get(k))) for k in keys)
        if first is None:
            first = (i, s)
        elif s != first[1]:
            diff = [k for (k, a), (_, b) in zip(s, first[1]) if a != b]
            raise ValueError("adaps.torch: param groups %d and %d differ in %s; the servers "
                             "run one set of hyper-parameters for every tensor; %s"
                             % (first[0], i, ", ".join(diff), LOCAL_HINT))
    return dict(first[1]) if first else {}


def _plain(v):
    if isinstance(v, torch.Tensor):
        return float(v)
    if isinstance(v, (tuple, list)):
        return tuple(_plain(x) for x in v)
    return v


def required_kinds(optimizer, settings):
    """The server optimizer kinds that compute exactly what `optimizer` would."""
    if settings.get("maximize"):
        raise ValueError("adaps.torch: maximize=True cannot run on the servers; " + LOCAL_HINT)
    if type(optimizer) is torch.optim.Adam:
        if settings.get("amsgrad"):
            raise ValueError("adaps.torch: amsgrad cannot run on the servers; " + LOCAL_HINT)
        return ("adam",)
    if settings.get("dampening", 0):
        raise ValueError("adaps.torch: SGD dampening cannot run on the servers; " + LOCAL_HINT)
    if settings.get("nesterov"):
        return ("nesterov",)
    if settings.get("momentum", 0):
        return ("momentum",)
    return ("sgd", "momentum", "nesterov")  # momentum 0 is plain SGD on all three


def check_kind(optimizer, settings, server_kind):
    """ValueError when the servers (running `server_kind`, None = unknown) would compute
    something else than `optimizer` with `settings`."""
    kinds = required_kinds(optimizer, settings)
    if server_kind is not None and server_kind not in kinds:
        raise ValueError(
            "adaps.torch: the servers run --optimizer=%s but the torch optimizer (%s, %s) "
            "needs --optimizer=%s (python3 -m adaps.launch --server-optimizer %s); or %s"
            % (server_kind, type(optimizer).__name__,
               ", ".join("%s=%s" % kv for kv in sorted(settings.items())), kinds[0], kinds[0],
               LOCAL_HINT))


def hyper_list(settings):
    """[(adaps hyper-parameter name, value)] for Worker.set_hyper."""
    h = [("learning_rate", float(settings["lr"])),
         ("weight_decay", float(settings.get("weight_decay", 0.0)))]
    if "momentum" in settings:
        h.append(("momentum", float(settings["momentum"])))
    if "betas" in settings:
        h.append(("beta1", float(settings["betas"][0])))
        h.append(("beta2", float(settings["betas"][1])))
    if "eps" in settings:
        h.append(("epsilon", float(settings["eps"])))
    return h
