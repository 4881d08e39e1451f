#!/usr/bin/python3
"""Results of the race (bench/vs_torch.sh): merge a run's byte counts into its JSON, print
the tables, draw the plots.

  summarize.py merge --json F --log F [--server-before "rx tx" --server-after "rx tx"]
  summarize.py table --results DIR [--target ACC]
  summarize.py plot --results DIR --plots DIR [--target ACC]
  summarize.py compact --results DIR [--target ACC]   one table per model and worker count

Bytes per step per worker = (received + sent on the worker host's eth0, /proc/net/dev of
its namespace, over the training loop) / steps, averaged over the workers; it counts every
byte on the link (TCP/IP headers, the eval barriers), not only the payload. Bits per
parameter per step = 8 x those bytes / the model's parameters (dense DDP's ring allreduce:
about 2 x 32 x (W-1)/W, sent and received). The metric is test accuracy (mlp, cnn: higher
is better) or held-out bits per character (gpt: lower is better); a target is reached at
the first evaluation at or past it.
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys

SYSTEMS = ("ddp", "powersgd", "fp16", "adaps", "adacomp", "adacomp-colo")
NAMES = {"ddp": "DDP (gloo allreduce)", "powersgd": "DDP + PowerSGD rank 4",
         "fp16": "DDP + fp16 hook", "adaps": "adaps dense/dense",
         "adacomp": "adaps AdaComp/recompressed",
         "adacomp-colo": "adaps AdaComp/recompressed, a server beside each worker"}
ADACOMP = ("adacomp", "adacomp-colo")


def split_system(system):
    """(the system exchanging every step, H): vs_torch.sh --local-steps H names an AdaComp
    system run with local steps adacomp-hH or adacomp-colo-hH; any other has H = 1."""
    m = re.fullmatch(r"(adacomp(?:-colo)?)-h(\d+)", system)
    return (m.group(1), int(m.group(2))) if m else (system, 1)


def local_steps(system):
    return split_system(system)[1]


def name(system):
    base, h = split_system(system)
    return NAMES[base] + (", exchange every %d steps" % h if h > 1 else "")


def systems_in(found):
    """The systems among `found`, in the table's order: the fixed ones, then each AdaComp
    system with local steps after its own."""
    out = []
    for s in SYSTEMS:
        if s in found:
            out.append(s)
        out += sorted((f for f in found if f != s and split_system(f)[0] == s),
                      key=local_steps)
    return out
# gpt: the held-out bits/char dense DDP reaches at about two thirds of its 300 steps (seed
# 1, step 200 of 300: 3.234 at 4 workers, 2.930 at 16), by worker count.
TARGETS = {"mlp": 0.80, "cnn": 0.82, "gpt": {4: 3.25, 16: 2.95}}


def target_for(model, world, given=None):
    """--target if given, else the model's (at `world` workers, or the nearest count's)."""
    if given:
        return given
    t = TARGETS[model]
    if isinstance(t, dict):
        return t[min(t, key=lambda w: abs(w - world))]
    return t
RATES = ("1mbit", "10mbit", "100mbit", "1gbit", "none")


def merge(a):
    with open(a.json) as f:
        res = json.load(f)
    ranks = {}
    with open(a.log) as f:
        for m in re.finditer(r"RACE_BYTES rank (\d+) steps (\d+) rx (\d+) tx (\d+)", f.read()):
            ranks[int(m.group(1))] = dict(steps=int(m.group(2)), rx=int(m.group(3)),
                                          tx=int(m.group(4)))
    res["worker_bytes"] = ranks
    if ranks:
        res["bytes_per_step_worker"] = statistics.mean(
            (r["rx"] + r["tx"]) / r["steps"] for r in ranks.values())
        res["tx_per_step_worker"] = statistics.mean(r["tx"] / r["steps"] for r in ranks.values())
    if a.server_before and a.server_after:
        b, e = [int(v) for v in a.server_before.split()], [int(v) for v in a.server_after.split()]
        res["server_host_bytes_per_step"] = (e[0] - b[0] + e[1] - b[1]) / res["steps"]
    res["load"] = a.load
    with open(a.json, "w") as f:
        json.dump(res, f)
    print(one_line(res, target_for(res["model"], res.get("world", 4))), file=sys.stderr)


def reached(res, metric, target):
    return metric >= target if res.get("higher_is_better", True) else metric <= target


def reach(res, target):
    return next((t for _, t, m in res["evals"] if reached(res, m, target)), None)


def truncated(res):
    return 0 < res.get("max_steps", 0) and res["steps"] < res.get("total_steps", res["steps"])


def extrapolated(res, target, others):
    """A run stopped after its first steps (--max-steps): its median step times the steps the
    same system and model took to the target in a whole run at another rate (the same seed's
    if there is one). None where no whole run reached it."""
    whole = [o for o in others if not truncated(o) and reach_step(o, target) is not None]
    if not whole:
        return None
    same = [o for o in whole if o["seed"] == res["seed"]] or whole
    return res["step_ms_median"] / 1e3 * statistics.mean(reach_step(o, target) for o in same)


def reach_step(res, target):
    return next((s for s, _, m in res["evals"] if reached(res, m, target)), None)


def one_line(res, target):
    t = reach(res, target)
    if not res["evals"]:
        return "  %s: step %.1f ms (median), no evaluation" % (res["system"], res["step_ms_median"])
    return ("  %s: step %.1f ms (median), %.1f KB/step/worker, final %.4f, time to %.2f: "
            "%s, train time %.1f s" % (res["system"], res["step_ms_median"],
                                       res.get("bytes_per_step_worker", 0) / 1e3,
                                       res["evals"][-1][2], target,
                                       "%.1f s" % t if t is not None else "not reached",
                                       res["train_time"]))


def load(results):
    runs = []
    for p in sorted(glob.glob(os.path.join(results, "*.json"))):
        with open(p) as f:
            runs.append(json.load(f))
    return runs


def grouped(runs):
    out = {}
    for r in runs:
        key = (r["model"], r.get("world", 4), r["label"])
        out.setdefault(key, {}).setdefault(r["system"], []).append(r)
    return out


def mean(values):
    values = [v for v in values if v is not None]
    return statistics.mean(values) if values else None


def fmt(v, f):
    return f % v if v is not None else "—"


def time_to(rs, runs, target):
    """The mean time to `target` of one system's runs at one rate (a run stopped early is
    extrapolated from the same system's whole runs at other rates); None where a run did not
    reach it."""
    rt = []
    for r in rs:
        if truncated(r):
            others = [o for o in runs if o["model"] == r["model"] and o["system"] == r["system"]
                      and o.get("world", 4) == r.get("world", 4) and o["label"] != r["label"]]
            rt.append(extrapolated(r, target, others))
        else:
            rt.append(reach(r, target))
    return mean(rt) if rt and all(t is not None for t in rt) else None


def rate_name(rate):
    return "no limit" if rate == "none" else rate.replace("mbit", " Mbit/s").replace(
        "gbit", " Gbit/s")


def compact(a):
    """One table per model and worker count, a row per system: the time to the target at
    each rate (mean over the seeds), the bytes on a worker's link a step at the slowest rate,
    and the final metric of the no-limit runs; then each AdaComp system's ratios."""
    runs = load(a.results)
    groups = grouped(runs)
    for model, world in sorted({(m, w) for m, w, _ in groups}, key=lambda k: (k[0] != "mlp",
                                                                              k[0], k[1])):
        rates = sorted({r for m, w, r in groups if (m, w) == (model, world)},
                       key=lambda r: -RATES.index(r) if r in RATES else 9)
        target = target_for(model, world, a.target)
        found = {s for m, w, r in groups if (m, w) == (model, world) for s in groups[(m, w, r)]}
        any_run = next(iter(groups[(model, world, rates[0])].values()))[0]
        seeds = sorted({r["seed"] for (m, w, _), g in groups.items() if (m, w) == (model, world)
                        for rs in g.values() for r in rs})
        slow = rates[-1]
        print("\n| %s, %d workers (target %.2f; seeds %s) | %s | KB a step a worker (%s) | "
              "bits/param/step | final %s |" % (
                  model.upper(), world, target, ",".join(map(str, seeds)),
                  " | ".join(map(rate_name, rates)), rate_name(slow),
                  any_run.get("metric", "test accuracy")))
        print("|---|" + "---:|" * (len(rates) + 3))
        times = {}
        for s in systems_in(found):
            cells = []
            for r in rates:
                rs = groups.get((model, world, r), {}).get(s, [])
                t = time_to(rs, runs, target) if rs else None
                times[(s, r)] = t
                cut = any(truncated(x) for x in rs)
                cells.append("—" if not rs else "not reached" if t is None
                             else ("~" if cut else "") + "%.1f s" % t)
            rs = groups.get((model, world, slow), {}).get(s, [])
            kb = mean([x.get("bytes_per_step_worker") for x in rs])
            whole = [x for r in rates for x in groups.get((model, world, r), {}).get(s, [])
                     if not truncated(x) and x["evals"]]
            final = mean([x["evals"][-1][2] for x in whole if x["label"] == "none"] or
                         [x["evals"][-1][2] for x in whole])
            print("| %s | %s | %s | %s | %s |" % (
                name(s), " | ".join(cells), fmt(kb / 1e3 if kb else None, "%.1f"),
                fmt(8 * kb / any_run["params"] if kb else None, "%.3g"),
                fmt(final, "%.4f")))
        print()
        for s in systems_in(found):
            if not s.startswith(ADACOMP):
                continue
            parts = []
            for r in rates:
                mine = times.get((s, r))
                if r == "none" or not mine:
                    continue
                vs = ["%.0fx DDP" % (times[("ddp", r)] / mine) if times.get(("ddp", r)) else None,
                      "%.1fx PowerSGD" % (times[("powersgd", r)] / mine)
                      if times.get(("powersgd", r)) else
                      "PowerSGD never" if ("powersgd", r) in times else None,
                      "%.2fx its no-limit time" % (mine / times[(s, "none")])
                      if times.get((s, "none")) else None]
                every = split_system(s)[0]
                if every != s and times.get((every, r)):
                    vs.append("%.1fx exchanging every step" % (times[(every, r)] / mine))
                parts.append("%s: %s" % (rate_name(r), ", ".join(v for v in vs if v)))
            if parts:
                print("- %s: %s" % (name(s), "; ".join(parts)))


