#!/usr/bin/env bash
# The GPU check of adaps (docs/gpu.md): on a machine with an NVIDIA GPU, the CUDA toolkit and
# the Debian dev packages (deploy/install-deps.sh), builds only the CUDA target, its tests and
# the GPU benchmark, runs the `gpu` tests against the CPU oracle, then measures AdaComp
# compress throughput for 25M floats at bin sizes 500 and 50 against a device-to-device copy
# of the same bytes in the same run (target >= 60%). Under 5 minutes in all.
#
#   bash bench/gpu-check.sh            # from the repository root (or anywhere)
#
# Environment: ADAPS_GPU_BUILD_DIR (default build-gpu-check), ADAPS_CUDA_ARCHITECTURES
# (default: the GPU's compute capability from nvidia-smi, else 90), ADAPS_GPU_BENCH_ARGS
# (default "--n=25000000 --reps=50 --bins=500,50"), JOBS (default: all cores).
#
# Exit status: 0 tests passed and the benchmark ran (its SUMMARY says whether the 60% target
# was met); 1 a build or test failure; 2 no usable GPU (built, tests skipped, nothing measured).
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
elapsed() { echo "$(( $(date +%s) - START ))s"; }
say() { echo "== gpu-check [$(elapsed)]: $*"; }

BUILD=${ADAPS_GPU_BUILD_DIR:-build-gpu-check}
JOBS=${JOBS:-$(nproc)}
BENCH_ARGS=${ADAPS_GPU_BENCH_ARGS:---n=25000000 --reps=50 --bins=500,50}

# --- The GPU ------------------------------------------------------------------------------
HAVE_GPU=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  HAVE_GPU=1
  say "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap \
                 --format=csv,noheader 2>/dev/null | head -1)"
else
  say "NO GPU: nvidia-smi finds no usable NVIDIA GPU; building and running what runs without one"
fi
ARCH=${ADAPS_CUDA_ARCHITECTURES:-}
if [[ -z "$ARCH" && $HAVE_GPU -eq 1 ]]; then
  ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
fi
ARCH=${ARCH:-90}

# --- Toolchain and packages ---------------------------------------------------------------
NVCC=$(command -v nvcc || true)
[[ -z "$NVCC" && -x /usr/local/cuda/bin/nvcc ]] && NVCC=/usr/local/cuda/bin/nvcc
if [[ -z "$NVCC" ]]; then
  say "FAIL: no CUDA toolkit (nvcc not on PATH nor in /usr/local/cuda/bin)"
  exit 1
fi
say "nvcc: $NVCC ($("$NVCC" --version | tail -1))"
need=(cmake ninja-build pkg-config libabsl-dev libgtest-dev libgmock-dev libzmq3-dev
      libspdlog-dev flatbuffers-compiler libflatbuffers-dev)
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  say "missing packages: ${missing[*]}; running deploy/install-deps.sh"
  if ! bash deploy/install-deps.sh; then
    say "FAIL: could not install ${missing[*]} (run deploy/install-deps.sh as root)"
    exit 1
  fi
fi

# --- Build: only the CUDA target, its tests and the benchmark -------------------------------
say "configure $BUILD (ADAPS_CUDA=ON, architectures $ARCH)"
if ! cmake -S . -B "$BUILD" -G Ninja -DADAPS_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
     -DCMAKE_CUDA_COMPILER="$NVCC" -DADAPS_CUDA_ARCHITECTURES="$ARCH" \
     -DADAPS_BUILD_BENCH=OFF -DADAPS_BUILD_TESTS=ON >"$BUILD.configure.log" 2>&1; then
  tail -30 "$BUILD.configure.log"
  say "FAIL: configure (log: $BUILD.configure.log)"
  exit 1
fi
say "build adaps_cuda cuda_compressor_test adaps_gpu_bench (-j$JOBS)"
if ! ninja -C "$BUILD" -j"$JOBS" adaps_cuda cuda_compressor_test adaps_gpu_bench \
     >"$BUILD.build.log" 2>&1; then
  tail -40 "$BUILD.build.log"
  say "FAIL: build (log: $BUILD.build.log)"
  exit 1
fi
TEST_BIN=$(find "$BUILD" -name cuda_compressor_test -type f -perm -u+x | head -1)
BENCH_BIN=$(find "$BUILD" -name adaps_gpu_bench -type f -perm -u+x | head -1)

# --- The gpu tests ---------------------------------------------------------------------------
say "run the gpu tests ($TEST_BIN)"
timeout 150 "$TEST_BIN" --gtest_color=no >"$BUILD.tests.log" 2>&1
TEST_RC=$?
grep -E "^(GPU|no GPU): |^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]+ test" "$BUILD.tests.log"
grep -E "^\[  FAILED  \] .*\.|Failure|error:" "$BUILD.tests.log" | head -40
if [[ $TEST_RC -ne 0 ]]; then
  [[ $TEST_RC -eq 124 ]] && say "tests TIMED OUT after 150 s"
  say "FAIL: gpu tests (exit $TEST_RC; full log: $BUILD.tests.log)"
  exit 1
fi
say "gpu tests passed (full log: $BUILD.tests.log)"

if [[ $HAVE_GPU -eq 0 ]]; then
  "$BENCH_BIN" $BENCH_ARGS
  say "NO GPU: built and linked; the gpu tests skipped; nothing was measured"
  exit 2
fi

# --- The benchmark ---------------------------------------------------------------------------
say "run the benchmark: $BENCH_BIN $BENCH_ARGS"
timeout 120 "$BENCH_BIN" $BENCH_ARGS
BENCH_RC=$?
if [[ $BENCH_RC -eq 3 ]]; then
  say "NO GPU usable by the CUDA runtime (see above); nothing measured"
  exit 2
elif [[ $BENCH_RC -ne 0 ]]; then
  say "FAIL: benchmark (exit $BENCH_RC)"
  exit 1
fi
say "done"
