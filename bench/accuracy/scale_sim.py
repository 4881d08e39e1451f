#!/usr/bin/python3
"""AdaComp's scale on one worker, offline: a zoo model trained with its update (the torch
optimizer's change, here plain SGD's -lr * clipped gradient) compressed under error feedback
by docs/algorithm.md, against variants of what a selected element is sent as.

    /usr/bin/python3 bench/accuracy/scale_sim.py --variant adacomp --steps 150
    /usr/bin/python3 bench/accuracy/scale_sim.py --variant group:10   # a scale per 10 bins
    /usr/bin/python3 bench/accuracy/scale_sim.py --model mlp --no-momentum --variant adacomp
    /usr/bin/python3 bench/accuracy/scale_sim.py --variant bins --only encoder --stats 20,100

Variants (the selection is docs/algorithm.md's in every one; only the value sent differs):
  dense     no compression
  adacomp   sign * s, s the mean of the bins' maxima over the whole tensor (the contract,
            a tensor being one slice as on one server)
  group:K   sign * the mean of the bins' maxima over each K bins (a slice of K bins)
  bins      sign * the bin's own maximum
  exact     the residue's value itself

For the word-language-model blind check (docs/accuracy.md, "Plain SGD"). With plain
SGD (wordlstm; an SGD recipe with --no-momentum) the update is -lr * gradient; with any other
optimizer it is the change the recipe's own optimizer makes on this worker's gradient (local
mode's exchange="update"), so every zoo model runs.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo_models  # noqa: E402


def compress(G, u, T, variant):
    """Adds u to the residue G; returns what is sent (dense), its count of elements, the
    scale s and the median of the bins' maxima."""
    G += u
    H = G + u
    n = G.numel()
    nb = (n + T - 1) // T
    pad = nb * T - n
    Gb = torch.cat([G.flatten(), G.new_zeros(pad)]).view(nb, T)
    Hb = torch.cat([H.flatten(), H.new_zeros(pad)]).view(nb, T)
    gmax = Gb.abs().max(dim=1).values
    sel = (gmax[:, None] > 0) & (Gb != 0) & (Hb.abs() >= gmax[:, None])
    if variant == "adacomp":
        val = torch.sign(Gb) * (gmax.sum() / nb)
    elif variant == "bins":
        val = torch.sign(Gb) * gmax[:, None]
    elif variant == "exact":
        val = Gb.clone()
    elif variant.startswith("group:"):
        K = int(variant.split(":", 1)[1])
        groups = (nb + K - 1) // K
        sums = torch.cat([gmax, gmax.new_zeros(groups * K - nb)]).view(groups, K).sum(1)
        counts = torch.tensor([min(K, nb - i * K) for i in range(groups)], dtype=G.dtype)
        val = torch.sign(Gb) * (sums / counts).repeat_interleave(K)[:nb][:, None]
    else:
        raise SystemExit("unknown variant %r" % variant)
    out = torch.where(sel, val, Gb.new_zeros(()))
    Gb -= out
    G.copy_(Gb.flatten()[:n].view_as(G))
    return out.flatten()[:n].view_as(G), int(sel.sum()), float(gmax.sum() / nb), \
        float(gmax.median())


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="wordlstm")
    ap.add_argument("--variant", default="adacomp")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--bin-size", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--only", default=None, metavar="NAME",
                    help="the variant for parameters whose name contains NAME, AdaComp "
                         "(the contract) for the others")
    ap.add_argument("--except", dest="skip", default=None, metavar="NAME",
                    help="AdaComp for parameters whose name contains NAME, the variant "
                         "for the others")
    ap.add_argument("--stats", default="", metavar="STEPS",
                    help="comma-separated steps at which to print each tensor's scale s "
                         "against the median of its bins' maxima")
    ap.add_argument("--workers", type=int, default=1,
                    help="N workers, each with its own batch (rank 0..N-1 of N), gradient "
                         "clipping, optimizer state and residue; every replica adds the mean of "
                         "what they send (local mode)")
    ap.add_argument("--no-momentum", action="store_true",
                    help="set an SGD recipe's momentum (and Nesterov) to 0: plain SGD")
    a = ap.parse_args()
    task = zoo_models.make_task(a.model, 0, max(4, a.workers), a.seed, a.steps, False)
    ranks = [task] + [zoo_models.make_task(a.model, r, max(4, a.workers), a.seed, a.steps, False)
                      for r in range(1, a.workers)]
    opt = task.optimizer
    if a.no_momentum:
        for g in opt.param_groups:
            g["momentum"], g["nesterov"] = 0, False
    # Plain SGD: the update is -lr * gradient. Any other recipe: the update is the change its
    # own optimizer makes (local mode's exchange="update": the worker's optimizer steps on its
    # own gradient and its state stays its own), taken by stepping it and restoring the
    # parameters.
    plain = isinstance(opt, torch.optim.SGD) and not any(
        g.get("momentum", 0) or g.get("weight_decay", 0) for g in opt.param_groups)
    names, params = zip(*task.model.named_parameters())
    # Each worker's own optimizer state (local mode): worker 0 has the recipe's optimizer, the
    # others a fresh one of its class, param groups and settings on the same parameters.
    opts = [opt]
    for _ in range(1, a.workers):
        groups = [dict(g) for g in opt.param_groups]  # the same tensors, each group's settings
        opts.append(type(opt)(groups, **opt.defaults))
    stats_at = {int(x) for x in a.stats.split(",") if x}
    residues = [[torch.zeros_like(p) for p in params] for _ in ranks]
    sent = total = 0
    for step in range(a.steps):
        lr = task.lr_at(step)
        sums = [torch.zeros_like(p) for p in params]
        for r, rt in enumerate(ranks):
            x, y = rt.batch(step)
            task.model.zero_grad()
            task.loss(task.model(x), y).backward()
            if task.clip:
                torch.nn.utils.clip_grad_norm_(params, task.clip)
            if plain:
                updates = [-lr * p.grad for p in params]
            else:
                for g in opts[r].param_groups:
                    g["lr"] = lr
                with torch.no_grad():
                    before = [p.detach().clone() for p in params]
                opts[r].step()
                with torch.no_grad():
                    updates = [p - b for p, b in zip(params, before)]
                    for p, b in zip(params, before):
                        p.copy_(b)
            with torch.no_grad():
                for i, (name, G, u) in enumerate(zip(names, residues[r], updates)):
                    variant = a.variant
                    if (a.only and a.only not in name) or (a.skip and a.skip in name):
                        variant = "adacomp"
                    if variant == "dense":
                        sums[i] += u
                        continue
                    out, k, scale, median = compress(G, u, a.bin_size, variant)
                    sums[i] += out
                    sent, total = sent + k, total + u.numel()
                    if r == 0 and step + 1 in stats_at:
                        print("step %d %s: s %.5f, median bin maximum %.5f (%.2fx)"
                              % (step + 1, name, scale, median, scale / max(median, 1e-30)))
        with torch.no_grad():
            for p, s_ in zip(params, sums):
                p += s_ / len(ranks)
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            print("%s step %d %s %.4f%s" % (
                a.variant, step + 1, task.metric, task.evaluate(),
                "  (1 element in %.0f sent)" % (total / sent) if sent else ""), flush=True)


if __name__ == "__main__":
    main()
