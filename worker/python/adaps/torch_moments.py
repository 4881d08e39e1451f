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

Applies to torch.optim.Adam and torch.optim.AdamW exactly (not subclasses, whose step may
differ), per param group, except groups with amsgrad (torch's own step is kept there).
The first step needs nothing (m_hat^2 = v_hat). Memory: one copy of v during the step.
"""
import torch

_ADAMS = (torch.optim.Adam, torch.optim.AdamW)


def supports(optimizer):
    """True when global_second_moment() changes something for this optimizer."""
    return type(optimizer) in _ADAMS and \
        any(not g.get("amsgrad", False) for g in optimizer.param_groups)


def _effective_grad(optimizer, group, p):
    # The gradient torch's Adam feeds its moments (torch 1.13: maximize negates it; Adam's
    # weight decay adds wd * p, AdamW's decays the parameter instead).
    g = -p.grad if group.get("maximize", False) else p.grad
    if type(optimizer) is torch.optim.Adam and group["weight_decay"]:
        g = g.add(p, alpha=group["weight_decay"])
    return g


def global_second_moment(optimizer, num_workers, smoothed=None, exclude=()):
    """Call just before optimizer.step(); returns the function to call just after it (it puts
    torch's own second moment back). Does nothing (returns a no-op) for one worker, another
    optimizer, or groups with amsgrad. `smoothed`: a dict this function keeps per parameter
    (the caller holds it from step to step): mu^2 is then averaged over v's window instead of
    taken from this step's m_hat alone. `exclude`: ids of parameters left to torch's own step
    (their gradient is the global batch's already)."""
    saved = []
    if num_workers > 1 and supports(optimizer):
        w = float(num_workers)
        with torch.no_grad():
            for group in optimizer.param_groups:
                if group.get("amsgrad", False):
                    continue
                b1, b2 = group["betas"]
                for p in group["params"]:
                    if p.grad is None or p.grad.is_sparse or id(p) in exclude:
                        continue
                    state = optimizer.state.get(p)
                    if not state or "exp_avg_sq" not in state:
                        continue  # its first step: m_hat^2 = v_hat, nothing to change
                    step = float(state["step"]) + 1.0
                    g = _effective_grad(optimizer, group, p).to(state["exp_avg"].dtype)
                    m = state["exp_avg"].mul(b1).add_(g, alpha=1.0 - b1)
                    v = state["exp_avg_sq"].mul(b2).addcmul_(g, g, value=1.0 - b2)
                    bc1 = 1.0 - b1 ** step
                    bc2 = 1.0 - b2 ** step
                    k = (1.0 - b1) / (1.0 + b1) * (1.0 + b1 ** step) / bc1
                    mu2 = m.div_(bc1).square_()
                    if k < 0.99:  # (the first steps: m_hat is mostly noise, keep m_hat^2)
                        mu2.sub_(v, alpha=k / bc2).div_(1.0 - k)
                    if smoothed is not None:
                        entry = smoothed.get(p)
                        if entry is None:
                            entry = smoothed[p] = [torch.zeros_like(mu2), 0]
                        entry[0].mul_(b2).add_(mu2, alpha=1.0 - b2)
                        entry[1] += 1
                        mu2.copy_(entry[0]).div_(1.0 - b2 ** entry[1])
                    mu2.clamp_(min=0.0)
                    # bc2 * v_global: the raw value torch's step should compute.
                    want = mu2.mul_((1.0 - 1.0 / w) * bc2).add_(v, alpha=1.0 / w)
                    torch.minimum(want, v, out=want)
                    # exp_avg_sq such that beta2 * it + (1 - beta2) g^2 == want.
                    state["exp_avg_sq"].copy_(want.addcmul_(g, g, value=-(1.0 - b2)).div_(b2))
                    saved.append((state["exp_avg_sq"], v))

    def restore():
        with torch.no_grad():
            for sq, v in saved:
                sq.copy_(v)
    return restore
