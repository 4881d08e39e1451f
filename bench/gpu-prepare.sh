#!/usr/bin/env bash
# Prepares the GPU check on a machine WITHOUT a GPU (docs/gpu.md, "Running the GPU check"): the
# GPU machine has no network, none of the -dev packages and only a pip CMake, so everything is
# built here and carried there in one folder, which bench/gpu-check.sh then only runs.
#
#   bash bench/gpu-prepare.sh        # from the repository root (or anywhere)
#
# Configures ${ADAPS_GPU_BUILD_DIR:-build-gpu} (-DADAPS_CUDA=ON, Release, architectures
# ${ADAPS_CUDA_ARCHITECTURES:-90}), builds only the CUDA target, the gpu test binary, the CPU
# conformance test, the GPU benchmark, the worker library's device-path test, adaps-scheduler,
# adaps-server and libadaps_worker.so, and collects into ${ADAPS_GPU_CARRY:-.gpu}/:
#   bin/   the binaries (debug info stripped)
#   lib/   libadaps_worker.so and the shared libraries they load (from ldd; without the C
#          library family and the NVIDIA driver's libraries, which the GPU machine provides)
#   include/absl  Abseil's headers (the Python module is compiled there against the library)
#   MANIFEST  what was built from which commit, and the sizes
#   ptxas.txt ptxas's resource usage of every kernel (registers, shared memory, spills): the
#             CUDA objects are rebuilt each time with -Xptxas=-v (ADAPS_CUDA_PTXAS_VERBOSE)
# Fails when a kernel spills registers, or when the folder is over 48 MiB (the device tool
# carries at most 64 MiB in all).
set -euo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
say() { echo "== gpu-prepare [$(( $(date +%s) - START ))s]: $*"; }

BUILD=${ADAPS_GPU_BUILD_DIR:-build-gpu}
CARRY=${ADAPS_GPU_CARRY:-.gpu}
ARCH=${ADAPS_CUDA_ARCHITECTURES:-90}
JOBS=${JOBS:-$(nproc)}
NVCC=$(command -v nvcc || true)
[[ -z "$NVCC" && -x /usr/local/cuda/bin/nvcc ]] && NVCC=/usr/local/cuda/bin/nvcc
[[ -n "$NVCC" ]] || { say "FAIL: no nvcc (PATH or /usr/local/cuda/bin)"; exit 1; }
[[ -f /root/adaps-env.sh ]] && source /root/adaps-env.sh  # ccache, where there is one

say "configure $BUILD (ADAPS_CUDA=ON, Release, architectures $ARCH, nvcc $NVCC)"
if ! cmake -S . -B "$BUILD" -G Ninja -DADAPS_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
     -DCMAKE_CUDA_COMPILER="$NVCC" -DADAPS_CUDA_ARCHITECTURES="$ARCH" \
     -DADAPS_CUDA_PTXAS_VERBOSE=ON \
     -DADAPS_BUILD_BENCH=OFF -DADAPS_BUILD_TESTS=ON >"$BUILD.configure.log" 2>&1; then
  tail -30 "$BUILD.configure.log"
  say "FAIL: configure (log: $BUILD.configure.log)"
  exit 1
fi
# The kernels' tests and benchmark; the worker library's device path on the GPU
# (worker_device_gpu_test); and for the end-to-end run (bench/gpu/torch_e2e.py) the cluster's
# executables and libadaps_worker.so, which adaps.torch's module is compiled against there.
BINS=(cuda_compressor_test compressor_conformance_test adaps_gpu_bench worker_device_gpu_test
      adaps-scheduler adaps-server)
