"""adaps.torch_moments: Adam's second moment of the global batch, estimated on each worker.

With exchange="update" every worker runs its own torch.optim.Adam/AdamW on its own gradient,
from a batch W times smaller than the step's global batch (W workers). Adam's second moment
v estimates E[g^2] = mu^2 + s^2 per element (mu the true gradient, s^2 the variance of a
worker's batch gradient); the global batch's gradient has mu^2 + s^2 / W. Where the noise
dominates, a worker's v is up to W times too large and its steps up to sqrt(W) times too
short: a small transformer with AdamW trained to 3.19 bits/char this way against 2.91 for
DDP's arithmetic, with nothing compressed (docs/accuracy.md).

Adam's first moment m averages the gradient over about (1 + beta1) / (1 - beta1) steps: at
step t its bias-corrected m_hat has variance k s^2 with
k = (1 - beta1)/(1 + beta1) * (1 + beta1^t)/(1 - beta1^t) (1 at the first step, 0.053 later),
so E[m_hat^2] = mu^2 + k s^2 and E[v_hat] = mu^2 + s^2 give

    mu2      = max(0, (m_hat^2 - k v_hat) / (1 - k))
    v_global = (1 - 1/W) * mu2 + v_hat / W          (capped at v_hat)

which estimates mu^2 + s^2 / W. It uses only what this worker has: no extra bytes. (Leaving
m_hat's own noise in, mu2 = m_hat^2, errs towards the shorter step: on the transformer of
docs/accuracy.md 3.084 against 3.067 bits/char, and 8% more push bytes.)

With `smoothed` (adaps.torch's default) the estimate (m_hat^2 - k v_hat) / (1 - k) is averaged
over v's own window (an exponential average with beta2, bias-corrected) before the clamp:
mu^2 and s^2 then come from the same steps, and the estimate no longer grows exactly when
m_hat does. This step's estimate is largest on the steps where m_hat, so the step, is
largest, and shortens precisely those; on the zoo the average took the char-LSTM from +1.7%
to below dense and the transformer from +3.4% to +0.8%, with the first bin schedule
(docs/accuracy.md). Memory: one tensor of each parameter's size, kept by the caller.
global_second_moment() makes the torch optimizer's step use it and keeps torch's own v in its
state (state_dict() is torch's, unchanged in format and meaning): before the step it writes
into exp_avg_sq the value that torch's update v = beta2 * v + (1 - beta2) g^2 turns into
v_global, after the step it puts back the true v.

Applies to torch.optim.Adam, AdamW, NAdam and RAdam exactly (not subclasses, whose step may
differ), per param group, except groups with amsgrad (torch's own step is kept there).
The first step needs nothing (m_hat^2 = v_hat). Memory: one copy of v during the step.

The same holds for every optimizer that divides by the root of a running sum of g^2, and
without it each worker's step is too short by the same factor: on the char-LSTM of
docs/accuracy.md, the update exchange sent dense was +6.8% (RMSprop) and +5.8% (Adagrad, at
step 200) against DDP's arithmetic. Two more have their own estimate here:
- torch.optim.RMSprop (not centered: its grad_avg takes the mean out already, and its step
  is kept): square_avg is v without bias correction (v = alpha v + (1 - alpha) g^2 from 0),
  so v_hat = v / (1 - alpha^t); RMSprop keeps no first moment, so adaps keeps one (an
  exponential average of g with beta1 = 0.9, bias-corrected) for the estimate of mu^2,
  averaged over v's window (alpha). Memory: two tensors of each parameter's size.
- torch.optim.Adagrad: sum adds g^2 every step and forgets nothing; DDP's sum adds the global
  batch's G^2, whose expectation is mu^2 + s^2 / W. adaps keeps that sum (it starts at torch's
  and adds (1 - 1/W) mu2 + g^2 / W a step, capped at torch's sum), with mu2 from its own
  averages of g (beta1 = 0.9) and g^2 (beta2 = 0.999), averaged over beta2's window. Memory:
  four tensors of each parameter's size.
These need `smoothed` (the caller's dict, kept from step to step): without it they take
torch's own step. Complex parameters take torch's own step with every optimizer.

With `smoothed` and `agreement`, each entry also keeps `corr`, each element's estimate of how much two
workers' updates agree: the first moment is the true mean mu plus its own noise of variance
k s^2 (s^2 = v_hat - mu^2), mu the same on every worker and the noise each worker's own, so
two workers' updates correlate by c = mu^2 / (mu^2 + k s^2). adaps.torch's
own_updates="estimate" holds (1 + (W - 1) c) / W of a worker's own residue in its model: the
others' residues estimated by its own as far as c says they agree (docs/accuracy.md, "Each
worker's share of its own residue, estimated"). One more tensor of each parameter's size.
"""
import torch