def table(a):
    runs = load(a.results)
    groups = grouped(runs)
    none = {(m, w): g for (m, w, rate), g in groups.items() if rate == "none"}
    notes = []
    for (model, world, rate) in sorted(groups, key=lambda k: (k[0] != "mlp", k[0], k[1],
                                                              RATES.index(k[2])
                                                              if k[2] in RATES else 9)):
        g = groups[(model, world, rate)]
        target = target_for(model, world, a.target)
        any_run = next(iter(g.values()))[0]
        higher = any_run.get("higher_is_better", True)
        metric = any_run.get("metric", "test accuracy")
        print("\n### %s, %d workers, links %s (%d params, %d steps of %d per worker, seeds %s)\n"
              % (model.upper(), world, rate, any_run["params"], any_run["total_steps"],
                 any_run["batch_size"],
                 ",".join(sorted({str(r["seed"]) for rs in g.values() for r in rs}))))
        print("| system | step ms | no-limit step ms | compute share | KB/step/worker "
              "(sent+received) | bits/param/step | time to %.2f | no-limit time to %.2f | "
              "steps to %.2f | final %s | load at the end |" % (target, target, target, metric))
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        reaches = {}
        for s in systems_in(g):
            rs = g[s]
            # With local steps the median is a step without an exchange: the mean instead.
            key = "step_ms_median" if local_steps(s) == 1 else "step_ms_mean"
            step = mean([r[key] for r in rs])
            base = none.get((model, world), {}).get(s)
            base_step = mean([r[key] for r in base]) if base else None
            base_reach = [reach(r, target) for r in base] if base else []
            base_reach = mean(base_reach) if base_reach and None not in base_reach else None
            share = mean([100 * r["compute_share"] for r in rs if r.get("compute_share")])
            cut = [r for r in rs if truncated(r)]
            reaches[s] = time_to(rs, runs, target)
            kb = mean([r.get("bytes_per_step_worker") for r in rs])
            bits = mean([8 * r["bytes_per_step_worker"] / r["params"] for r in rs
                         if r.get("bytes_per_step_worker")])
            kb = kb / 1e3 if kb is not None else None
            st = [reach_step(r, target) for r in rs]
            st = mean(st) if all(v is not None for v in st) else None
            if cut:
                notes.append("%s at %s: stopped after %d of %d steps; its time to %.2f is its "
                             "median step times the steps the same system took to it at "
                             "another rate (an extrapolation, marked ~)"
                             % (name(s), rate, cut[0]["steps"], cut[0]["total_steps"], target))
            print("| %s | %.1f | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                name(s) + (" (mean step)" if local_steps(s) > 1 else ""), step,
                fmt(base_step, "%.1f"), fmt(share, "%.0f%%"),
                fmt(kb, "%.1f"), fmt(bits, "%.3g"),
                ("~" if cut else "") + fmt(reaches[s], "%.1f s") if reaches[s] is not None
                else "not reached", fmt(base_reach, "%.1f s"),
                fmt(st, "%.0f") if st is not None and not cut else "—",
                "—" if cut else "%.4f" % mean([r["evals"][-1][2] for r in rs]),
                "; ".join(r.get("load", "?") for r in rs)))
        for mine in [s for s in systems_in(g) if s.startswith(ADACOMP)]:
            ac = reaches.get(mine)
            rivals = ["ddp", "powersgd", "fp16", "adaps"]
            if local_steps(mine) > 1:  # against the same system exchanging every step
                rivals.append(split_system(mine)[0])
            ratios = ["%s %.1fx" % (name(o), reaches[o] / ac)
                      for o in rivals if ac and reaches.get(o)]
            if ratios:
                print("\nTime to %.2f of each system / %s's (above 1: AdaComp sooner): %s"
                      % (target, name(mine), ", ".join(ratios)), end="")
            own = mean([reach(r, target) for r in none.get((model, world), {}).get(mine, [])])
            if ac and own and rate != "none":
                print("\n%s's time to %.2f / its own no-limit time: %.2fx"
                      % (name(mine), target, ac / own), end="")
        for n in notes:
            print("\n" + n, end="")
        notes.clear()
        ddp_final = mean([r["evals"][-1][2] for r in g.get("ddp", [])
                          if r["evals"] and not truncated(r)])
        for mine in [s for s in systems_in(g) if s.startswith(ADACOMP)
                     and ddp_final is not None]:
            d = mean([r["evals"][-1][2] for r in g[mine]]) - ddp_final
            if higher:
                print("\n%s: final accuracy minus DDP's: %+.2f pp" % (name(mine), 100 * d),
                      end="")
            else:
                print("\n%s: final %s against DDP's: %+.2f%%" % (name(mine), metric,
                                                                100 * d / ddp_final), end="")
        print()


