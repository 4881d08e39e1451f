#!/usr/bin/python3
"""Local steps against dense: adaps.torch's local_steps=H (the update exchange every H
steps) with the outer step averaging or DiLoCo's Nesterov, on models of the accuracy zoo.

    bash deploy/build.sh
    /usr/bin/python3 bench/accuracy/local_steps.py --models gpt,mlp-adam --seeds 1 --steps 320
    /usr/bin/python3 bench/accuracy/local_steps.py --summarize   # the table from the JSONs
    /usr/bin/python3 bench/accuracy/local_steps.py --plot docs/figures/local-steps.png
        # the H sweep's figure from docs/local-steps.md's 1,024-step table

Each configuration is one bench/accuracy/zoo.py run per model and seed (a real 4-worker
cluster through adaps.launch, the same data, initial values and schedule for every one),
with its settings exported as ADAPS_* (zoo.py --setting), into its own folder of --out
($ADAPS_RESULTS_DIR/local-steps, build/bench-results/local-steps by default):

  dense          dense-local: DDP's arithmetic, every step
  H1-avg         adacomp-local at the defaults (local_steps=1: the update exchange as it is)
  H<h>-avg       adacomp-local, local_steps=h, outer average
  H<h>-nest      adacomp-local, local_steps=h, outer nesterov (DiLoCo's lr 0.7, momentum 0.9)
  dense-H<h>-*   the update exchange sent dense every h steps (DiLoCo without compression)
  H<h>-avg-vlocal  local_steps=h with second_moment=local (torch's own Adam step)
  H<h>-avg-bin<t>  local_steps=h with AdaComp's bin size t (--bins h:t) instead of 500

The table: rank 0's final held-out metric (mean over seeds), its gap to dense, and rank 0's
bytes as bits per trained parameter per step, sent (pushes: headers and payload) and
received (pull requests and answers): 8 * bytes / (parameters * steps). Use a --steps that
every H divides, so the last steps are exchanged too.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.environ.get("ADAPS_RESULTS_DIR") or os.path.join(REPO, "build", "bench-results")


def configs(hs, extra, bins=()):
    """[(name, zoo system, [settings])] in table order."""
    out = [("dense", "dense-local", [])]
    for h in hs:
        for outer, short in (("average", "avg"), ("nesterov", "nest")):
            settings = ["local_steps=%d" % h] if h > 1 else []
            if outer != "average":
                settings.append("outer=" + outer)
            out.append(("H%d-%s" % (h, short), "adacomp-local", settings))
    for h in extra:
        out.append(("H%d-avg-vlocal" % h, "adacomp-local",
                    ["local_steps=%d" % h, "second_moment=local"]))
        for outer, short in (("average", "avg"), ("nesterov", "nest")):
            out.append(("dense-H%d-%s" % (h, short), "dense-local",
                        ["exchange=update", "local_steps=%d" % h, "outer=" + outer]))
    for h, t in bins:
        out.append(("H%d-avg-bin%d" % (h, t), "adacomp-local",
                    ["local_steps=%d" % h, "bin_size=%d" % t]))
    return out


def parse():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gpt,mlp-adam")
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--steps", type=int, default=320)
    ap.add_argument("--eval-every", type=int, default=80)
    ap.add_argument("--local-steps", default="1,4,16", help="the H to run, comma-separated")
    ap.add_argument("--extra", default="16",
                    help="the H (comma-separated, or empty) to also run with "
                         "second_moment=local and sent dense")
    ap.add_argument("--bins", default="",
                    help="H:T,... also run local_steps=H with bin_size=T (outer average)")
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--out", default=os.path.join(RESULTS, "local-steps"),
                    help="where the runs go (default $ADAPS_RESULTS_DIR/local-steps, "
                         "ADAPS_RESULTS_DIR defaulting to build/bench-results)")
    ap.add_argument("--summarize", action="store_true", help="only the table from the JSONs")
    ap.add_argument("--plot", default="",
                    help="draw the H sweep (gap to dense against bytes below dense, each "
                         "model and worker count a line over H) from --doc's 1,024-step "
                         "table into this PNG, and nothing else")
    ap.add_argument("--doc", default=os.path.join(REPO, "docs", "local-steps.md"))
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per zoo run")
    a = ap.parse_args()
    try:
        a.hs = [int(h) for h in a.local_steps.split(",")]
        a.extras = [int(h) for h in a.extra.split(",") if h]
        a.bins = [tuple(int(x) for x in b.split(":")) for b in a.bins.split(",") if b]
        if any(len(b) != 2 or b[1] < 1 for b in a.bins):
            raise ValueError
    except ValueError:
        ap.error("--local-steps and --extra take integers, comma-separated; --bins H:T,... "
                 "with T >= 1")
    if any(h < 1 for h in a.hs + a.extras + [b[0] for b in a.bins]):
        ap.error("every H must be at least 1")
    bad = sorted({h for h in a.hs + a.extras + [b[0] for b in a.bins] if a.steps % h})
    if bad:
        ap.error("--steps %d is not a multiple of H = %s: the last steps would not be "
                 "exchanged" % (a.steps, bad))
    return a


def run(a):
    for name, system, settings in configs(a.hs, a.extras, a.bins):
        argv = [sys.executable, os.path.join(HERE, "zoo.py"), "--models", a.models,
                "--systems", system, "--seeds", a.seeds, "--steps", str(a.steps),
                "--eval-every", str(a.eval_every), "--build", a.build,
                "--out", os.path.join(a.out, name), "--doc", os.devnull, "--skip-existing",
                "--timeout", str(a.timeout)]
        for s in settings:
            argv += ["--setting", s]
        print("local_steps: %s (%s %s)" % (name, system, " ".join(settings)), flush=True)
        start = time.time()
        rc = subprocess.run(argv).returncode
        if rc != 0:
            raise SystemExit("local_steps: %s failed (zoo.py exited %d after %.0f s)"
                             % (name, rc, time.time() - start))


def load(a):
    """{(model, config): [zoo JSON, one a seed]}."""
    out = {}
    for name, _, _ in configs(a.hs, a.extras, a.bins):
        d = os.path.join(a.out, name)
        if not os.path.isdir(d):
            continue
        for f in sorted(os.listdir(d)):
            if f.endswith(".json"):
                with open(os.path.join(d, f)) as fh:
                    r = json.load(fh)
                out.setdefault((r["model"], name), []).append(r)
    return out


def bits(r, what):
    """Rank 0's bits per trained parameter per step, sent ("push") or received ("pull")."""
    params = sum(d["params"] for d in r["by_layer"].values())
    return 8.0 * r["traffic"][what + "_wire"] / (params * r["steps"])


