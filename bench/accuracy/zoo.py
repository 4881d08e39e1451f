#!/usr/bin/python3
"""The accuracy zoo: dense against AdaComp at the defaults a user gets, on the
models of zoo_models.py.

    bash deploy/build.sh
    /usr/bin/python3 bench/accuracy/zoo.py                  # every model, seeds 1 and 2
    /usr/bin/python3 bench/accuracy/zoo.py --models gpt,lstm --seeds 1
    /usr/bin/python3 bench/accuracy/zoo.py --quick          # smoke test: 1 seed, few steps
    /usr/bin/python3 bench/accuracy/zoo.py --summarize      # table and plot from the JSONs
    /usr/bin/python3 bench/accuracy/zoo.py --phases         # where AdaComp's bytes go, by steps
    /usr/bin/python3 bench/accuracy/zoo.py --schedule constant --out DIR --doc /dev/null
                                                  # every recipe at a constant learning rate

Each run is a real cluster on this machine: `python3 -m adaps.launch -n 4` (1 scheduler,
1 server, 4 workers running bench/accuracy/zoo_worker.py), the same data, initial values
and schedule for every system. The systems:

  dense-local    local mode (--server-optimizer mean), --compression dense: DDP's arithmetic
  adacomp-local  local mode, nothing else given: adaps.torch's defaults
  dense-server   server mode, servers running the momentum, dense      (mlp, cnn only)
  adacomp-server server mode, servers running plain SGD, defaults (the workers' momentum
                 correction)                                            (mlp, cnn only)

It prints and writes a table (final metric, gap to dense, bytes pushed and pulled against
dense, training time; mean over seeds) into --doc between the zoo markers, and a plot of the
metric against steps (zoo.png in --out). Per-run JSONs and logs are in --out: by default
$ADAPS_RESULTS_DIR/accuracy-zoo, ADAPS_RESULTS_DIR defaulting to build/bench-results, so run
outputs stay out of the source tree; --summarize reads the same place.
"""
import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.environ.get("ADAPS_RESULTS_DIR") or os.path.join(REPO, "build", "bench-results")
sys.path.insert(0, HERE)
import zoo_models  # noqa: E402

SYSTEMS = {
    "dense-local": ["--server-optimizer", "mean", "--compression", "dense"],
    "adacomp-local": ["--server-optimizer", "mean"],
    "dense-server": ["--server-optimizer", "momentum", "--compression", "dense"],
    "adacomp-server": ["--server-optimizer", "sgd"],
}
SERVER_MODE_MODELS = ("mlp", "cnn")  # SGD: the servers can run their optimizer
BEGIN, END = "<!-- zoo:begin -->", "<!-- zoo:end -->"


