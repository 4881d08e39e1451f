#!/usr/bin/env bash
# Runs the timing-sensitive tests on a loaded machine: busy-loop processes keep the load
# above 10 (12 by default, at the tests' own priority: the point is a machine as loaded as a
# shared CI host) while ctest runs the tests below one at a time, --runs times. Prints each
# run's result and a final "N passed, N failed" line; exits 1 if any run failed.
# Not part of tests/run-all.sh: it takes a long time and loads the whole machine.
#
#   tests/run-under-load.sh [--runs N] [--hogs N] [--build DIR] [-R REGEX]
#     --runs N    runs of the whole list (default 5)
#     --hogs N    busy-loop processes (default 12)
#     --build DIR the build directory (default build)
#     -R REGEX    ctest regex instead of the list below
#
# Run it as root from the repository root, like tests/run-all.sh (deploy_netns_cluster_test
# needs root and skips without it). The build must be complete.
set -uo pipefail
cd "$(dirname "$0")/.."

# The tests with deadlines or timing bounds, which an idle machine does not exercise: the
# bad-flag exits, the deployment scripts' waits, the real-process fault, resume, cluster and
# elastic tests (kills, restarts, dead timeouts), and the Python suites (whole clusters in
# one ctest timeout).
tests=(
  '^deploy_bad_flags_test$'
  '^deploy_launch_restart_test$'
  '^deploy_launch_colocate_test$'
  '^deploy_netns_cluster_test$'
  '^deploy_curve_executables_test$'
  '^Faults\.'
  '/Resume\.'
  '^ResumeAllServers\.'
  '^Cluster\.'
  '^Elastic\.'
  '^Curve\.'
  '^TrainEndToEnd\.KilledServer'
  '^python_adaps_pytest$'
  '^python_accuracy_zoo_quick$'
)

runs=5 hogs=12 build=build regex=""
while [[ $# -gt 0 ]]; do
  if [[ $1 == --runs || $1 == --hogs || $1 == --build || $1 == -R ]] && [[ $# -lt 2 ]]; then
    echo "run-under-load: $1 needs a value (see --help)" >&2
    exit 2
  fi
  case $1 in
    --runs) runs=${2:-}; shift 2 ;;
    --hogs) hogs=${2:-}; shift 2 ;;
    --build) build=${2:-}; shift 2 ;;
    -R) regex=${2:-}; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "run-under-load: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "run-under-load: --runs must be a positive number, not '$runs'" >&2; exit 2; }
[[ $hogs =~ ^[0-9]+$ ]] || { echo "run-under-load: --hogs must be a number, not '$hogs'" >&2; exit 2; }
[[ -f $build/CTestTestfile.cmake ]] ||
  { echo "run-under-load: no tests in '$build' (build first: bash deploy/build.sh)" >&2; exit 2; }
if [[ -z $regex ]]; then
  regex=$(IFS='|'; echo "${tests[*]}")
fi

hog_pids=()
logs=$(mktemp -d /tmp/adaps-under-load.XXXXXX)
stop_hogs() {
  local pid
  for pid in "${hog_pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${hog_pids[@]}"; do wait "$pid" 2>/dev/null; done
  hog_pids=()
}
trap 'stop_hogs; exit 130' INT TERM
trap stop_hogs EXIT
for ((i = 0; i < hogs; i++)); do
  bash -c 'while :; do :; done' &
  hog_pids+=($!)
done
load() { cut -d' ' -f1 /proc/loadavg; }
echo "run-under-load: $hogs busy loops (pids ${hog_pids[*]:0:3}...), $runs runs of -R '$regex'; logs in $logs"

passed=0 failed=0
for ((r = 1; r <= runs; r++)); do
  start=$SECONDS load_start=$(load)
  ctest --test-dir "$build" -R "$regex" --output-on-failure >"$logs/run$r.log" 2>&1
  rc=$?
  summary=$(grep -E "tests passed|tests failed" "$logs/run$r.log" | tail -1)
  if [[ $rc -eq 0 ]]; then
    passed=$((passed + 1))
    echo "run $r: passed in $((SECONDS - start)) s, load $load_start..$(load): $summary"
  else
    failed=$((failed + 1))
    echo "run $r: FAILED in $((SECONDS - start)) s, load $load_start..$(load): $summary"
    grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess aborted|Not Run)\)" \
      "$logs/run$r.log" | sed 's/^/  /'
  fi
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
