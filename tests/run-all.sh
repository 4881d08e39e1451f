#!/usr/bin/env bash
# Sets up (Debian packages), builds and runs every test of adaps. This is what CI runs
# (.ci/run calls it and nothing else). Run as root from the repository root on Debian 12.
#
#   ADAPS_BUILD_DIR   build directory (default build)
#   ADAPS_CTEST_ARGS  extra ctest arguments, e.g. "-L unit" or "-LE slow"
#   ADAPS_FUZZ_SECONDS  seconds of fuzzing per libFuzzer target (default 20)
#   ADAPS_SANITIZERS    0 skips the ASan+UBSan and TSan builds (default 1)
#   ADAPS_DOCKER        0 skips the Docker step (default 1: it runs when a Docker engine
#                       runs or can be started, and says SKIPPED with the reason otherwise)
#   ADAPS_SLURM         0 skips the Slurm step (default 1: it runs as root where slurm-wlm,
#                       munge and network namespaces are available, SKIPPED otherwise)
#   ADAPS_FAULTS        0 skips the fault schedules (default 1: tests/faults/netns_faults.py
#                       --short runs as root where network namespaces, tc and iptables work,
#                       SKIPPED otherwise)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
build_dir=${ADAPS_BUILD_DIR:-build}

echo "== python environment (the package index's torch 2.x, Lightning, Transformers, PEFT)"
# Before the build: its configure registers the torch 2.x tests when the environment exists.
bash deploy/install-deps.sh
bash deploy/install-python-env.sh >/dev/null

echo "== build"
bash deploy/build.sh

echo "== ctest"
# shellcheck disable=SC2086
ctest --test-dir "$build_dir" --output-on-failure -j 2 --timeout 300 ${ADAPS_CTEST_ARGS:-}

if [[ ${ADAPS_DOCKER:-1} != 0 ]]; then
  echo "== docker (the compose deployment trains, survives a killed server; tests/deploy/docker_test.sh)"
  rc=0
  bash tests/deploy/docker_test.sh || rc=$?
  if [[ $rc -eq 77 ]]; then
    echo "== docker: SKIPPED (the reason is above); the compose deployment was not tested"
  elif [[ $rc -ne 0 ]]; then
    echo "== docker: FAILED"
    exit 1
  fi
fi

if [[ ${ADAPS_SLURM:-1} != 0 ]]; then
  echo "== slurm (sbatch jobs train, fail, are cancelled, survive a lost node on a namespace cluster; tests/deploy/slurm_test.sh)"
  rc=0
  bash tests/deploy/slurm_test.sh "$build_dir" || rc=$?
  if [[ $rc -eq 77 ]]; then
    echo "== slurm: SKIPPED (the reason is above); the Slurm deployment was not tested"
  elif [[ $rc -ne 0 ]]; then
    echo "== slurm: FAILED"
    exit 1
  fi
fi

if [[ ${ADAPS_FAULTS:-1} != 0 ]]; then
  echo "== faults (seeded partitions, loss and kills of a running job on network namespaces; tests/faults/netns_faults.py --short)"
  rc=0
  /usr/bin/python3 tests/faults/netns_faults.py --short --build "$build_dir" || rc=$?
  if [[ $rc -eq 77 ]]; then
    echo "== faults: SKIPPED (the reason is above); partitions and several faults at once were not tested"
  elif [[ $rc -ne 0 ]]; then
    echo "== faults: FAILED (a run's invariants did not hold: the run, its notes and its logs are above)"
    exit 1
  fi
fi

echo "== fuzz (each target for ${ADAPS_FUZZ_SECONDS:-20}s)"
bash tests/run-fuzz.sh

if [[ ${ADAPS_SANITIZERS:-1} != 0 ]]; then
  echo "== sanitizers (the CI subset; tests/run-sanitizers.sh all runs everything)"
  bash tests/run-sanitizers.sh ci
fi

echo "== all tests passed in $(( $(date +%s) - start ))s"