def parse():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(zoo_models.MODELS))
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: seed 1, 12 steps, small evaluation sets")
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--out", default=os.path.join(RESULTS, "accuracy-zoo"),
                    help="where the per-run JSONs, logs and the plot go, and where "
                         "--summarize and --phases read them (default: %(default)s)")
    ap.add_argument("--doc", default=os.path.join(REPO, "docs", "accuracy.md"))
    ap.add_argument("--summarize", action="store_true", help="only the table and the plot")
    ap.add_argument("--phases", action="store_true",
                    help="only print where AdaComp's bytes go: push, pull and total against "
                         "dense over steps 1-100, 101-300, 301-1000, 1001-3000 and the rest, "
                         "and after step 300 (rank 0's bytes)")
    ap.add_argument("--skip-existing", action="store_true",
                    help="keep the runs whose JSON is already in --out")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    ap.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                    help="an adaps.torch setting for every run, exported as ADAPS_<NAME> "
                         "(e.g. own_updates=off): to measure an alternative to a default; "
                         "without it every run gets the defaults a user gets, whatever the "
                         "shell exports")
    ap.add_argument("--text", default=None,
                    help="a UTF-8 text for the language models instead of the licence texts "
                         "(a check on a corpus the defaults were not measured on; pair it "
                         "with its own --out and --doc)")
    ap.add_argument("--schedule", default="recipe", choices=zoo_models.SCHEDULES,
                    help="constant: every recipe's peak learning rate after its warm-up, "
                         "never decayed (a check of a plain `Adam(lr=...)` loop); step: "
                         "the peak divided by 10 at half the steps and at three quarters "
                         "(MultiStepLR); pair either with its own --out and --doc")
    ap.add_argument("--test-size", type=int, default=zoo_models.IMAGE_TEST_SIZE,
                    help="the image models (but dwnet, always scored on all) are scored on "
                         "the first this many of the 10,000 test images (default "
                         "%(default)s; 10000 where a gap of a few tenths of a point matters)")
    a = ap.parse_args()
    if not 1 <= a.test_size <= 10000:
        ap.error("--test-size takes 1 to 10000, not %d" % a.test_size)
    for kv in a.setting:
        if "=" not in kv or not kv.split("=", 1)[0]:
            ap.error("--setting takes NAME=VALUE, not %r" % kv)
    if a.quick:
        a.seeds, a.steps, a.eval_every = "1", 12, 6
    for m in a.models.split(","):
        if m not in zoo_models.MODELS:
            ap.error("unknown model %r (%s)" % (m, ", ".join(zoo_models.MODELS)))
    for s in a.systems.split(","):
        if s not in SYSTEMS:
            ap.error("unknown system %r (%s)" % (s, ", ".join(SYSTEMS)))
    return a


def runs(a):
    for model in a.models.split(","):
        for system in a.systems.split(","):
            if system.endswith("-server") and model not in SERVER_MODE_MODELS:
                continue
            for seed in a.seeds.split(","):
                yield model, system, int(seed)


def run_one(a, model, system, seed):
    os.makedirs(a.out, exist_ok=True)
    out = os.path.join(a.out, "%s-%s-s%d.json" % (model, system, seed))
    log = out[:-5] + ".log"
    env = dict(os.environ, PYTHONPATH=os.path.join(a.build, "python"),
               ADAPS_BIN_DIR=a.build, PYTHONDONTWRITEBYTECODE="1")
    for k in [k for k in env if k.startswith("ADAPS_") and k != "ADAPS_BIN_DIR"]:
        del env[k]  # the defaults a user gets, not this shell's settings
    for kv in a.setting:
        name, value = kv.split("=", 1)
        env["ADAPS_" + name.upper()] = value
    argv = [sys.executable, "-m", "adaps.launch", "-n", str(a.workers), "--servers", "1"]
    argv += SYSTEMS[system]
    argv += [os.path.join(HERE, "zoo_worker.py"), "--model", model, "--seed", str(seed),
             "--steps", str(a.steps), "--eval-every", str(a.eval_every), "--out", out]
    if a.quick:
        argv.append("--quick")
    if a.text:
        argv += ["--text", os.path.abspath(a.text)]
    if a.schedule != "recipe":
        argv += ["--schedule", a.schedule]
    if a.test_size != zoo_models.IMAGE_TEST_SIZE:
        argv += ["--test-size", str(a.test_size)]
    if os.path.exists(out):
        os.remove(out)
    start = time.time()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env,
                                timeout=a.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    if rc != 0 or not os.path.exists(out):
        with open(log) as f:
            tail = f.read()[-3000:]
        raise SystemExit("zoo: %s %s seed %d failed (%s) after %.0f s; log %s:\n%s"
                         % (model, system, seed, rc, time.time() - start, log, tail))
    with open(out) as f:
        r = json.load(f)
    bits = bits_per_param_step(r)
    print("%-6s %-15s seed %d  %s %.4f  push %6.1fx  pull %6.1fx  %s%5.0f s" % (
        model, system, seed, r["metric"], r["final"], ratio(r, "push"), ratio(r, "pull"),
        "" if not bits else "%.4f bits/param/step in all (%.0fx below dense)  "
        % (bits, 64 / bits), r["seconds"]), flush=True)
    return r


