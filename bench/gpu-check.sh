#!/usr/bin/env bash
# The GPU check of adaps (docs/gpu.md), run on the GPU machine. It builds NOTHING and installs
# nothing (that machine has no network, no -dev packages, only a pip CMake): it runs the
# binaries that bench/gpu-prepare.sh built on a CPU machine and collected into .gpu/, which the
# device tool carries. Within 5 minutes: the CPU instance of the conformance suite (at most
# 30 s), the gpu tests (the shared conformance suite against the CPU oracle, the device-resident
# path, streams; at most 150 s) and the GPU benchmark (compress at T = 500 and 50 on 25M and
# 250k elements against a device-to-device copy of the same bytes, decompress-add, the dense
# baseline; at most 110 s).
#
#   bash bench/gpu-check.sh            # from the repository root (or anywhere)
#
# Environment: ADAPS_GPU_CARRY (default .gpu), OUT (default gpu-check-out; the device tool sets
# it), ADAPS_GPU_BENCH_ARGS (default "--n=25000000,250000 --reps=50 --bins=500,50").
# Writes $OUT/gpu-figures.txt (the GPU, the test totals, the benchmark's table and SUMMARY) and
# the logs $OUT/cpu-conformance.log, $OUT/gpu-tests.log, $OUT/gpu-tests.xml,
# $OUT/gpu-bench.log, $OUT/gpu-check.log.
#
# Exit status: 0 tests passed and the benchmark ran (its SUMMARY says whether the 60% target
# was met); 1 a test failure or a benchmark error; 2 no usable GPU; 3 .gpu/ missing or broken.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
CARRY=${ADAPS_GPU_CARRY:-.gpu}
OUT=${OUT:-gpu-check-out}
BENCH_ARGS=${ADAPS_GPU_BENCH_ARGS:---n=25000000,250000 --reps=50 --bins=500,50}
mkdir -p "$OUT"
FIG="$OUT/gpu-figures.txt"
LOG="$OUT/gpu-check.log"
: >"$FIG"
: >"$LOG"
say() { echo "== gpu-check [$(( $(date +%s) - START ))s]: $*" | tee -a "$LOG"; }
fig() { echo "$*" | tee -a "$FIG"; }

# --- The carried binaries ----------------------------------------------------------------------
if [[ ! -x "$CARRY/bin/cuda_compressor_test" || ! -x "$CARRY/bin/adaps_gpu_bench" ]]; then
  say "FAIL: $CARRY/bin is missing: run bench/gpu-prepare.sh on a CPU machine and carry $CARRY"
  exit 3
fi
CARRY=$(cd "$CARRY" && pwd)
export LD_LIBRARY_PATH="$CARRY/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fig "adaps GPU check, $(date -u +%FT%TZ)"
sed -n '1,4p' "$CARRY/MANIFEST" 2>/dev/null | sed 's/^/prepared /' | tee -a "$FIG"
missing=$(ldd "$CARRY"/bin/* 2>&1 | grep "not found" || true)
if [[ -n "$missing" ]]; then
  echo "$missing" | tee -a "$LOG"
  say "FAIL: libraries not found on this machine (see above)"
  exit 3
fi

# --- The GPU -----------------------------------------------------------------------------------
HAVE_GPU=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  HAVE_GPU=1
  fig "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap \
               --format=csv,noheader 2>/dev/null | head -1)"
else
  fig "NO GPU: nvidia-smi finds no usable NVIDIA GPU"
fi

# --- The CPU side of the conformance suite on this machine's CPU (the oracle's ISA path) -------
say "cpu conformance: $CARRY/bin/compressor_conformance_test (at most 30 s)"
timeout 30 "$CARRY/bin/compressor_conformance_test" --gtest_color=no >"$OUT/cpu-conformance.log" 2>&1
CPU_RC=$?
grep -E "^\[  (PASSED|FAILED) *\] [0-9]+ test" "$OUT/cpu-conformance.log" | sed 's/^/cpu conformance: /' \
  | tee -a "$FIG"

# --- The gpu tests -----------------------------------------------------------------------------
say "gpu tests: $CARRY/bin/cuda_compressor_test (at most 150 s)"
timeout 150 "$CARRY/bin/cuda_compressor_test" --gtest_color=no \
  --gtest_output="xml:$OUT/gpu-tests.xml" >"$OUT/gpu-tests.log" 2>&1
TEST_RC=$?
grep -E "^(GPU|no GPU): " "$OUT/gpu-tests.log" | head -1 | tee -a "$FIG"
grep -E "^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]+ test|^\[==========\] [0-9]+ tests" \
  "$OUT/gpu-tests.log" | sed 's/^/tests: /' | tee -a "$FIG"
grep -E "^\[  FAILED  \] |Failure$" "$OUT/gpu-tests.log" | head -40 | tee -a "$LOG"
if [[ $TEST_RC -ne 0 ]]; then
  [[ $TEST_RC -eq 124 ]] && fig "tests: TIMED OUT after 150 s"
  say "FAIL: gpu tests (exit $TEST_RC; $OUT/gpu-tests.log); running the benchmark anyway"
fi

# --- The benchmark -----------------------------------------------------------------------------
BENCH_RC=3
if [[ $HAVE_GPU -eq 1 ]]; then
  say "benchmark: adaps_gpu_bench $BENCH_ARGS (at most 110 s)"
  # shellcheck disable=SC2086
  timeout 110 "$CARRY/bin/adaps_gpu_bench" $BENCH_ARGS >"$OUT/gpu-bench.log" 2>&1
  BENCH_RC=$?
  fig ""
  tee -a "$FIG" <"$OUT/gpu-bench.log"
  [[ $BENCH_RC -eq 124 ]] && fig "benchmark: TIMED OUT after 110 s"
fi
fig ""
fig "total: $(( $(date +%s) - START )) s; cpu conformance exit $CPU_RC; gpu tests exit $TEST_RC;" \
    "benchmark exit $BENCH_RC"

if [[ $HAVE_GPU -eq 0 || $BENCH_RC -eq 3 ]]; then
  say "NO GPU usable: tests skipped (exit $TEST_RC), nothing measured"
  [[ $TEST_RC -ne 0 || $CPU_RC -ne 0 ]] && exit 1
  exit 2
fi
if [[ $CPU_RC -ne 0 || $TEST_RC -ne 0 || $BENCH_RC -ne 0 ]]; then
  say "FAIL (figures: $FIG)"
  exit 1
fi
say "done: tests passed, benchmark ran (figures: $FIG)"
