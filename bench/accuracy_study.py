#!/usr/bin/python3
"""Accuracy study: dense, AdaComp, Top-k (0.1%) and 1-bit sign on Fashion-MNIST.

Runs adaps-train-sim for every (model, compressor, workers, seed), then writes
  <out>/runs/*.csv, *.log   one CSV row per epoch, and the program's output
  <out>/results.csv         final row of every run
  <out>/summary.md          the table (mean over seeds), with the AdaComp-vs-dense check
  <out>/<model>_accuracy.png  test accuracy against epoch and against bytes pushed
<out> defaults to $ADAPS_RESULTS_DIR/accuracy-study (ADAPS_RESULTS_DIR: build/bench-results
when unset), outside the source tree. Use /usr/bin/python3 (Debian's numpy and matplotlib).
Example:
  /usr/bin/python3 bench/accuracy_study.py --binary build/worker/trainer/adaps-train-sim
"""
import argparse
import collections
import concurrent.futures
import csv
import os
import statistics
import subprocess
import sys
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COMPRESSORS = ["dense", "adacomp", "topk", "sign"]
PAPER_RATE = {"fc": "~200x", "conv": "~40x"}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", default="build/worker/trainer/adaps-train-sim")
    results = os.environ.get("ADAPS_RESULTS_DIR") or os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build", "bench-results")
    p.add_argument("--out", default=os.path.join(results, "accuracy-study"))
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--compressors", default=",".join(COMPRESSORS))
    p.add_argument("--workers", default="4,8")
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--mlp_epochs", type=int, default=5)
    p.add_argument("--mlp_train_limit", type=int, default=0)
    p.add_argument("--mlp_lr", type=float, default=0.1)
    p.add_argument("--cnn_epochs", type=int, default=3)
    p.add_argument("--cnn_train_limit", type=int, default=30000)
    p.add_argument("--cnn_lr", type=float, default=0.05)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--topk_fraction", type=float, default=0.001)
    p.add_argument("--jobs", type=int, default=2, help="runs at once")
    p.add_argument("--reuse", action="store_true", help="keep runs whose CSV is complete")
    return p.parse_args()


def run_one(args, model, comp, workers, seed):
    epochs = getattr(args, model + "_epochs")
    name = f"{model}_{comp}_w{workers}_s{seed}"
    csv_path = os.path.join(args.out, "runs", name + ".csv")
    log_path = os.path.join(args.out, "runs", name + ".log")
    if args.reuse and os.path.exists(csv_path):
        with open(csv_path) as f:
            if sum(1 for _ in f) == epochs + 1:
                return name, 0.0, "reused"
    if os.path.exists(csv_path):
        os.remove(csv_path)
    cmd = [args.binary, f"--model={model}", f"--compressor={comp}", f"--workers={workers}",
           f"--epochs={epochs}", f"--seed={seed}", f"--lr={getattr(args, model + '_lr')}",
           f"--batch={args.batch}", f"--train_limit={getattr(args, model + '_train_limit')}",
           f"--topk_fraction={args.topk_fraction}", f"--csv={csv_path}"]
    start = time.time()
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    if rc != 0:
        raise RuntimeError(f"{name} failed (rc {rc}); see {log_path}")
    return name, time.time() - start, "ran"


def read_rows(args, model, comp, workers, seed):
    path = os.path.join(args.out, "runs", f"{model}_{comp}_w{workers}_s{seed}.csv")
    with open(path) as f:
        return list(csv.DictReader(f))


def mean(xs):
    return statistics.mean(xs) if xs else float("nan")


def fmt_rate(x):
    return "-" if x == 0 else f"{x:.0f}x" if x >= 10 else f"{x:.1f}x"