_ADAMS = (torch.optim.Adam, torch.optim.AdamW)
# Optimizers with Adam's moments (exp_avg, exp_avg_sq, betas, bias-corrected v).
_ADAM_LIKE = _ADAMS + (torch.optim.NAdam, torch.optim.RAdam)
# Their own first moment of g (RMSprop, Adagrad keep none): its beta, as Adam's default.
_OWN_BETA1 = 0.9
_ADAGRAD_BETA2 = 0.999


def _group_applies(optimizer, group):
    if group.get("amsgrad", False):
        return False
    if type(optimizer) is torch.optim.RMSprop:
        return not group.get("centered", False)
    return True


def changes_step(optimizer):
    """True when global_second_moment() changes something for this optimizer (with a
    `smoothed` dict): Adam, AdamW, NAdam, RAdam, RMSprop (not centered) and Adagrad, exactly
    (not subclasses), with a group it applies to. adaps.torch's defaults for optimizers that
    divide by a second moment (own_updates, bin_schedule) follow it too."""
    return type(optimizer) in _ADAM_LIKE + (torch.optim.RMSprop, torch.optim.Adagrad) and \
        any(_group_applies(optimizer, g) for g in optimizer.param_groups)


def _effective_grad(optimizer, group, p):
    # The gradient torch's optimizer feeds its moments (torch 1.13: maximize negates it;
    # weight decay adds wd * p, but for AdamW, which decays the parameter instead).
    g = -p.grad if group.get("maximize", False) else p.grad
    if type(optimizer) is not torch.optim.AdamW and group.get("weight_decay", 0):
        g = g.add(p, alpha=group["weight_decay"])
    return g


def _noise_factor(b1, t):
    """k: the variance of bias-corrected m_hat (an average of g with beta1 after t steps)
    relative to one gradient's."""
    return (1.0 - b1) / (1.0 + b1) * (1.0 + b1 ** t) / (1.0 - b1 ** t)


def _mu_squared(m_hat, v, v_div, b1, t):
    """This step's estimate of the true gradient's square from bias-corrected m_hat (an
    average of g with beta1 after t steps; squared in place) and v / v_div (the bias-corrected
    average of g^2): m_hat^2 less its own noise."""
    k = _noise_factor(b1, t)
    mu2 = m_hat.square_()
    if k < 0.99:  # (the first steps: m_hat is mostly noise, keep m_hat^2)
        mu2.sub_(v, alpha=k / v_div).div_(1.0 - k)
    return mu2


class _Window:
    """mu^2 averaged over the second moment's window (a `smoothed` entry)."""

    def __init__(self, like):
        self.mu2 = torch.zeros_like(like)
        self.n = 0
        self.corr = None  # the updates' correlation across workers, estimated (_keep_corr)

    def average(self, mu2, b2):
        """Adds this step's mu2; returns the bias-corrected average (a new tensor)."""
        self.mu2.mul_(b2).add_(mu2, alpha=1.0 - b2)
        self.n += 1
        return self.mu2.div(1.0 - b2 ** self.n)


class _Own(_Window):
    """What adaps keeps for an optimizer without a first moment of g (RMSprop, Adagrad)."""

    def __init__(self, like):
        super().__init__(like)
        self.t = 0
        self.m = torch.zeros_like(like)
        self.q = None  # Adagrad: an average of g^2
        self.total = None  # Adagrad: the global batch's sum of G^2, estimated


def _keep_corr(entry, mu2, v_hat, b1, t):
    """Keeps in entry.corr each element's estimate of how much of one worker's update the
    others' share: its first moment is mu plus noise of variance k s^2 (s^2 = v_hat - mu^2),
    the same mu on every worker, so two workers' updates correlate by
    mu^2 / (mu^2 + k s^2)."""
    noise = (v_hat - mu2).clamp_(min=0.0).mul_(_noise_factor(b1, t))
    entry.corr = mu2.div(noise.add_(mu2)).nan_to_num_(0.0).clamp_(0.0, 1.0)


def _advance_first_moment(entry, g):
    entry.t += 1
    entry.m.mul_(_OWN_BETA1).add_(g, alpha=1.0 - _OWN_BETA1)


def _own_estimate(entry, g, v, v_div, b2, agreement):
    """Advances entry's first moment with g; returns mu^2 averaged over b2's window (v / v_div:
    the bias-corrected second moment this step)."""
    _advance_first_moment(entry, g)
    m_hat = entry.m / (1.0 - _OWN_BETA1 ** entry.t)
    mu2 = _mu_squared(m_hat, v, v_div, _OWN_BETA1, entry.t)
    mu2 = entry.average(mu2, b2).clamp_(min=0.0)
    if agreement:
        _keep_corr(entry, mu2, v / v_div, _OWN_BETA1, entry.t)
    return mu2


