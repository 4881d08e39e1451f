#!/usr/bin/env bash
# The GPU check of adaps (docs/gpu.md), run on the GPU machine. It builds NOTHING and installs
# nothing (that machine has no network, no -dev packages, only a pip CMake): it runs the
# binaries that bench/gpu-prepare.sh built on a CPU machine and collected into .gpu/, which the
# device tool carries. Within about 6 minutes: the CPU instance of the conformance suite without its
# 16M-element test (at most 30 s), the gpu tests (the shared conformance suite against the CPU
# oracle, the device-resident path, streams; at most 150 s), a short compute-sanitizer memcheck
# pass over the CUDA tests (at most 45 s; skipped, and said so, where compute-sanitizer is not
# installed) and the GPU
# benchmark (compress at T = 500 and 50 on 25M, 100M and 250k elements against a device-to-device copy
# of the same bytes, decompress-add, the dense baseline; each figure the median of 5 samples,
# the GPU kept busy for 1 s before the reference copy; at most 90 s); then the worker
# library's device path (worker_device_gpu_test: against the host path, and the 25M push
# time; at most 90 s) and adaps.torch end to end (its module compiled here against the carried
# libadaps_worker.so, at most 60 s, then bench/gpu/torch_e2e.py, at most 90 s). Every step
# runs under `timeout -k` (killed 10 s after its limit if it ignores the TERM).
#
#   bash bench/gpu-check.sh            # from the repository root (or anywhere)
#
# Environment: ADAPS_GPU_CARRY (default .gpu), OUT (default gpu-check-out; the device tool sets
# it), ADAPS_GPU_BENCH_ARGS (default "--n=25000000,100000000,250000 --reps=50 --bins=500,50 --samples=5
# --warm_s=1"), COMPUTE_SANITIZER (the compute-sanitizer binary; default: PATH, then the usual
# CUDA install folders).
# Writes $OUT/gpu-figures.txt (the GPU, the test totals, the sanitizer's verdict, the
# benchmark's table and SUMMARY) and the logs $OUT/cpu-conformance.log, $OUT/gpu-tests.log,
# $OUT/gpu-tests.xml, $OUT/sanitizer.log, $OUT/gpu-bench.log, $OUT/device-path.log,
# $OUT/e2e.log, $OUT/gpu-check.log.
#
# Exit status: 0 tests passed, the sanitizer found nothing (or was absent) and the benchmark ran
# (its SUMMARY says whether the 60% target was met); 1 a test failure, a sanitizer error report
# or a benchmark error; 2 no usable GPU; 3 .gpu/ missing or broken.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
CARRY=${ADAPS_GPU_CARRY:-.gpu}
OUT=${OUT:-gpu-check-out}
BENCH_ARGS=${ADAPS_GPU_BENCH_ARGS:---n=25000000,100000000,250000 --reps=50 --bins=500,50 --samples=5 --warm_s=1}
KILL_AFTER=10  # timeout -k: SIGKILL this long after the TERM of a step that ignores it
mkdir -p "$OUT"
FIG="$OUT/gpu-figures.txt"
LOG="$OUT/gpu-check.log"
: >"$FIG"
: >"$LOG"
say() { echo "== gpu-check [$(( $(date +%s) - START ))s]: $*" | tee -a "$LOG"; }
fig() { echo "$*" | tee -a "$FIG"; }