TARGETS=("${BINS[@]}" adaps_worker_shared)
# The .cu objects are always recompiled (ccache replays ptxas's report), so that the build log
# holds ptxas's resource usage of every kernel.
rm -f "$BUILD"/common/cuda/CMakeFiles/adaps_cuda.dir/*.cu.o
say "build ${TARGETS[*]} (-j$JOBS)"
if ! ninja -C "$BUILD" -j"$JOBS" "${TARGETS[@]}" >"$BUILD.build.log" 2>&1; then
  tail -40 "$BUILD.build.log"
  say "FAIL: build (log: $BUILD.build.log)"
  exit 1
fi
# One line per kernel: "<entry> <arch>: N registers, M bytes smem, S bytes spill stores, L loads".
PTXAS=$(perl -ne '
  if (/Compiling entry function .(\S+). for .(sm_\d+)/) { ($name, $arch) = ($1, $2); }
  elsif (/(\d+) bytes spill stores, (\d+) bytes spill loads/) { ($st, $ld) = ($1, $2); }
  elsif (/ptxas info\s*: Used (\d+) registers/) {
    $regs = $1; $smem = /(\d+) bytes smem/ ? $1 : 0;
    print "$name $arch: $regs registers, $smem bytes smem, $st bytes spill stores, $ld loads\n";
  }' "$BUILD.build.log" | c++filt)
[[ -n "$PTXAS" ]] || { say "FAIL: no ptxas report in $BUILD.build.log"; exit 1; }

rm -rf "$CARRY"
mkdir -p "$CARRY/bin" "$CARRY/lib"
echo "$PTXAS" >"$CARRY/ptxas.txt"
say "ptxas: $(wc -l <"$CARRY/ptxas.txt") kernels, registers $(grep -oE '[0-9]+ registers' "$CARRY/ptxas.txt" | cut -d' ' -f1 | sort -n | uniq | tr '\n' ' ')"
if grep -qE ' [1-9][0-9]* bytes spill stores| [1-9][0-9]* loads$' "$CARRY/ptxas.txt"; then
  grep -E ' [1-9][0-9]* bytes spill stores| [1-9][0-9]* loads$' "$CARRY/ptxas.txt"
  say "FAIL: a kernel spills registers ($CARRY/ptxas.txt)"
  exit 1
fi
for t in "${BINS[@]}"; do
  f=$(find "$BUILD" -name "$t" -type f -perm -u+x | head -1)
  [[ -n "$f" ]] || { say "FAIL: $t not built"; exit 1; }
  cp "$f" "$CARRY/bin/$t"
  strip --strip-debug "$CARRY/bin/$t"
done
# libadaps_worker.so under its soname, and the headers the Python module is compiled with
# there (the library's public header travels with the working tree; Abseil's does not).
lib=$(find "$BUILD/worker" -maxdepth 1 -name 'libadaps_worker.so.*' -type f | head -1)
[[ -n "$lib" ]] || { say "FAIL: libadaps_worker.so not built"; exit 1; }
soname=$(objdump -p "$lib" | awk '$1 == "SONAME" {print $2}')
cp "$lib" "$CARRY/lib/${soname:-libadaps_worker.so.0}"
strip --strip-debug "$CARRY/lib/${soname:-libadaps_worker.so.0}"
mkdir -p "$CARRY/include"
cp -r /usr/include/absl "$CARRY/include/absl"
# Shared libraries: everything ldd resolves except the C library family (libc, libm, libdl,
# libpthread, librt, the loader, vdso) and the driver's libcuda / libnvidia-*.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libcuda\.so|libnvidia)'
for b in "$CARRY"/bin/* "$CARRY"/lib/libadaps_worker.so*; do
  ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
    [[ "$name" =~ $skip ]] && continue
    [[ -e "$CARRY/lib/$name" ]] || cp -L "$path" "$CARRY/lib/$name"
  done
done
missing=$(LD_LIBRARY_PATH="$CARRY/lib" ldd "$CARRY"/bin/* "$CARRY"/lib/libadaps_worker.so* \
          | grep "not found" || true)
[[ -z "$missing" ]] || { echo "$missing"; say "FAIL: unresolved libraries"; exit 1; }

bytes=$(du -sb "$CARRY" | cut -f1)
{
  echo "built: $(date -u +%FT%TZ) on $(hostname)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "nvcc: $("$NVCC" --version | tail -1)"
  echo "architectures: $ARCH"
  echo "bytes: $bytes"
  (cd "$CARRY" && find bin lib -type f -printf '%s %p\n' | sort -k2)
} >"$CARRY/MANIFEST"
say "$CARRY: $(( bytes / 1024 / 1024 )) MiB ($bytes bytes), $(ls "$CARRY/lib" | wc -l) libraries"
if (( bytes > 48 * 1024 * 1024 )); then
  say "FAIL: $CARRY is over 48 MiB (the device tool carries 64 MiB at most)"
  exit 1
fi
say "ready: run bench/gpu-check.sh on the GPU machine with $CARRY carried (docs/gpu.md)"