def _rmsprop(optimizer, group, p, entry, w, saved, agreement):
    g = _effective_grad(optimizer, group, p).to(entry.m.dtype)
    state = optimizer.state.get(p)
    alpha = group["alpha"]
    if not state or "square_avg" not in state:
        _advance_first_moment(entry, g)  # its first step: v_hat = g^2 = m_hat^2, no change
        return
    v = state["square_avg"].mul(alpha).addcmul_(g, g, value=1.0 - alpha)
    bc2 = 1.0 - alpha ** (float(state["step"]) + 1.0)
    mu2 = _own_estimate(entry, g, v, bc2, alpha, agreement)
    # bc2 * v_global: the raw value torch's step should divide by the root of.
    want = mu2.mul_((1.0 - 1.0 / w) * bc2).add_(v, alpha=1.0 / w)
    torch.minimum(want, v, out=want)
    state["square_avg"].copy_(want.addcmul_(g, g, value=-(1.0 - alpha)).div_(alpha))
    saved.append((state["square_avg"], v))


def _adagrad(optimizer, group, p, entry, w, saved, agreement):
    state = optimizer.state.get(p)
    if not state or "sum" not in state:
        return
    g = _effective_grad(optimizer, group, p).to(entry.m.dtype)
    b2 = _ADAGRAD_BETA2
    if entry.q is None:
        entry.q = torch.zeros_like(entry.m)
        entry.total = state["sum"].clone()  # from torch's (initial_accumulator_value)
    entry.q.mul_(b2).addcmul_(g, g, value=1.0 - b2)
    mu2 = _own_estimate(entry, g, entry.q, 1.0 - b2 ** (entry.t + 1), b2, agreement)
    true_sum = state["sum"].addcmul(g, g)
    total = entry.total.add_(mu2.mul_(1.0 - 1.0 / w).addcmul_(g, g, value=1.0 / w))
    torch.minimum(total, true_sum, out=total)
    state["sum"].copy_(total).addcmul_(g, g, value=-1.0)
    saved.append((state["sum"], true_sum))


def _adam(optimizer, group, p, smoothed, w, saved, agreement):
    state = optimizer.state.get(p)
    if not state or "exp_avg_sq" not in state:
        return  # its first step: m_hat^2 = v_hat, nothing to change
    b1, b2 = group["betas"]
    step = float(state["step"]) + 1.0
    g = _effective_grad(optimizer, group, p).to(state["exp_avg"].dtype)
    m = state["exp_avg"].mul(b1).add_(g, alpha=1.0 - b1)
    v = state["exp_avg_sq"].mul(b2).addcmul_(g, g, value=1.0 - b2)
    bc2 = 1.0 - b2 ** step
    mu2 = _mu_squared(m.div_(1.0 - b1 ** step), v, bc2, b1, step)
    if smoothed is not None:
        entry = smoothed.get(p)
        if entry is None:
            entry = smoothed[p] = _Window(mu2)
        mu2 = entry.average(mu2, b2)
    mu2.clamp_(min=0.0)
    if smoothed is not None and agreement:
        _keep_corr(entry, mu2, v / bc2, b1, step)
    # bc2 * v_global: the raw value torch's step should compute.
    want = mu2.mul_((1.0 - 1.0 / w) * bc2).add_(v, alpha=1.0 / w)
    torch.minimum(want, v, out=want)
    # exp_avg_sq such that beta2 * it + (1 - beta2) g^2 == want.
    state["exp_avg_sq"].copy_(want.addcmul_(g, g, value=-(1.0 - b2)).div_(b2))
    saved.append((state["exp_avg_sq"], v))


def global_second_moment(optimizer, num_workers, smoothed=None, exclude=(), agreement=False):
    """Call just before optimizer.step(); returns the function to call just after it (it puts
    torch's own second moment back). Does nothing (returns a no-op) for one worker, another
    optimizer, or groups with amsgrad (or RMSprop's centered). `smoothed`: a dict this
    function keeps per parameter (the caller holds it from step to step): mu^2 is then
    averaged over v's window instead of taken from this step's m_hat alone; RMSprop and
    Adagrad need it (it holds their first moment) and take torch's own step without it.
    `exclude`: ids of parameters left to torch's own step (their gradient is the global
    batch's already). `agreement` (with `smoothed`): each entry keeps `corr`, the workers'
    estimated agreement (own_updates="estimate")."""
    saved = []
    kind = type(optimizer)
    own = kind in (torch.optim.RMSprop, torch.optim.Adagrad)
    if num_workers > 1 and changes_step(optimizer) and (smoothed is not None or not own):
        w = float(num_workers)
        with torch.no_grad():
            for group in optimizer.param_groups:
                if not _group_applies(optimizer, group):
                    continue
                for p in group["params"]:
                    if p.grad is None or p.grad.is_sparse or p.is_complex() or \
                            id(p) in exclude:
                        continue
                    if not own:
                        _adam(optimizer, group, p, smoothed, w, saved, agreement)
                        continue
                    entry = smoothed.get(p)
                    if entry is None:
                        entry = smoothed[p] = _Own(p)
                    if kind is torch.optim.RMSprop:
                        _rmsprop(optimizer, group, p, entry, w, saved, agreement)
                    else:
                        _adagrad(optimizer, group, p, entry, w, saved, agreement)

    def restore():
        with torch.no_grad():
            for sq, v in saved:
                sq.copy_(v)
    return restore
