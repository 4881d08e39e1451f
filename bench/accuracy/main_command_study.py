#!/usr/bin/env python3
"""The main command (deploy/run-local.sh) against dense/dense, over several seeds.

Runs each configuration x seed as a local cluster through deploy/launch.sh -- 2 servers,
4 workers, the Fashion-MNIST MLP, 3 epochs, as deploy/run-local.sh does, with the given
worker and server flags -- parses rank 0's final line and prints one markdown table: final
test accuracy per seed and their mean, the gap to the first configuration (the baseline,
dense/dense by default), bytes pushed and pulled per worker and the push ratio against
dense. The load (`uptime`) is printed before and after. Build first
(`ninja -C build adaps-scheduler adaps-server adaps-worker`); the script builds nothing.

  python3 bench/accuracy/main_command_study.py                     # the default configurations
  python3 bench/accuracy/main_command_study.py --seeds 1,2,3 \
      --config 'dense/dense|--compressor=dense --pull=dense' \
      --config 'pull T<=50||--optimizer=sgd --pull_bin_size=50'

A --config is NAME|WORKER FLAGS[|SERVER FLAGS]; worker flags come after the main command's
own (so they override them), server flags replace the default
'--optimizer=sgd --pull_bin_size=100'. Each run's output goes to --log_dir (default
$ADAPS_RESULTS_DIR/main-command, ADAPS_RESULTS_DIR being build/bench-results when unset).
"""
import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def recipe(role):
    """The main command's flags for `role`: deploy/recipe.flags, as deploy/run-local.sh."""
    with open(os.path.join(REPO, "deploy", "recipe.flags")) as f:
        for line in f:
            if line.startswith(role + ":"):
                return line.split(":", 1)[1].strip()
    sys.exit(f"deploy/recipe.flags has no '{role}:' line")


MAIN_WORKER = recipe("worker") + " --log_level=warn"
MAIN_SERVER = recipe("server")
# The main command before its accuracy work: servers' momentum, dense biases,
# recompressed pulls at the workers' bin size.
BEFORE_WORKER = "--local_momentum=0 --compress_bias=false --bin_size_bias=0"
BEFORE_SERVER = "--optimizer=momentum --momentum=0.9"
DEFAULT_CONFIGS = [
    f"dense/dense (servers' momentum)|--compressor=dense --pull=dense {BEFORE_WORKER}|"
    f"{BEFORE_SERVER}",
    "dense/dense (main command's flags)|--compressor=dense --pull=dense",
    f"main command before (server momentum, pull T = 500, dense biases)|{BEFORE_WORKER}|"
    f"{BEFORE_SERVER}",
    "main command (defaults)|",
]
FINAL = re.compile(
    r"final: .*test_acc ([0-9.]+)\s+pushed ([0-9.]+) MB per worker instead of ([0-9.]+) MB "
    r"dense.*pulled ([0-9.]+) MB instead of ([0-9.]+) MB")


def parse_config(text):
    parts = text.split("|")
    if len(parts) not in (2, 3) or not parts[0]:
        raise argparse.ArgumentTypeError(f"--config '{text}': want NAME|WORKER[|SERVER]")
    server = parts[2] if len(parts) == 3 and parts[2].strip() else MAIN_SERVER
    return parts[0], parts[1], server


def uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def run_one(args, name, worker, server, seed, log_path):
    cmd = ["nice", "-n", str(args.nice), "bash", os.path.join(REPO, "deploy/launch.sh"),
           "--servers", "2", "--workers", "4", "--bin", args.bin, "--timeout", str(args.timeout),
           "--scheduler-args", "--log_level=warn",
           "--server-args", f"{server} --log_level=warn", "--"]
    cmd += shlex.split(MAIN_WORKER) + shlex.split(worker) + [f"--seed={seed}"]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    with open(log_path, "w") as f:
        f.write(" ".join(shlex.quote(c) for c in cmd) + "\n" + proc.stdout + proc.stderr)
    match = None
    for line in proc.stdout.splitlines():
        m = FINAL.search(line)
        if m:
            match = m
    if proc.returncode != 0 or not match:
        print(f"  {name} seed {seed}: FAILED (rc {proc.returncode}), see {log_path}",
              file=sys.stderr)
        return None
    acc, pushed, pushed_dense, pulled, pulled_dense = (float(g) for g in match.groups())
    print(f"  {name} seed {seed}: acc {acc:.4f} pushed {pushed:.2f} MB pulled {pulled:.2f} MB "
          f"({time.time() - t0:.0f} s)", file=sys.stderr)
    return dict(acc=acc, pushed=pushed, pushed_dense=pushed_dense, pulled=pulled,
                pulled_dense=pulled_dense)


def table(configs, results, seeds):
    lines = ["| configuration | test acc (mean) | per seed | vs " + configs[0][0] +
             " (pp) | pushed MB/worker | pulled MB/worker | push ratio vs dense | "
             "pull ratio vs dense |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    base = None
    for name, _, _ in configs:
        runs = [r for r in results[name] if r]
        if not runs:
            lines.append(f"| {name} | failed | | | | | | |")
            continue
        mean = statistics.mean(r["acc"] for r in runs)
        if base is None:
            base = mean
        per_seed = " / ".join(f"{r['acc']:.4f}" if r else "failed" for r in results[name])
        pushed = statistics.mean(r["pushed"] for r in runs)
        pulled = statistics.mean(r["pulled"] for r in runs)
        dense = runs[0]["pushed_dense"]
        lines.append(
            f"| {name} | {mean:.4f} | {per_seed} | {100 * (mean - base):+.2f} | {pushed:.2f} | "
            f"{pulled:.2f} | {dense / pushed:.1f}x | {runs[0]['pulled_dense'] / pulled:.1f}x |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", action="append", type=parse_config,
                   help="NAME|WORKER FLAGS[|SERVER FLAGS] (repeatable; first = baseline)")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--bin", default=os.path.join(REPO, "build"))
    results = os.environ.get("ADAPS_RESULTS_DIR") or os.path.join(REPO, "build", "bench-results")
    p.add_argument("--log_dir", default=os.path.join(results, "main-command"))
    p.add_argument("--nice", type=int, default=10)
    p.add_argument("--timeout", type=int, default=900, help="seconds per run")
    args = p.parse_args()
    configs = args.config or [parse_config(c) for c in DEFAULT_CONFIGS]
    seeds = [int(s) for s in args.seeds.split(",")]
    os.makedirs(args.log_dir, exist_ok=True)
    start_load = uptime()
    print(f"load at the start: {start_load}", file=sys.stderr)
    results = {}
    for i, (name, worker, server) in enumerate(configs):
        results[name] = []
        for seed in seeds:
            log = os.path.join(args.log_dir, f"c{i}_seed{seed}.log")
            results[name].append(run_one(args, name, worker, server, seed, log))
    print(f"Main command: 2 servers ({MAIN_SERVER} unless given), 4 workers, "
          f"`{MAIN_WORKER}` + the flags below; seeds {args.seeds}.\n")
    print("| configuration | worker flags | server flags |\n|---|---|---|")
    for name, worker, server in configs:
        print(f"| {name} | `{worker.strip() or '(none)'}` | `{server}` |")
    print()
    print(table(configs, results, seeds))
    print(f"\nload (uptime) at the start: {start_load}\nat the end: {uptime()}")


if __name__ == "__main__":
    main()