SHORT = {"ddp": "DDP", "powersgd": "DDP + PowerSGD r4", "fp16": "DDP + fp16",
         "adaps": "adaps dense", "adacomp": "adaps, 1 server",
         "adacomp-colo": "adaps, a server per worker"}


def short(system):
    base, h = split_system(system)
    return SHORT[base] + (", H = %d" % h if h > 1 else "")


def plot(a):
    """Held-out metric against training time, a line per system and seed (seed 1 solid,
    others dashed); a run stopped early (--max-steps) is not drawn, its extrapolated time to
    the target is written in the corner."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(a.plots, exist_ok=True)
    runs = load(a.results)
    for (model, world, rate), g in sorted(grouped(runs).items()):
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
        order = systems_in(g)
        target = target_for(model, world, a.target)
        notes = []
        for s in order:
            drawn = False
            for r in sorted(g.get(s, []), key=lambda r: r["seed"]):
                if truncated(r):
                    continue
                ax.plot([e[1] for e in r["evals"]], [e[2] for e in r["evals"]], marker=".",
                        color="C%d" % (order.index(s) % 10),
                        linestyle="-" if not drawn else "--",
                        label=None if drawn else short(s))
                drawn = True
            if not drawn:
                t = time_to(g[s], runs, target)
                notes.append("%s: ~%s (extrapolated)" % (short(s), "%.0f s" % t if t else "—"))
        ax.axhline(target, color="grey", linewidth=0.8, linestyle=":")
        ax.set_xscale("log")
        higher = next(iter(g.values()))[0].get("higher_is_better", True) if g else True
        if higher:
            ax.set_ylim(0.5, 0.92)
        if notes:
            ax.text(0.99, 0.98 if not higher else 0.02, "time to %.2f:\n" % target +
                    "\n".join(notes), transform=ax.transAxes, fontsize=7,
                    ha="right", va="top" if not higher else "bottom")
        ax.set_xlabel("training time, s (evaluation excluded, log scale)")
        ax.set_ylabel(next(iter(g.values()))[0].get("metric", "test accuracy"))
        ax.set_title("%s, %d workers, links %s (seed 1 solid, seed 2 dashed)"
                     % (model.upper(), world, rate_name(rate)), fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.tight_layout()
        path = os.path.join(a.plots, "%s-%s.png" % (model, rate) if world == 4 else
                            "%s-w%d-%s.png" % (model, world, rate))
        fig.savefig(path, dpi=100)
        plt.close(fig)
        print("plot: %s" % path, file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("merge")
    m.add_argument("--json", required=True)
    m.add_argument("--log", required=True)
    m.add_argument("--server-before", default="")
    m.add_argument("--server-after", default="")
    m.add_argument("--load", default="")
    for cmd in ("table", "plot", "compact"):
        p = sub.add_parser(cmd)
        p.add_argument("--results", required=True)
        p.add_argument("--target", type=float, default=None)
        if cmd == "plot":
            p.add_argument("--plots", required=True)
    a = ap.parse_args()
    {"merge": merge, "table": table, "plot": plot, "compact": compact}[a.cmd](a)


if __name__ == "__main__":
    main()