# --- The carried binaries ----------------------------------------------------------------------
# The carry may not keep the executable bit: set it, or run copies from a temporary folder
# where the carried folder is read-only.
if [[ -d "$CARRY/bin" ]]; then
  chmod +x "$CARRY"/bin/* 2>/dev/null || true
  for b in "$CARRY"/bin/*; do
    if [[ ! -x "$b" ]]; then
      RUNBIN=$(mktemp -d "${TMPDIR:-/tmp}/adaps-gpu-bin.XXXXXX")
      cp "$CARRY"/bin/* "$RUNBIN"/ && chmod +x "$RUNBIN"/*
      break
    fi
  done
fi
if [[ ! -f "$CARRY/bin/cuda_compressor_test" || ! -f "$CARRY/bin/adaps_gpu_bench" ]]; then
  say "FAIL: $CARRY/bin is missing: run bench/gpu-prepare.sh on a CPU machine and carry $CARRY"
  exit 3
fi
CARRY=$(cd "$CARRY" && pwd)
BIN=${RUNBIN:-$CARRY/bin}
if [[ ! -x "$BIN/cuda_compressor_test" || ! -x "$BIN/adaps_gpu_bench" ]]; then
  say "FAIL: cannot make the carried binaries executable ($BIN)"
  exit 3
fi
ORIG_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}  # the Python run keeps the machine's own
export LD_LIBRARY_PATH="$CARRY/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fig "adaps GPU check, $(date -u +%FT%TZ)"
sed -n '1,4p' "$CARRY/MANIFEST" 2>/dev/null | sed 's/^/prepared /' | tee -a "$FIG"
[[ "$BIN" != "$CARRY/bin" ]] && say "running copies in $BIN ($CARRY/bin is read-only)"
missing=$(ldd "$BIN"/* 2>&1 | grep "not found" || true)
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
# Without the 16M-element test (a minute of CPU oracle; the GPU instance runs it).
say "cpu conformance: compressor_conformance_test (at most 30 s)"
timeout -k $KILL_AFTER 30 "$BIN/compressor_conformance_test" --gtest_color=no \
  --gtest_filter='-*MoreThan16M*' >"$OUT/cpu-conformance.log" 2>&1
CPU_RC=$?
[[ $CPU_RC -eq 124 || $CPU_RC -eq 137 ]] && fig "cpu conformance: TIMED OUT after 30 s"
grep -E "^\[  (PASSED|FAILED) *\] [0-9]+ test" "$OUT/cpu-conformance.log" | sed 's/^/cpu conformance: /' \
  | tee -a "$FIG"

# --- The gpu tests -----------------------------------------------------------------------------
say "gpu tests: cuda_compressor_test (at most 150 s)"
timeout -k $KILL_AFTER 150 "$BIN/cuda_compressor_test" --gtest_color=no \
  --gtest_output="xml:$OUT/gpu-tests.xml" >"$OUT/gpu-tests.log" 2>&1
TEST_RC=$?
grep -E "^(GPU|no GPU): " "$OUT/gpu-tests.log" | head -1 | tee -a "$FIG"
grep -E "^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]+ test|^\[==========\] [0-9]+ tests" \
  "$OUT/gpu-tests.log" | sed 's/^/tests: /' | tee -a "$FIG"
grep -E "^\[  FAILED  \] |Failure$" "$OUT/gpu-tests.log" | head -40 | tee -a "$LOG"
if [[ $TEST_RC -ne 0 ]]; then
  [[ $TEST_RC -eq 124 || $TEST_RC -eq 137 ]] && fig "tests: TIMED OUT after 150 s"
  say "FAIL: gpu tests (exit $TEST_RC; $OUT/gpu-tests.log); running the benchmark anyway"
fi

# --- compute-sanitizer memcheck over the CUDA tests (short: no 16M-element slices) -------------
# Out-of-bounds and misaligned device accesses, and CUDA API errors, in the kernels as the
# tests drive them. Only with a GPU; skipped (and said so) where compute-sanitizer is absent.
SAN_RC=0
SAN=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || true)}
for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer \
         /opt/nvidia/compute-sanitizer/compute-sanitizer; do
  [[ -z "$SAN" && -x "$c" ]] && SAN=$c
done
if [[ $HAVE_GPU -eq 0 ]]; then
  fig "sanitizer: SKIPPED (no GPU)"
elif [[ -z "$SAN" ]]; then
  fig "sanitizer: SKIPPED (compute-sanitizer not found on this machine)"
else
  SAN_FILTER='CudaAdaComp.*:CudaDecompress*:Cuda/AdaCompConformance/*.HandMadeInputsMatch'
  SAN_FILTER+=':Cuda/AdaCompConformance/*.NonFinite*:Cuda/AdaCompConformance/*.Overflow*'
  SAN_FILTER+=':Cuda/AdaCompConformance/*.APushOfSeveralSlicesCommitsAllOrNone'
  say "sanitizer: $SAN --tool memcheck over $SAN_FILTER (at most 45 s)"
  timeout -k $KILL_AFTER 45 "$SAN" --tool memcheck --error-exitcode 99 --print-limit 20 \
    "$BIN/cuda_compressor_test" --gtest_color=no --gtest_filter="$SAN_FILTER" \
    >"$OUT/sanitizer.log" 2>&1
  SAN_RC=$?
  summary=$(grep -E "ERROR SUMMARY" "$OUT/sanitizer.log" | tail -1)
  tests=$(grep -E "^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]+ test" "$OUT/sanitizer.log" | tr '\n' ' ')
  case $SAN_RC in
    0) fig "sanitizer: memcheck clean: ${summary:-no summary} ${tests}" ;;
    124|137) fig "sanitizer: TIMED OUT after 45 s (not counted as a failure): ${tests}"; SAN_RC=0 ;;
    99) fig "sanitizer: memcheck FOUND ERRORS: $summary ($OUT/sanitizer.log)" ;;
    *) fig "sanitizer: exit $SAN_RC (tests under memcheck failed?): $summary ${tests}" ;;
  esac
fi

# --- The benchmark -----------------------------------------------------------------------------
BENCH_RC=3
if [[ $HAVE_GPU -eq 1 ]]; then
  say "benchmark: adaps_gpu_bench $BENCH_ARGS (at most 90 s)"
  # shellcheck disable=SC2086
  timeout -k $KILL_AFTER 90 "$BIN/adaps_gpu_bench" $BENCH_ARGS >"$OUT/gpu-bench.log" 2>&1
  BENCH_RC=$?
  fig ""
  tee -a "$FIG" <"$OUT/gpu-bench.log"
  [[ $BENCH_RC -eq 124 || $BENCH_RC -eq 137 ]] && fig "benchmark: TIMED OUT after 90 s"
fi

# --- The worker library's device path ----------------------------------------------------------
# Tensors on cuda:0 beside the same tensors in host memory in one in-process job (the same
# parameters up to the scale's ulp, the same bytes), and the encode time of a 25M push on the
# device path against the host-staged one (a figure: DEVICE-PUSH).
DEV_RC=0
if [[ $HAVE_GPU -eq 1 && -x "$BIN/worker_device_gpu_test" ]]; then
  say "device path: worker_device_gpu_test (at most 90 s)"
  timeout -k $KILL_AFTER 90 "$BIN/worker_device_gpu_test" --gtest_color=no \
    >"$OUT/device-path.log" 2>&1
  DEV_RC=$?
  fig ""
  grep -E "^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]+ test" "$OUT/device-path.log" \
    | sed 's/^/device path: /' | tee -a "$FIG"
  grep -E "^DEVICE-PUSH|differ by ulps" "$OUT/device-path.log" | tail -3 | tee -a "$FIG"
  [[ $DEV_RC -eq 124 || $DEV_RC -eq 137 ]] && fig "device path: TIMED OUT after 90 s"
fi

# --- adaps.torch end to end on the GPU ---------------------------------------------------------
# The module compiled here against the carried library (bench/gpu/build-module.sh), then the
# zoo's transformer trained dense, on the device path and host-staged (bench/gpu/torch_e2e.py).
# Not counted in the exit status where this machine cannot compile the module (said so).
E2E_RC=0
if [[ $HAVE_GPU -eq 1 && -x "$BIN/adaps-scheduler" ]]; then
  say "end to end: build the module, then bench/gpu/torch_e2e.py (at most 150 s)"
  PYDIR=$(mktemp -d "${TMPDIR:-/tmp}/adaps-gpu-py.XXXXXX")
  LD_LIBRARY_PATH=$ORIG_LD_LIBRARY_PATH timeout -k $KILL_AFTER 60 \
    bash bench/gpu/build-module.sh "$CARRY" "$PYDIR" python3 >"$OUT/e2e.log" 2>&1
  MOD_RC=$?
  if [[ $MOD_RC -eq 0 ]]; then
    LD_LIBRARY_PATH=$ORIG_LD_LIBRARY_PATH PYTHONPATH="$PYDIR${PYTHONPATH:+:$PYTHONPATH}" \
      PYTHONUNBUFFERED=1 timeout -k $KILL_AFTER 90 python3 bench/gpu/torch_e2e.py \
      --bin "$BIN" --lib "$CARRY/lib" >>"$OUT/e2e.log" 2>&1
    E2E_RC=$?
    fig ""
    grep -E '^\{"way"|^SUMMARY|^NO GPU' "$OUT/e2e.log" | sed 's/^/e2e: /' | tee -a "$FIG"
    [[ $E2E_RC -eq 124 || $E2E_RC -eq 137 ]] && fig "e2e: TIMED OUT after 90 s"
  else
    fig "e2e: SKIPPED: the module was not built (exit $MOD_RC): $(tail -1 "$OUT/e2e.log")"
    [[ $MOD_RC -eq 4 ]] || E2E_RC=$MOD_RC
  fi
fi
fig ""
fig "total: $(( $(date +%s) - START )) s; cpu conformance exit $CPU_RC; gpu tests exit $TEST_RC;" \
    "sanitizer exit $SAN_RC; benchmark exit $BENCH_RC; device path exit $DEV_RC; e2e exit $E2E_RC"

if [[ $HAVE_GPU -eq 0 || $BENCH_RC -eq 3 ]]; then
  say "NO GPU usable: tests skipped (exit $TEST_RC), nothing measured"
  [[ $TEST_RC -ne 0 || $CPU_RC -ne 0 || $SAN_RC -ne 0 ]] && exit 1
  exit 2
fi
if [[ $CPU_RC -ne 0 || $TEST_RC -ne 0 || $SAN_RC -ne 0 || $BENCH_RC -ne 0 || $DEV_RC -ne 0 ||
      $E2E_RC -ne 0 ]]; then
  say "FAIL (figures: $FIG)"
  exit 1
fi
say "done: tests passed, benchmark ran (figures: $FIG)"