def ratio(r, what):
    """Against the same exchanges sent dense (with local_steps=H, H times fewer than dense
    training's: bits_per_param_step is the figure to compare across H)."""
    t = r["traffic"]
    return t[what + "_dense"] / max(1, t[what + "_wire"])


def bits_per_param_step(r):
    """Rank 0's wire bytes pushed and pulled (headers included) as bits per trained
    parameter per step of the run: dense training's is 64 (32 each way). None for a JSON
    without the parameter count."""
    t, layers = r["traffic"], r.get("by_layer")
    params = sum(d["params"] for d in layers.values()) if layers else 0
    if not params or not r["steps"]:
        return None
    return 8.0 * (t["push_wire"] + t["pull_wire"]) / (params * r["steps"])


def total_ratio(r):
    t = r["traffic"]
    return (t["push_dense"] + t["pull_dense"]) / max(1, t["push_wire"] + t["pull_wire"])


def load(a):
    results = collections.defaultdict(list)
    if not os.path.isdir(a.out):
        return results
    for name in sorted(os.listdir(a.out)):
        if name.endswith(".json"):
            with open(os.path.join(a.out, name)) as f:
                r = json.load(f)
            system = name[len(r["model"]) + 1:name.rindex("-s")]
            results[(r["model"], system)].append(r)
    return results


# Steps 1-100, 101-300, 301-1,000, 1,001-3,000 and the rest: a long run spends almost all
# of its bytes after step 300, which is what its ratio there says.
PHASES = ((0, 100), (100, 300), (300, 1000), (1000, 3000), (3000, None))


def phase_ratios(r, first, last):
    """Push and pull against dense over steps first+1..last (rank 0's bytes each step)."""
    wire = r["wire"]
    last = len(wire) if last is None else min(last, len(wire))
    if first >= last:
        return None
    before = wire[first - 1] if first else (0, 0, 0)
    push, pull = wire[last - 1][1] - before[1], wire[last - 1][2] - before[2]
    steps = (last - first) / len(wire)
    t = r["traffic"]
    return (t["push_dense"] * steps / max(1, push), t["pull_dense"] * steps / max(1, pull),
            (t["push_dense"] + t["pull_dense"]) * steps / max(1, push + pull))


def mean_phase(rs, first, last):
    """phase_ratios averaged over the runs that have those steps, or None."""
    got = [g for g in (phase_ratios(r, first, last) for r in rs) if g]
    return tuple(statistics.mean(g[i] for g in got) for i in range(3)) if got else None


