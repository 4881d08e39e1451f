#!/usr/bin/python3
"""AdaComp's scale on one worker, offline: a zoo model trained with its update (the torch
optimizer's change, here plain SGD's -lr * clipped gradient) compressed under error feedback
by DESIGN.md section 1, against variants of what a selected element is sent as.

    /usr/bin/python3 bench/accuracy/scale_sim.py --variant adacomp --steps 150
    /usr/bin/python3 bench/accuracy/scale_sim.py --variant group:10   # a scale per 10 bins
    /usr/bin/python3 bench/accuracy/scale_sim.py --model mlp --no-momentum --variant adacomp
    /usr/bin/python3 bench/accuracy/scale_sim.py --variant bins --only encoder --stats 20,100

Variants (the selection is DESIGN.md's in every one; only the value sent differs):
  dense     no compression
  adacomp   sign * s, s the mean of the bins' maxima over the whole tensor (the contract,
            a tensor being one slice as on one server)
  group:K   sign * the mean of the bins' maxima over each K bins (a slice of K bins)
  bins      sign * the bin's own maximum
  exact     the residue's value itself

For the word-language-model blind check (docs/accuracy.md, "Two more blind checks"); only
recipes whose optimizer is plain SGD without momentum or weight decay are supported (wordlstm;
an SGD recipe with --no-momentum): the update is -lr * gradient.
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
    ap.add_argument("--no-momentum", action="store_true",
                    help="set an SGD recipe's momentum (and Nesterov) to 0: plain SGD")
    a = ap.parse_args()
    task = zoo_models.make_task(a.model, 0, 4, a.seed, a.steps, False)
    opt = task.optimizer
    if a.no_momentum:
        for g in opt.param_groups:
            g["momentum"], g["nesterov"] = 0, False
    if not isinstance(opt, torch.optim.SGD) or any(
            g.get("momentum", 0) or g.get("weight_decay", 0) for g in opt.param_groups):
        raise SystemExit("scale_sim: %s does not train with plain SGD" % a.model)
    names, params = zip(*task.model.named_parameters())
    stats_at = {int(x) for x in a.stats.split(",") if x}
    residues = [torch.zeros_like(p) for p in params]
    sent = total = 0
    for step in range(a.steps):
        lr = task.lr_at(step)
        x, y = task.batch(step)
        task.model.zero_grad()
        task.loss(task.model(x), y).backward()
        if task.clip:
            torch.nn.utils.clip_grad_norm_(params, task.clip)
        with torch.no_grad():
            for name, p, G in zip(names, params, residues):
                u = -lr * p.grad
                if a.variant == "dense":
                    p += u
                    continue
                variant = a.variant
                if (a.only and a.only not in name) or (a.skip and a.skip in name):
                    variant = "adacomp"
                out, k, scale, median = compress(G, u, a.bin_size, variant)
                p += out
                sent, total = sent + k, total + u.numel()
                if step + 1 in stats_at:
                    print("step %d %s: s %.5f, median bin maximum %.5f (%.2fx)"
                          % (step + 1, name, scale, median, scale / max(median, 1e-30)))
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            print("%s step %d %s %.4f%s" % (
                a.variant, step + 1, task.metric, task.evaluate(),
                "  (1 element in %.0f sent)" % (total / sent) if sent else ""), flush=True)


if __name__ == "__main__":
    main()
