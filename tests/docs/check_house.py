#!/usr/bin/env python3
"""The repository reads as pages, not as a lab notebook.

Usage: check_house.py ROOT   (exit 1 naming every rule broken, with the file and line)

Rules, over the files git tracks under ROOT (a tree that is not a git checkout is walked
instead, leaving out build*/ and hidden folders):
  - README.md has at most 220 lines; docs/benchmarks.md and docs/accuracy.md at most 550
    each: the current figure of each question, not every measurement ever taken (history
    lives in git).
  - At most 30 tracked run outputs. A run output is a tracked file under bench/ whose name
    ends in .json, .jsonl, .csv, .tsv or .log, or any tracked file with a folder named
    results (or results-*) or runs in its path. The benchmark scripts write theirs to
    build/bench-results/ or $ADAPS_RESULTS_DIR; a doc keeps the numbers as a table.
  - No code file cites an issue number ("issue 12", "Issue #3"): a comment says what the
    code does and why. Code files: *.h, *.cc, *.cu, *.cuh, *.c, *.py, *.sh, *.cmake,
    *.fbs, CMakeLists.txt; the whole file is scanned, comments and strings alike (a message
    a user reads cannot cite one either).
  - No tracked text file (binary files are skipped) names the design or style notes kept
    outside the repository (the two names are built below, so this file does not name
    them itself).
"""
import os
import re
import subprocess
import sys

LINE_LIMITS = {"README.md": 220, "docs/benchmarks.md": 550, "docs/accuracy.md": 550}
MAX_RUN_OUTPUTS = 30
RUN_OUTPUT_EXT = (".json", ".jsonl", ".csv", ".tsv", ".log")
RUN_OUTPUT_DIR = re.compile(r"(^|/)(results(-[^/]*)?|runs)/")
CODE_EXT = (".h", ".cc", ".cu", ".cuh", ".c", ".py", ".sh", ".cmake", ".fbs")
ISSUE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
OUTSIDE_NOTES = ("DESIGN" + ".md", "STYLE" + ".md")


def tracked_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True,
                             capture_output=True).stdout
        return [f for f in out.decode("utf-8", "replace").split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        print("check_house: %s is not a git checkout; walking the tree" % root)
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if not x.startswith((".", "build"))]
        for n in names:
            files.append(os.path.relpath(os.path.join(d, n), root))
    return files


def is_run_output(path):
    if path.startswith("bench/") and path.endswith(RUN_OUTPUT_EXT):
        return True
    return bool(RUN_OUTPUT_DIR.search(path))


def is_code(path):
    return path.endswith(CODE_EXT) or os.path.basename(path) == "CMakeLists.txt"


def read_lines(root, path):
    try:
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return None  # a tracked file deleted in the working tree, or a link to nowhere


def check(root):
    problems = []
    files = tracked_files(root)
    for path, limit in LINE_LIMITS.items():
        lines = read_lines(root, path)
        if lines is None:
            problems.append("%s: missing" % path)
        elif len(lines) > limit:
            problems.append("%s: %d lines, more than %d: keep the current figure of each "
                            "question, move the rest to the right page or to git history"
                            % (path, len(lines), limit))
    outputs = sorted(f for f in files if is_run_output(f))
    if len(outputs) > MAX_RUN_OUTPUTS:
        shown = "\n    ".join(outputs[:10])
        problems.append("%d tracked run outputs, more than %d (write them to "
                        "build/bench-results/ and keep the numbers in a doc's table); the "
                        "first:\n    %s" % (len(outputs), MAX_RUN_OUTPUTS, shown))
    for path in files:
        if os.path.abspath(os.path.join(root, path)) == os.path.abspath(__file__):
            continue
        code = is_code(path)
        lines = read_lines(root, path)
        if lines is None or any("\0" in line for line in lines[:200]):
            continue  # gone from the working tree, or binary (images)
        for number, line in enumerate(lines, 1):
            if code:
                m = ISSUE.search(line)
                if m:
                    problems.append("%s:%d: cites %r: say what the code does and why"
                                    % (path, number, m.group(0)))
            for name in OUTSIDE_NOTES:
                if name in line:
                    problems.append("%s:%d: names %s, a file outside the repository: point "
                                    "to a page of docs/ instead" % (path, number, name))
    return problems, len(outputs)


def main():
    if len(sys.argv) != 2:
        print("usage: check_house.py ROOT", file=sys.stderr)
        return 2
    root = sys.argv[1]
    if not os.path.isdir(root):
        print("check_house: %s is not a directory" % root, file=sys.stderr)
        return 2
    problems, outputs = check(root)
    for p in problems:
        print("check_house: " + p)
    if problems:
        print("check_house: %d problem(s)" % len(problems))
        return 1
    print("check_house: ok (%d tracked run outputs)" % outputs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
