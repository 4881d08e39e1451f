#!/usr/bin/env bash
# Builds adaps with sanitizers and runs the tests under them:
#   build-asan: AddressSanitizer + UndefinedBehaviorSanitizer, unit and integration tests;
#   build-tsan: ThreadSanitizer over the codec suites only (ADAPS_TSAN_REGEX overrides):
#               Debian's abseil is not TSan-instrumented, so everything that synchronizes
#               through absl::Mutex (transport, roles) gives false reports; see
#               docs/reliability.md and tests/tsan.supp.
# Usage: tests/run-sanitizers.sh [asan|tsan|all]   (default all)
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-all}
jobs=${ADAPS_JOBS:-$(nproc)}

build() {  # build_dir sanitize targets...
  local dir=$1 san=$2
  shift 2
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DADAPS_SANITIZE="$san" \
    -DADAPS_CUDA=OFF -DADAPS_BUILD_BENCH=OFF >"$dir.cmake.log" 2>&1 || { cat "$dir.cmake.log"; exit 1; }
  ninja -C "$dir" -j "$jobs" "$@"
}

if [[ $which == asan || $which == all ]]; then
  echo "== sanitizers: address,undefined"
  build build-asan address,undefined
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j 2 --timeout 600 -L 'unit|integration' \
      -E "${ADAPS_ASAN_EXCLUDE:-^$}"
fi
if [[ $which == tsan || $which == all ]]; then
  echo "== sanitizers: thread"
  build build-tsan thread
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp \
    ctest --test-dir build-tsan --output-on-failure -j 2 --timeout 600 -L 'unit|integration' \
      -R "${ADAPS_TSAN_REGEX:-AdaComp|Compressor|Codec|Wire|TopK|Sign|Dense|fuzz_wire_codec}"
fi