def main():
    args = parse_args()
    os.makedirs(os.path.join(args.out, "runs"), exist_ok=True)
    models = args.models.split(",")
    comps = args.compressors.split(",")
    workers_list = [int(w) for w in args.workers.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    jobs = [(m, c, w, s) for m in models for w in workers_list for s in seeds for c in comps]
    # The slow CNN runs first so the parallel slots drain evenly.
    jobs.sort(key=lambda j: j[0] != "cnn")
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_one, args, *j) for j in jobs]
        for f in concurrent.futures.as_completed(futures):
            name, secs, how = f.result()
            print(f"[{time.time() - t0:7.1f} s] {name}: {how} in {secs:.1f} s", flush=True)
    wall = time.time() - t0

    runs = {j: read_rows(args, *j) for j in jobs}
    with open(os.path.join(args.out, "results.csv"), "w", newline="") as f:
        writer = None
        for j, rows in sorted(runs.items()):
            if writer is None:
                writer = csv.DictWriter(f, fieldnames=list(rows[-1].keys()))
                writer.writeheader()
            writer.writerow(rows[-1])

    # Table: mean over seeds of the final epoch.
    lines = []
    lines.append("| model | workers | compressor | test acc (mean) | per seed | vs dense (pp) | "
                 "rate fc | rate conv | rate bias | rate total | payload rate fc / conv | "
                 "density fc / conv | pushed MB / run |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    checks = []
    final = collections.defaultdict(dict)
    for m in models:
        for w in workers_list:
            for c in comps:
                last = [runs[(m, c, w, s)][-1] for s in seeds]
                final[(m, w)][c] = dict(
                    acc=mean([float(r["test_acc"]) for r in last]),
                    accs=[float(r["test_acc"]) for r in last],
                    fc=mean([float(r["rate_fc"]) for r in last]),
                    conv=mean([float(r["rate_conv"]) for r in last]),
                    bias=mean([float(r["rate_bias"]) for r in last]),
                    total=mean([float(r["rate_total"]) for r in last]),
                    pfc=mean([float(r["payload_rate_fc"]) for r in last]),
                    pconv=mean([float(r["payload_rate_conv"]) for r in last]),
                    dfc=mean([float(r["density_fc"]) for r in last]),
                    dconv=mean([float(r["density_conv"]) for r in last]),
                    mb=mean([float(r["pushed_bytes"]) / 1e6 for r in last]))
            dense_acc = final[(m, w)]["dense"]["acc"] if "dense" in comps else float("nan")
            for c in comps:
                r = final[(m, w)][c]
                diff = 100.0 * (r["acc"] - dense_acc)
                per_seed = " / ".join(f"{a:.4f}" for a in r["accs"])
                payload = f"{fmt_rate(r['pfc'])} / {fmt_rate(r['pconv'])}"
                density = f"{100 * r['dfc']:.3f}% / " + (f"{100 * r['dconv']:.2f}%" if m == "cnn" else "-")
                lines.append(f"| {m} | {w} | {c} | {r['acc']:.4f} | {per_seed} | {diff:+.2f} | "
                             f"{fmt_rate(r['fc'])} | {fmt_rate(r['conv'])} | {fmt_rate(r['bias'])} | "
                             f"{fmt_rate(r['total'])} | {payload} | {density} | {r['mb']:.1f} |")
                if c == "adacomp":
                    checks.append((m, w, diff))
    out = []
    out.append("# Accuracy study results\n")
    out.append(f"Seeds {seeds}; MLP {args.mlp_epochs} epochs on "
               f"{args.mlp_train_limit or 60000} training images (lr {args.mlp_lr}); CNN "
               f"{args.cnn_epochs} epochs on {args.cnn_train_limit or 60000} training images "
               f"(lr {args.cnn_lr}); batch {args.batch} per worker; cosine learning-rate decay; "
               f"test accuracy on all 10,000 test images after the last epoch. Wall time "
               f"{wall / 60:.1f} min with {args.jobs} runs at once.\n")
    out.extend(lines)
    out.append("")
    out.append(f"Paper (Chen et al. 2018): about {PAPER_RATE['fc']} on fully-connected and "
               f"{PAPER_RATE['conv']} on conv layers.\n")
    out.append("AdaComp against dense (requirement: within 1.0 percentage point, mean over seeds):\n")
    for m, w, diff in checks:
        verdict = "PASS" if diff >= -1.0 else "FAIL"
        out.append(f"- {m}, {w} workers: {diff:+.2f} pp  {verdict}")
    for m in models:
        if "adacomp" in comps:
            avg = mean([d for mm, _, d in checks if mm == m])
            out.append(f"- {m}, averaged over worker counts: {avg:+.2f} pp  "
                       f"{'PASS' if avg >= -1.0 else 'FAIL'}")
    out.append("")
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write("\n".join(out))
    print("\n".join(out))

    # Plots: per model, accuracy against epoch and against bytes pushed (mean over seeds).
    colors = {"dense": "black", "adacomp": "tab:red", "topk": "tab:blue", "sign": "tab:green"}
    styles = {workers_list[0]: "-"}
    for i, w in enumerate(workers_list[1:]):
        styles[w] = ["--", ":", "-."][i % 3]
    for m in models:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
        for c in comps:
            for w in workers_list:
                per_seed = [runs[(m, c, w, s)] for s in seeds]
                n = min(len(r) for r in per_seed)
                epochs = [int(per_seed[0][e]["epoch"]) for e in range(n)]
                acc = [mean([float(r[e]["test_acc"]) for r in per_seed]) for e in range(n)]
                mb = [mean([float(r[e]["pushed_bytes"]) / 1e6 for r in per_seed]) for e in range(n)]
                label = f"{c}, {w} workers"
                ax1.plot(epochs, acc, styles[w], color=colors.get(c), marker="o", label=label)
                ax2.plot(mb, acc, styles[w], color=colors.get(c), marker="o", label=label)
        ax1.set_xlabel("epoch")
        ax1.set_ylabel("test accuracy")
        ax1.set_title(f"{m.upper()}: test accuracy per epoch (mean of {len(seeds)} seeds)")
        ax2.set_xscale("log")
        ax2.set_xlabel("MB pushed by all workers (headers counted, log scale)")
        ax2.set_ylabel("test accuracy")
        ax2.set_title(f"{m.upper()}: test accuracy against bytes pushed")
        for ax in (ax1, ax2):
            ax.grid(True, alpha=0.3)
        ax1.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(args.out, f"{m}_accuracy.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