def phases(results):
    """Where the bytes go: push / pull / total against dense by phase of the run, and the
    total after step 300 (docs/accuracy.md, "Where the bytes go")."""
    lines = ["| model | system | steps | push / pull / total, steps 1-100 | 101-300 | "
             "301-1000 | 1001-3000 | 3001- | total after step 300 | total |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for model in zoo_models.MODELS:
        for system in SYSTEMS:
            rs = [r for r in results.get((model, system), []) if r.get("wire")]
            if not rs or system.startswith("dense"):
                continue
            cells = ["%.0fx / %.0fx / %.0fx" % m if m else ""
                     for m in (mean_phase(rs, first, last) for first, last in PHASES)]
            after = mean_phase(rs, 300, None)
            cells.append("%.1fx" % after[2] if after else "")
            lines.append("| %s | %s | %d | %s | %.1fx |" % (
                model, system, max(len(r["wire"]) for r in rs), " | ".join(cells),
                statistics.mean(total_ratio(r) for r in rs)))
    return "\n".join(lines)


def gap(r, dense):
    if r["higher_is_better"]:
        return "%+.2f pp" % (100 * (r["final"] - dense))
    return "%+.1f%%" % (100 * (r["final"] / dense - 1))


def table(results):
    lines = ["| model | system | metric | seeds | final (mean) | gap to dense | push | pull "
             "| total (push+pull) | time per run |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for model in zoo_models.MODELS:
        for system in SYSTEMS:
            rs = results.get((model, system))
            if not rs:
                continue
            mean = lambda f: statistics.mean(f(r) for r in rs)  # noqa: E731
            final = mean(lambda r: r["final"])
            dense = results.get((model, system.replace("adacomp", "dense")))
            g = gap(dict(rs[0], final=final), statistics.mean(r["final"] for r in dense)) \
                if dense and system.startswith("adacomp") else ""
            lines.append("| %s | %s | %s | %s | %.4f | %s | %.1fx | %.1fx | %.1fx | %.0f s |" % (
                model, system, rs[0]["metric"], ",".join(str(r["seed"]) for r in rs), final, g,
                mean(lambda r: ratio(r, "push")), mean(lambda r: ratio(r, "pull")),
                mean(total_ratio), mean(lambda r: r["seconds"])))
    return "\n".join(lines)


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = [m for m in zoo_models.MODELS if any(k[0] == m for k in results)]
    if not models:
        return
    cols = min(5, len(models))  # a grid, five models a row
    rows = (len(models) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
    for ax in axes.flat[len(models):]:
        ax.set_visible(False)
    for ax, model in zip(axes.flat, models):
        metric = ""
        for system in SYSTEMS:
            rs = results.get((model, system))
            if not rs:
                continue
            metric = rs[0]["metric"]
            steps = [s for s, _ in rs[0]["curve"]]
            ys = [statistics.mean(r["curve"][i][1] for r in rs if len(r["curve"]) > i)
                  for i in range(len(steps))]
            ax.plot(steps, ys, label=system, linestyle="-" if "adacomp" in system else "--")
        ax.set_title(model)
        ax.set_xlabel("step")
        ax.set_ylabel(metric)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def write_doc(a, text):
    if not os.path.exists(a.doc):
        return
    with open(a.doc) as f:
        doc = f.read()
    if BEGIN not in doc or END not in doc:
        print("zoo: %s has no %s ... %s markers; table not written" % (a.doc, BEGIN, END))
        return
    head, rest = doc.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    with open(a.doc, "w") as f:
        f.write(head + BEGIN + "\n" + text + "\n" + END + tail)


def check_quick(results):
    """The smoke test's verdict: every run ended with a finite metric that beats the initial
    one, and AdaComp compressed the uplink."""
    bad = []
    for (model, system), rs in sorted(results.items()):
        for r in rs:
            first, final = r["curve"][0][1], r["final"]
            better = final > first if r["higher_is_better"] else final < first
            if not (final == final and abs(final) != float("inf")) or not better:
                bad.append("%s %s: %s went from %.4f to %.4f" % (model, system, r["metric"],
                                                                  first, final))
            if system.startswith("adacomp") and ratio(r, "push") < 5:
                bad.append("%s %s: push only %.1fx" % (model, system, ratio(r, "push")))
    if bad:
        raise SystemExit("zoo --quick failed:\n  " + "\n  ".join(bad))
    print("zoo --quick: %d runs trained and compressed" % sum(len(v) for v in results.values()))


def main():
    a = parse()
    if a.phases:
        print(phases(load(a)))
        return
    if not a.summarize:
        for model, system, seed in runs(a):
            if a.skip_existing and os.path.exists(
                    os.path.join(a.out, "%s-%s-s%d.json" % (model, system, seed))):
                continue
            run_one(a, model, system, seed)
    results = load(a)
    text = table(results)
    print(text)
    if a.quick:
        check_quick(results)
        return
    plot(results, os.path.join(a.out, "zoo.png"))
    write_doc(a, "Written by `bench/accuracy/zoo.py` on %s, %d steps, %d workers.\n\n%s"
              % (time.strftime("%Y-%m-%d"), a.steps, a.workers, text))


if __name__ == "__main__":
    main()
