#!/usr/bin/python3
"""In-process simulation of W data-parallel workers with AdaComp (docs/algorithm.md), for
comparing what local mode exchanges (docs/accuracy.md, "The defaults, and why").

  /usr/bin/python3 bench/accuracy/exchange_sim.py --mode dense|grad|update|ef21 --L 32 [--T 500]
      [--dense-1d 1] [--warmup-dense 30] [--model lstm --opt adam --lr 5e-3 --L 48 --wd 0]
      [--opt rmsprop|adagrad|nadam|radam] [--vfix 3: adaps.torch_moments' own estimate]
      [--down 50: the update exchange's pulls recompressed at that bin, as pull="recompressed"]

Push ratios count 10 bits per sent element (an estimate; the real wire is Rice-coded)."""
import argparse, math, os, sys, time, copy
import importlib.util
import torch, torch.nn as nn, torch.nn.functional as F

# adaps.torch_moments from the source tree (it needs nothing of the built module).
_spec = importlib.util.spec_from_file_location(
    "torch_moments", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                  "worker", "python", "adaps", "torch_moments.py"))
torch_moments = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(torch_moments)

torch.set_num_threads(1)

def adacomp(G, g, T):
    """AdaComp (docs/algorithm.md) on flat tensors. Returns decompressed update; updates G."""
    G += g
    H = G + g
    N = G.numel(); nb = (N + T - 1) // T
    pad = nb * T - N
    Ga = G.abs()
    if pad:
        Gp = torch.cat([Ga, torch.zeros(pad)])
    else:
        Gp = Ga
    gmax = Gp.view(nb, T).max(1).values
    s = gmax.sum() / nb
    gm = gmax.repeat_interleave(T)[:N]
    sel = (gm > 0) & (G != 0) & (H.abs() >= gm)
    out = torch.zeros_like(G)
    out[sel] = torch.sign(G[sel]) * s
    G[sel] -= out[sel]
    return out, int(sel.sum())

LIC = ["GPL-3", "Apache-2.0", "LGPL-3", "MPL-2.0", "GFDL-1.3"]
def text_data():
    t = "\n".join(open("/usr/share/common-licenses/" + n, errors="replace").read() for n in LIC)
    itos = sorted(set(t)); stoi = {c: i for i, c in enumerate(itos)}
    d = torch.tensor([stoi[c] for c in t]); s = int(len(d) * .9)
    return d[:s], d[s:], len(itos)

class CharLSTM(nn.Module):
    def __init__(s, V, E=32, H=128):
        super().__init__(); s.embed = nn.Embedding(V, E); s.lstm = nn.LSTM(E, H, batch_first=True); s.out = nn.Linear(H, V)
    def forward(s, x):
        return s.out(s.lstm(s.embed(x))[0])

class Block(nn.Module):
    def __init__(s, d, h):
        super().__init__(); s.ln1 = nn.LayerNorm(d); s.attn = nn.MultiheadAttention(d, h, batch_first=True)
        s.ln2 = nn.LayerNorm(d); s.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
    def forward(s, x, mask):
        h = s.ln1(x); x = x + s.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + s.mlp(s.ln2(x))

class TinyGPT(nn.Module):
    def __init__(s, V, d=128, L=2, h=4, ctx=64):
        super().__init__(); s.tok = nn.Embedding(V, d); s.pos = nn.Embedding(ctx, d)
        s.blocks = nn.ModuleList([Block(d, h) for _ in range(L)]); s.ln = nn.LayerNorm(d); s.head = nn.Linear(d, V)
    def forward(s, x):
        T = x.shape[1]; mask = torch.triu(torch.full((T, T), float("-inf")), 1)
        h = s.tok(x) + s.pos(torch.arange(T))
        for b in s.blocks: h = b(h, mask)
        return s.head(s.ln(h))

def second_moment_swap(opt, W, unbiased=False):
    """Before opt.step(): make Adam's denominator the estimate of the global batch's second
    moment, (1 - 1/W) m^2 + v / W (bias-corrected), from this worker's m and v. Returns the
    function that puts the true v back after the step."""
    saved = []
    with torch.no_grad():
        for g in opt.param_groups:
            b1, b2 = g["betas"]; wd = g["weight_decay"]
            adamw = isinstance(opt, torch.optim.AdamW)
            for p in g["params"]:
                if p.grad is None: continue
                st = opt.state[p]
                if not st: continue  # first step: m^2 = v, nothing to correct
                s = float(st["step"]) + 1
                gr = p.grad if (adamw or not wd) else p.grad + wd * p
                m = st["exp_avg"] * b1 + (1 - b1) * gr
                v = st["exp_avg_sq"] * b2 + (1 - b2) * gr * gr
                bc1 = 1 - b1 ** s; bc2 = 1 - b2 ** s
                mu2 = (m / bc1) ** 2
                if unbiased:  # take m_hat's own noise out of m_hat^2
                    k = (1 - b1) / (1 + b1) * (1 + b1 ** s) / (1 - b1 ** s)
                    mu2 = ((mu2 - k * v / bc2) / (1 - k)).clamp_(min=0) if k < 0.99 else mu2
                vt = torch.minimum((1 - 1 / W) * mu2 + v / bc2 / W, v / bc2) * bc2
                saved.append((st, v))
                st["exp_avg_sq"].copy_((vt - (1 - b2) * gr * gr) / b2)
    def restore():
        for st, v in saved: st["exp_avg_sq"].copy_(v)
    return restore

