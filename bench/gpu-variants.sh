#!/usr/bin/env bash
# Build-time variants of the AdaComp pass kernel (common/cuda/adacomp_kernels.cu, the
# ADAPS_PASS_* macros), measured side by side on one GPU machine in one call (docs/gpu.md,
# "Variants"). Two steps, like gpu-prepare.sh / gpu-check.sh:
#
#   bash bench/gpu-prepare.sh && bash bench/gpu-variants.sh prepare   # here, no GPU needed
#   bash bench/gpu-variants.sh run                                     # there, with .gpu carried
#
# prepare: builds adaps_gpu_bench (and cuda_compressor_test) once per variant into
#          .gpu/bin/<target>_<name>, in ${ADAPS_GPU_VARIANT_DIR:-build-gpu-var} (only the .cu
#          objects are rebuilt between variants), and prints each pass kernel's registers
#          and spills.
# run:     each variant's gpu tests (must pass), then its benchmark (ADAPS_GPU_VARIANT_ARGS;
#          default 25M elements, T = 500 and 50), and an ncu profile of the pass kernel for the shipped build and variant
#          builds ${ADAPS_GPU_PROFILE:-v0} (v0: the shipped one) where ncu is there, kernels
#          matching ${ADAPS_GPU_PROFILE_KERNEL:-PassKernel}, skipping ADAPS_GPU_PROFILE_SKIP (3)
#          launches, then ADAPS_GPU_PROFILE_COUNT (1); also adaps_gpu_bench_ref, where there is
#          one (an earlier build to compare with, copied in by hand). Writes $OUT/variants.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
VARIANTS=(
  "w8:-DADAPS_PASS_MIN_BLOCKS=8"
  "wc:-DADAPS_PASS_STREAM_RESIDUE=0"
)
CARRY=${ADAPS_GPU_CARRY:-.gpu}
case "${1:-}" in
prepare)
  set -e
  [[ -d "$CARRY/bin" ]] || { echo "run bench/gpu-prepare.sh first" >&2; exit 1; }
  B=${ADAPS_GPU_VARIANT_DIR:-build-gpu-var}
  NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  for spec in "${VARIANTS[@]}"; do
    name=${spec%%:*}
    flags=${spec#*:}
    cmake -S . -B "$B" -G Ninja -DADAPS_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CUDA_COMPILER="$NVCC" -DADAPS_CUDA_ARCHITECTURES="${ADAPS_CUDA_ARCHITECTURES:-90}" \
      -DADAPS_CUDA_PTXAS_VERBOSE=ON -DADAPS_BUILD_BENCH=OFF -DADAPS_BUILD_TESTS=ON \
      "-DCMAKE_CUDA_FLAGS=$flags" >"$B.$name.configure.log" 2>&1
    rm -f "$B"/common/cuda/CMakeFiles/adaps_cuda.dir/*.cu.o
    ninja -C "$B" adaps_gpu_bench cuda_compressor_test >"$B.$name.build.log" 2>&1 ||
      { tail -30 "$B.$name.build.log"; exit 1; }
    for t in adaps_gpu_bench cuda_compressor_test; do
      cp "$(find "$B" -name "$t" -type f -perm -u+x | head -1)" "$CARRY/bin/${t}_$name"
      strip --strip-debug "$CARRY/bin/${t}_$name"
    done
    echo "$name ($flags): PassKernel<true, 8> $(grep -A2 'PassKernelILb1ELi8E' "$B.$name.build.log" |
      grep -oE '[0-9]+ registers|[0-9]+ bytes spill stores' | head -2 | tr '\n' ' ')"
  done
  du -sh "$CARRY"
  ;;
run)
  OUT=${OUT:-gpu-variants-out}
  mkdir -p "$OUT"
  chmod +x "$CARRY"/bin/* 2>/dev/null || true
  export LD_LIBRARY_PATH="$(cd "$CARRY" && pwd)/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  R="$OUT/variants.txt"
  : >"$R"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$R"
  ARGS=${ADAPS_GPU_VARIANT_ARGS:-"--n=25000000 --reps=50 --bins=500,50 --samples=5 --warm_s=1"}
  names=(v0 "${VARIANTS[@]%%:*}")
  for extra in ref head; do [[ -f "$CARRY/bin/adaps_gpu_bench_$extra" ]] && names+=("$extra"); done
  for name in "${names[@]}"; do
    sfx=$([[ $name == v0 ]] && echo "" || echo "_$name")
    echo "== $name" | tee -a "$R"
    if [[ -f "$CARRY/bin/cuda_compressor_test$sfx" ]]; then
      timeout -k 10 120 "$CARRY/bin/cuda_compressor_test$sfx" --gtest_color=no \
        >"$OUT/tests_$name.log" 2>&1
      echo "tests exit $?: $(grep -E '^\[  (PASSED|FAILED) *\]' "$OUT/tests_$name.log" |
        tr '\n' ' ')" | tee -a "$R"
      grep -E '^\[  FAILED  \] [A-Z]|Failure$' "$OUT/tests_$name.log" | head -5 | tee -a "$R"
    fi
    # shellcheck disable=SC2086
    timeout -k 10 60 "$CARRY/bin/adaps_gpu_bench$sfx" $ARGS >"$OUT/bench_$name.log" 2>&1
    grep -E "^=== n|cudaMemcpy|device-resident|SUMMARY|  n=[0-9]" "$OUT/bench_$name.log" | tee -a "$R"
  done
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  if [[ -n "$NCU" ]]; then
    for name in ${ADAPS_GPU_PROFILE:-v0}; do
      sfx=$([[ $name == v0 ]] && echo "" || echo "_$name")
      timeout -k 10 90 "$NCU" --clock-control none -k "regex:${ADAPS_GPU_PROFILE_KERNEL:-PassKernel}" \
        -s "${ADAPS_GPU_PROFILE_SKIP:-3}" -c "${ADAPS_GPU_PROFILE_COUNT:-1}" \
        --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section MemoryWorkloadAnalysis \
        --section ComputeWorkloadAnalysis --section InstructionStats --section SchedulerStats \
        "$CARRY/bin/adaps_gpu_bench$sfx" --n=25000000 --reps=3 --bins=500 --samples=1 \
        --warm_s=0 >"$OUT/ncu_$name.txt" 2>&1
      echo "ncu $name exit $?" | tee -a "$R"
    done
  else
    echo "ncu: not found" | tee -a "$R"
  fi
  ;;
*)
  echo "usage: bash bench/gpu-variants.sh prepare|run" >&2
  exit 2
  ;;
esac
