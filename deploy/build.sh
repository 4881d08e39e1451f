#!/usr/bin/env bash
# Configures and builds adaps into ${ADAPS_BUILD_DIR:-build}. Extra arguments go to cmake.
# Installs missing Debian packages first (see deploy/install-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
build_dir=${ADAPS_BUILD_DIR:-build}
jobs=${ADAPS_JOBS:-$(nproc)}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >"$build_dir.cmake.log" 2>&1 || {
  cat "$build_dir.cmake.log" >&2
  echo "build: cmake configure failed (log above)" >&2
  exit 1
}
grep -E '^-- adaps:' "$build_dir.cmake.log" || true
ninja -C "$build_dir" -j "$jobs"