def table(a, results):
    lines = ["| model | config | metric | seeds | final (mean) | gap to dense | sent bits/param/step "
             "| received bits/param/step | total against dense |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for model in a.models.split(","):
        dense = results.get((model, "dense"))
        for name, _, _ in configs(a.hs, a.extras, a.bins):
            rs = results.get((model, name))
            if not rs:
                continue
            mean = lambda f: statistics.mean(f(r) for r in rs)  # noqa: E731
            final = mean(lambda r: r["final"])
            gap = ""
            if dense and name != "dense":
                d = statistics.mean(r["final"] for r in dense)
                gap = "%+.2f pp" % (100 * (final - d)) if rs[0]["higher_is_better"] else \
                    "%+.1f%%" % (100 * (final / d - 1))
            sent, got = mean(lambda r: bits(r, "push")), mean(lambda r: bits(r, "pull"))
            against = ""
            if dense:
                dense_bits = statistics.mean(bits(r, "push") + bits(r, "pull") for r in dense)
                against = "%.0fx" % (dense_bits / (sent + got))
            lines.append("| %s | %s | %s | %s | %.4f | %s | %.3f | %.3f | %s |" % (
                model, name, rs[0]["metric"], ",".join(str(r["seed"]) for r in rs), final,
                gap, sent, got, against))
    return "\n".join(lines)


def sweep_rows(doc):
    """(model, workers, H, dense?, gap, against dense) of the 1,024-step table's rows at
    the defaults (H1 and the bold Hh rows) and of DiLoCo sent dense."""
    rows, on = [], False
    with open(doc) as f:
        for line in f:
            if line.startswith("### 1,024 steps"):
                on = True
            elif on and line.startswith("#"):
                break
            if not on or not line.startswith("| ") or line.startswith("| model"):
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            model, workers, config, gap, against = cells[0], int(cells[1]), cells[2], cells[5], \
                cells[9]
            m = re.fullmatch(r"\**H(\d+)(?: \(defaults\)|, defaults)\**", config) or \
                re.fullmatch(r"dense, H(\d+) \(DiLoCo\)", config)
            if not m or not gap:
                continue
            rows.append((model, workers, int(m.group(1)), config.startswith("dense"),
                         float(gap.split()[0].rstrip("%")), float(against.rstrip("x"))))
    return rows


def plot(doc, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = sweep_rows(doc)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, lm in zip(axes, (True, False)):
        keys = sorted({(m, w) for m, w, *_ in rows if (m in ("gpt", "wordgpt")) == lm})
        for i, (model, workers) in enumerate(keys):
            for dense in (False, True):
                pts = sorted((h, g, x) for m, w, h, d, g, x in rows
                             if (m, w, d) == (model, workers, dense))
                if not pts:
                    continue
                ax.plot([x for _, _, x in pts], [g for _, g, _ in pts], marker="o",
                        color="C%d" % i, linestyle="--" if dense else "-",
                        label="%s, %d workers%s" % (model, workers,
                                                     ", sent dense" if dense else ""))
                for h, g, x in pts:
                    ax.annotate("H%d" % h, (x, g), textcoords="offset points", xytext=(4, 3),
                                fontsize=7)
        bound = 2.0 if lm else -0.3
        ax.axhline(bound, color="grey", linewidth=0.8, linestyle=":")
        ax.axhline(0, color="black", linewidth=0.5)
        ax.set_xscale("log")
        ax.set_xlabel("bytes in all, times below dense (log)")
        ax.set_ylabel("held-out loss against dense, %" if lm else
                      "accuracy against dense, pp")
        ax.set_title("language models (bound +2%)" if lm else "classifiers (bound -0.3 pp)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Local steps over 1,024 steps: AdaComp at bin 500 / H (docs/local-steps.md)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print("plot: %s (%d points)" % (out, len(rows)), file=sys.stderr)


def main():
    a = parse()
    if a.plot:
        return plot(a.doc, a.plot)
    if not a.summarize:
        run(a)
    print(table(a, load(a)))


if __name__ == "__main__":
    main()
