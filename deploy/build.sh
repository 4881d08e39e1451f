#!/usr/bin/env bash
# Configures and builds adaps into ${ADAPS_BUILD_DIR:-build}.
#   bash deploy/build.sh                      everything (every test, fuzzer replay, benchmark)
#   bash deploy/build.sh adaps-server ...     only these ninja targets (and what they need)
# Arguments that start with '-' go to cmake (e.g. -DADAPS_CUDA=OFF), the others to ninja.
# Installs missing Debian packages first (see deploy/install-deps.sh).
# deploy/run-local.sh and tests/run-all.sh both build through this script with the same cmake
# arguments, so the second reuses what the first compiled (cmake/Dependencies.cmake keeps the
# compile commands of a reconfigure equal to the first configure's). Extra -D arguments stay
# in the build directory's cache, and so change what both build afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
build_dir=${ADAPS_BUILD_DIR:-build}
jobs=${ADAPS_JOBS:-$(nproc)}
cmake_args=()
targets=()
for arg in "$@"; do
  if [[ $arg == -* ]]; then cmake_args+=("$arg"); else targets+=("$arg"); fi
done
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${cmake_args[@]}" \
  >"$build_dir.cmake.log" 2>&1 || {
  cat "$build_dir.cmake.log" >&2
  echo "build: cmake configure failed (log above)" >&2
  exit 1
}
grep -E '^-- adaps:' "$build_dir.cmake.log" || true
ninja -C "$build_dir" -j "$jobs" "${targets[@]}"
