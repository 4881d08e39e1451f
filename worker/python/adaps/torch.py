"""adaps.torch: data-parallel PyTorch training through adaps, in the manner of Horovod.

    import adaps, adaps.torch
    worker = adaps.worker_from_env()
    opt = adaps.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                           model, worker, compression="adacomp")
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()   # each gradient is pushed as soon as it is ready
        opt.step()                        # waits for the pulls, updates the parameters

Every parameter of `model` that requires a gradient is declared once, named by its
qualified name ("conv1.weight"), with the AdaComp bin size chosen by layer type:
`conv_bin_size` (50) for parameters of convolution modules, `bin_size` (500) for all others
(`bin_sizes={"name": T}` overrides one). Rank 0's initial values become everyone's.

A hook on each parameter's gradient accumulator pushes the gradient the moment backward
has produced it, so compression and the network overlap the rest of backward. step() then
waits for every pull and writes the result back. Two server modes:

  mode="server"  the servers run the optimizer (adaps-server --optimizer=sgd|momentum|
                 nesterov|adam); step() copies the pulled parameters into the model. The
                 local optimizer is only used for its hyper-parameters: rank 0 sends
                 lr/momentum/weight_decay (and Adam's betas/eps) to the servers whenever they
                 change, so LR schedulers work.
  mode="local"   the servers only sum (adaps-server --optimizer=sum); step() sets each
                 p.grad to the mean over workers of the (decompressed) pushed gradients and
                 runs the local torch optimizer.

The default mode comes from ADAPS_SERVER_OPTIMIZER (set by adaps.launch): "sum" -> local,
anything else -> server.
"""
import os

import numpy as np
import torch

import adaps

_CONV_TYPES = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.ConvTranspose1d,
               torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d)


def layer_type(module):
    """"conv", "recurrent", "linear", "embedding" or "other" for a module."""
    if isinstance(module, _CONV_TYPES):
        return "conv"
    if isinstance(module, (torch.nn.RNNBase, torch.nn.RNNCellBase)):
        return "recurrent"
    if isinstance(module, torch.nn.Linear):
        return "linear"
    if isinstance(module, torch.nn.Embedding):
        return "embedding"
    return "other"


def default_mode():
    return "local" if os.environ.get("ADAPS_SERVER_OPTIMIZER", "") == "sum" else "server"


class _Param:
    __slots__ = ("name", "param", "kind", "bin_size", "buf", "prev", "handle", "zeros")

    def __init__(self, name, param, kind, bin_size):
        self.name = name
        self.param = param
        self.kind = kind
        self.bin_size = bin_size
        self.buf = None      # where the pull lands (float32, contiguous, the param's shape)
        self.prev = None     # local mode: the running sum at the previous step
        self.handle = None   # the push_pull in flight this step
        self.zeros = None    # pushed for a parameter that got no gradient this step