def bpc(model, data, L, n=32):
    model.eval(); k = min((len(data) - 1) // L, n)
    x = data[:k * L].view(k, L); y = data[1:k * L + 1].view(k, L)
    with torch.no_grad(): l = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    model.train(); return l.item() / math.log(2)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt"); ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--W", type=int, default=4); ap.add_argument("--bs", type=int, default=16)
    ap.add_argument("--L", type=int, default=64); ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--mode", default="dense")  # dense | grad | update
    ap.add_argument("--T", type=int, default=500); ap.add_argument("--dense-small", type=int, default=0)
    ap.add_argument("--dense-1d", type=int, default=0); ap.add_argument("--warmup-dense", type=int, default=0)
    ap.add_argument("--opt", default="adamw"); ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--clip", type=float, default=1.0); ap.add_argument("--wd", type=float, default=0.01)
    ap.add_argument("--vfix", type=int, default=0)  # update exchange: global-batch second moment
    ap.add_argument("--eval-residue", type=int, default=0)
    ap.add_argument("--virtual", type=int, default=0)
    ap.add_argument("--share", type=float, default=0)  # with --virtual: the own residue's weight (overrides 1 or 1/W)
    ap.add_argument("--lrmul", type=float, default=1.0)  # update exchange: lr factor (diagnosis)
    ap.add_argument("--sched", default="cos"); ap.add_argument("--d", type=int, default=64); ap.add_argument("--warm", type=int, default=0)
    # bin_schedule="auto" of adaps.torch: bin size T_late from step T_switch on (0: T throughout)
    # the update exchange's downlink (adaps.torch pull="recompressed"): the servers' running
    # sum of the means recompressed by AdaComp at this bin size with their own residue (0:
    # exact pulls, each worker receiving the W - 1 others' pushes)
    ap.add_argument("--down", type=int, default=0)
    ap.add_argument("--T-late", type=int, default=0); ap.add_argument("--T-switch", type=int, default=100)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    tr, va, V = text_data()
    model = TinyGPT(V, d=a.d, ctx=a.L) if a.model == "gpt" else CharLSTM(V)
    params = [p for p in model.parameters()]
    names = [n for n, _ in model.named_parameters()]
    def mkopt(ps):
        if a.opt == "adamw": return torch.optim.AdamW(ps, lr=a.lr, weight_decay=a.wd)
        if a.opt == "adam": return torch.optim.Adam(ps, lr=a.lr)
        if a.opt == "rmsprop": return torch.optim.RMSprop(ps, lr=a.lr)
        if a.opt == "adagrad": return torch.optim.Adagrad(ps, lr=a.lr)
        if a.opt == "nadam": return torch.optim.NAdam(ps, lr=a.lr)
        if a.opt == "radam": return torch.optim.RAdam(ps, lr=a.lr)
        return torch.optim.SGD(ps, lr=a.lr, momentum=0.9)
    def lr_at(t):
        if a.warm and t < a.warm: f = (t + 1) / a.warm
        else: f = 1.0
        if a.sched == "cos": f *= 0.5 * (1 + math.cos(math.pi * t / a.steps))
        return a.lr * f
    W = a.W
    smoothed = [dict() for _ in range(W)]  # --vfix 3: adaps.torch_moments' per-worker state
    if a.mode == "update":
        shadows = [[p.detach().clone().requires_grad_(True) for p in params] for _ in range(W)]
        opts = [mkopt(s) for s in shadows]
    else:
        opt = mkopt(params)
    res = [[torch.zeros(p.numel()) for p in params] for _ in range(W)]
    def dense_t(i, p):
        return (a.dense_small and p.numel() < a.dense_small) or (a.dense_1d and p.dim() == 1)
    gens = [torch.Generator().manual_seed(a.seed * 1000 + r) for r in range(W)]
    sent = 0; total = 0; t0 = time.time(); hist = []; pulled = 0
    down_res = [torch.zeros(p.numel()) for p in params]  # --down: the servers' residue
    for t in range(a.steps):
        lr = lr_at(t)
        grads = []
        for r in range(W):
            st = torch.randint(0, len(tr) - a.L - 1, (a.bs,), generator=gens[r]).tolist()
            x = torch.stack([tr[s:s + a.L] for s in st]); y = torch.stack([tr[s + 1:s + a.L + 1] for s in st])
            model.zero_grad()
            vw = a.share or (1 / W if a.virtual == 2 else 1)
            if a.virtual and a.mode == "update":  # the gradient at this worker's own view
                with torch.no_grad():
                    for i, p in enumerate(params): p += res[r][i].view_as(p) * vw
            F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
            if a.virtual and a.mode == "update":
                with torch.no_grad():
                    for i, p in enumerate(params): p -= res[r][i].view_as(p) * vw
            grads.append([p.grad.detach().clone() for p in params])
        warm = t < a.warmup_dense
        if a.mode == "ef21":
            if t == 0:
                prevg = [[torch.zeros(p.numel()) for p in params] for _ in range(W)]
                Hs = [torch.zeros(p.numel()) for p in params]
            for i, p in enumerate(params):
                acc = torch.zeros(p.numel())
                for r in range(W):
                    g = grads[r][i].flatten()
                    dlt = g - prevg[r][i]; prevg[r][i] = g
                    d, k = adacomp(res[r][i], dlt, a.T); acc += d; sent += k * 10 + 32
                    total += g.numel() * 32
                Hs[i] += acc / W
                p.grad = Hs[i].view_as(p).clone()
            if a.clip: torch.nn.utils.clip_grad_norm_(params, a.clip)
            for gr in opt.param_groups: gr["lr"] = lr
            opt.step()
        elif a.mode in ("dense", "grad"):
            means = []
            for i, p in enumerate(params):
                acc = torch.zeros(p.numel())
                for r in range(W):
                    g = grads[r][i].flatten()
                    if a.mode == "dense" or warm or dense_t(i, p):
                        d = res[r][i] + g; res[r][i].zero_(); acc += d; sent += g.numel() * 32
                    else:
                        d, k = adacomp(res[r][i], g, a.T); acc += d; sent += k * 10 + 32
                    total += g.numel() * 32
                means.append((acc / W).view_as(p))
            for p, m in zip(params, means): p.grad = m.clone()
            if a.clip: torch.nn.utils.clip_grad_norm_(params, a.clip)
            for gr in opt.param_groups: gr["lr"] = lr
            opt.step()
        else:
            ups = []
            for r in range(W):
                sh = shadows[r]
                with torch.no_grad():
                    for s, p in zip(sh, params): s.copy_(p)
                for s, g in zip(sh, grads[r]): s.grad = g
                if a.clip: torch.nn.utils.clip_grad_norm_(sh, a.clip)
                for gr in opts[r].param_groups: gr["lr"] = lr * a.lrmul
                if a.vfix == 3:  # adaps.torch_moments itself (any optimizer it knows)
                    restore = torch_moments.global_second_moment(opts[r], W, smoothed[r])
                else:
                    restore = second_moment_swap(opts[r], W, a.vfix == 2) if a.vfix else None
                opts[r].step()
                if restore: restore()
                ups.append([(s.detach() - p.detach()).flatten() for s, p in zip(sh, params)])
            with torch.no_grad():
                for i, p in enumerate(params):
                    acc = torch.zeros(p.numel())
                    for r in range(W):
                        u = ups[r][i]
                        if warm or dense_t(i, p):
                            d = res[r][i] + u; res[r][i].zero_(); acc += d; sent += u.numel() * 32
                        else:
                            T = a.T_late if a.T_late and t >= a.T_switch else a.T
                            d, k = adacomp(res[r][i], u, T); acc += d; sent += k * 10 + 32
                        total += u.numel() * 32
                    if a.down:
                        dd, kd = adacomp(down_res[i], acc / W, a.down); pulled += kd * 10 + 32
                        p += dd.view_as(p)
                    else:
                        p += (acc / W).view_as(p)
        if (t + 1) % 100 == 0 or t + 1 == a.steps:
            b = bpc(model, va, a.L); hist.append(b)
            if a.mode == "update" and a.eval_residue:  # diagnosis: the mass still held back
                with torch.no_grad():
                    keep = [p.detach().clone() for p in params]
                    for i, p in enumerate(params):
                        p += (sum(res[r][i] for r in range(W)) / W).view_as(p)
                    print("  with the residues delivered: bpc %.3f" % bpc(model, va, a.L))
                    for i, (p, k) in enumerate(zip(params, keep)): p.copy_(k + res[0][i].view_as(p))
                    print("  worker 0's view (replica + its residue): bpc %.3f" % bpc(model, va, a.L))
                    for p, k in zip(params, keep): p.copy_(k)
            print("step %d bpc %.3f ratio %.0fx (%.0fs)" % (t + 1, b, total / max(sent, 1), time.time() - t0), flush=True)
    # Total (push + pull) against dense: an exact pull brings each worker the W - 1 others'
    # pushes; a recompressed one (--down) is one message, the same for every worker.
    pull = pulled if a.down else sent * (W - 1) / W
    print("FINAL", a.model, a.mode, "T", a.T, "down", a.down, "bpc %.4f" % hist[-1],
          "push ratio %.1f" % (total / max(sent, 1)),
          "total %.1f" % (2 * total / max(sent + W * pull, 1)), " ".join("%.3f" % h for h in hist))

main()
