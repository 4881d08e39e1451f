"""bench/race/summarize.py's tables from result JSONs written here (no cluster, no network):
the local-steps systems (vs_torch.sh --local-steps H names them adacomp-colo-hH), the times
of runs stopped early, and the ratios the race's goals are stated in."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUMMARIZE = os.path.join(REPO, "bench", "race", "summarize.py")


def result(system, label, evals, step_ms, steps=300, max_steps=0, seed=1):
    return dict(system=system, model="gpt", label=label, seed=seed, world=4, batch_size=16,
                params=1000, steps=steps, total_steps=300, max_steps=max_steps, evals=evals,
                metric="bits/char", higher_is_better=False, step_ms_median=step_ms,
                step_ms_mean=step_ms * 1.5, train_time=1.0, bytes_per_step_worker=1000.0,
                compute_share=0.5, local_steps=int(system.rsplit("-h", 1)[1])
                if "-h" in system else 1)


def write(tmp_path, runs):
    for r in runs:
        with open(str(tmp_path / ("%s-%s-s%d.json" % (r["system"], r["label"], r["seed"]))),
                  "w") as f:
            json.dump(r, f)


def compact(tmp_path):
    p = subprocess.run([sys.executable, SUMMARIZE, "compact", "--results", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_local_steps_rows_and_ratios_against_ddp_powersgd_and_every_step(tmp_path):
    write(tmp_path, [
        # DDP reaches 3.25 at step 200 with no limit; at 1 Mbit/s it stopped after 10 steps
        # of 5 s: ~200 x 5 = 1000 s.
        result("ddp", "none", [(100, 5.0, 3.6), (200, 10.0, 3.2)], 50.0),
        result("ddp", "1mbit", [(10, 50.0, 5.9)], 5000.0, steps=10, max_steps=10),
        result("powersgd", "1mbit", [(300, 900.0, 3.4)], 700.0),
        result("adacomp-colo", "none", [(200, 8.0, 3.3), (300, 12.0, 3.2)], 40.0),
        result("adacomp-colo", "1mbit", [(200, 40.0, 3.3), (300, 50.0, 3.2)], 160.0),
        result("adacomp-colo-h10", "none", [(300, 10.0, 3.2)], 30.0),
        result("adacomp-colo-h10", "1mbit", [(300, 10.0, 3.2)], 30.0),
    ])
    out = compact(tmp_path)
    rows = {line.split("|")[1].strip(): line for line in out.splitlines()
            if line.startswith("| ")}
    h10 = "adaps AdaComp/recompressed, a server beside each worker, exchange every 10 steps"
    assert h10 in rows, out
    assert "~1000.0 s" in rows["DDP (gloo allreduce)"], out          # extrapolated
    assert "not reached" in rows["DDP + PowerSGD rank 4"], out
    ratios = [line for line in out.splitlines() if line.startswith("- " + h10 + ":")]
    assert len(ratios) == 1, out
    # 1000 / 10 against DDP; 50 / 10 against the same system exchanging every step; at its
    # no-limit time.
    assert "100x DDP" in ratios[0] and "PowerSGD never" in ratios[0], ratios
    assert "5.0x exchanging every step" in ratios[0], ratios
    assert "1.00x its no-limit time" in ratios[0], ratios


def test_a_seed_that_does_not_reach_the_target_leaves_the_mean_unreached(tmp_path):
    write(tmp_path, [
        result("adacomp", "none", [(300, 10.0, 3.2)], 30.0, seed=1),
        result("adacomp", "none", [(300, 10.0, 3.3)], 30.0, seed=2),
    ])
    out = compact(tmp_path)
    row = next(line for line in out.splitlines() if line.startswith("| adaps AdaComp"))
    assert "not reached" in row, out