class DistributedOptimizer:
    """Wraps a torch optimizer; see the module docstring.

    Args:
      optimizer: a torch.optim.Optimizer over (a superset of) model's parameters.
      model: the torch.nn.Module whose parameters are trained.
      worker: an adaps.Worker (default: adaps.worker_from_env()).
      mode: "server" or "local" (default: from ADAPS_SERVER_OPTIMIZER).
      compression: "adacomp" (default), "dense", "topk" or "sign"; or a dict from layer
        type ("conv", "linear", "recurrent", "embedding", "other") to one of those.
      bin_size, conv_bin_size: AdaComp bin sizes; bin_sizes: {param name: bin size}.
      topk_fraction: for compression="topk".
      pull: "dense" or "recompressed".
    """

    def __init__(self, optimizer, model, worker=None, mode=None, compression="adacomp",
                 bin_size=500, conv_bin_size=50, bin_sizes=None, topk_fraction=0.001,
                 pull="dense"):
        self.optimizer = optimizer
        self.worker = worker if worker is not None else adaps.worker_from_env()
        self.mode = mode or default_mode()
        if self.mode not in ("server", "local"):
            raise ValueError("mode must be 'server' or 'local', got %r" % (self.mode,))
        self._params = []
        self._by_id = {}
        self._hooks = []
        self._sent_hyper = None
        self._synchronized = False
        self._hyper_checked = False
        bin_sizes = dict(bin_sizes or {})
        for module_name, module in model.named_modules():
            kind = layer_type(module)
            for pname, p in module.named_parameters(recurse=False):
                if not p.requires_grad or id(p) in self._by_id:
                    continue
                if p.dtype != torch.float32 or p.device.type != "cpu":
                    raise adaps._error(
                        adaps.INVALID_ARGUMENT, "adaps.torch: parameter %s is %s on %s; only "
                        "float32 CPU parameters are supported" % (pname, p.dtype, p.device))
                name = module_name + "." + pname if module_name else pname
                t = bin_sizes.pop(name, conv_bin_size if kind == "conv" else bin_size)
                entry = _Param(name, p, kind, int(t))
                self._params.append(entry)
                self._by_id[id(p)] = entry
        if bin_sizes:
            raise ValueError("bin_sizes names unknown parameters: %s" % sorted(bin_sizes))
        for e in self._params:
            comp = compression.get(e.kind, "adacomp") if isinstance(compression, dict) \
                else compression
            self._declare(e, comp, topk_fraction, pull)
        for e in self._params:
            self._register_hook(e)
        if self.mode == "server":
            self._sync_hyper()
            self._hyper_checked = True  # already sent for the first step

    # -- set-up ---------------------------------------------------------------------------
    def _declare(self, e, compression, topk_fraction, pull):
        shape = list(e.param.shape) or [1]
        if self.mode == "server":
            # The model's values in, rank 0's values out (written into the model).
            values = e.param.detach().contiguous().numpy().copy()
        else:
            values = np.zeros(shape, dtype=np.float32)
        self.worker.declare(e.name, values, shape=shape, bin_size=e.bin_size,
                            compression=compression, topk_fraction=topk_fraction, pull=pull)
        e.buf = values
        if self.mode == "server":
            with torch.no_grad():
                e.param.copy_(torch.from_numpy(values).view_as(e.param))
        else:
            e.prev = values.copy()

    def _register_hook(self, e):
        # The AccumulateGrad node of the parameter fires once p.grad holds the full
        # gradient of this backward pass (torch 1.13 has no post-accumulate hook).
        acc = e.param.expand_as(e.param).grad_fn.next_functions[0][0]

        def hook(*unused):
            self._push(e, e.param.grad)

        self._hooks.append((acc, acc.register_hook(hook)))

    def _push(self, e, grad):
        if e.handle is not None:
            raise adaps._error(
                adaps.FAILED_PRECONDITION, "adaps.torch: gradient of %s produced twice before "
                "step(); call step() after every backward pass" % e.name)
        if self.mode == "server" and not self._hyper_checked:
            # Before this worker's first push of the step: rank 0's new learning rate
            # reaches the servers before they can complete the step.
            self._sync_hyper()
            self._hyper_checked = True
        g = grad.detach()
        if not g.is_contiguous():
            g = g.contiguous()
        e.handle = self.worker.push_pull(e.name, g, e.buf)

    # -- hyper-parameters (server mode) ---------------------------------------------------
    def _hyper(self):
        group = self.optimizer.param_groups[0] if self.optimizer is not None else {}
        h = []
        if "lr" in group:
            h.append(("learning_rate", float(group["lr"])))
        if "momentum" in group:
            h.append(("momentum", float(group["momentum"])))
        if "weight_decay" in group:
            h.append(("weight_decay", float(group["weight_decay"])))
        if "betas" in group:
            h.append(("beta1", float(group["betas"][0])))
            h.append(("beta2", float(group["betas"][1])))
        if "eps" in group:
            h.append(("epsilon", float(group["eps"])))
        return h

    def _sync_hyper(self):
        h = self._hyper()
        if h != self._sent_hyper:
            if self.worker.rank == 0 and h:
                self.worker.set_hyper(h)
            self._sent_hyper = h

    # -- the training-loop API ------------------------------------------------------------
    def zero_grad(self, set_to_none=False):
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=set_to_none)
        else:
            for e in self._params:
                e.param.grad = None

    def synchronize(self):
        """Pushes what backward did not reach, waits for every pull and applies it: server
        mode writes the pulled parameters into the model, local mode sets each p.grad to
        the mean over workers (so it can be clipped before step()). step() calls it
        unless it was called since the last step."""
        for e in self._params:
            if e.handle is None:
                if e.param.grad is not None:
                    self._push(e, e.param.grad)
                else:
                    if e.zeros is None:
                        e.zeros = np.zeros(e.buf.shape, dtype=np.float32)
                    e.handle = self.worker.push_pull(e.name, e.zeros, e.buf)
        error = None
        for e in self._params:
            try:
                e.handle.wait()
            except adaps.Error as err:
                error = error or err
            finally:
                e.handle = None
        if error is not None:
            raise error
        with torch.no_grad():
            if self.mode == "server":
                for e in self._params:
                    e.param.copy_(torch.from_numpy(e.buf).view_as(e.param))
            else:
                inv = 1.0 / self.worker.num_workers
                for e in self._params:
                    mean = torch.from_numpy((e.buf - e.prev) * inv).view_as(e.param)
                    if e.param.grad is None:
                        e.param.grad = mean.clone()
                    else:
                        e.param.grad.copy_(mean)
                    e.prev, e.buf = e.buf, e.prev  # the next pull overwrites all of buf
        self._synchronized = True

    def step(self, closure=None):
        """Server mode: the parameters after the servers' step. Local mode: the torch
        optimizer's step over the averaged gradients. Raises adaps.Error when the cluster
        fails (the parameters are then left as they were)."""
        if closure is not None:
            raise ValueError("adaps.torch.DistributedOptimizer.step: closures are not "
                             "supported")
        if not self._synchronized:
            self.synchronize()
        self._synchronized = False
        self._hyper_checked = False
        if self.mode == "server":
            return None
        return self.optimizer.step()

    def traffic(self):
        """{layer type: {"dense": bytes, "wire": bytes}} over pushes and pulls so far."""
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

    def remove_hooks(self):
        for _, h in self._hooks:
            h.remove()
        self._hooks = []

    # -- the wrapped optimizer ------------------------------------------------------------
    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state):
        return self.optimizer.load_state_dict(state)

    def __getattr__(self, name):
        # Only reached for names not found normally: delegate to the torch optimizer.
        if name == "optimizer":
            raise AttributeError(name)
        return getattr(self.optimizer, name)
