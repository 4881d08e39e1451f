#!/usr/bin/env bash
# Builds adaps with sanitizers and runs the tests under them:
#   build-asan: AddressSanitizer + UndefinedBehaviorSanitizer, unit and integration tests;
#   build-tsan: ThreadSanitizer over the whole system (transport, server, scheduler, worker,
#               the real-process cluster and fault tests, the trainers), against abseil and
#               libzmq built with -fsanitize=thread from Debian's sources by
#               tests/tsan-deps.sh: uninstrumented, every absl::Mutex and every message
#               handed through ZeroMQ's lock-free pipes would look like a race.
#               ADAPS_TSAN_REGEX narrows the tests.
# Usage: tests/run-sanitizers.sh [asan|tsan|all|ci]   (default all)
#   ci: the subset tests/run-all.sh runs within CI's time budget: ASan+UBSan over the codec,
#       messages, transport, server, scheduler, C API and the real-process cluster, fault,
#       hostile-input, CURVE and load tests, plus the fuzz corpora; TSan over the suites
#       that run in one process (codec, transport, server, worker, scheduler, in-process
#       clusters), not the real-process ones. Left out there (run them with 'all'): the trainer suites
#       (Eigen is slow to build instrumented, and their end-to-end runs take minutes under
#       TSan), the Python and installed-package tests (they load the libraries into
#       uninstrumented interpreters or toolchains) and the deployment tests.
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-all}
jobs=${ADAPS_JOBS:-$(nproc)}
asan_targets=() tsan_targets=() asan_exclude=${ADAPS_ASAN_EXCLUDE:-^$}
# Never under TSan: tests that load the libraries into uninstrumented interpreters or
# toolchains, the deployments, and the checks of the docs.
tsan_exclude='NOT_BUILT|pytest|python_|deploy_|cpp_example|slurm|docs_|house_|ownership_'

if [[ $which == ci ]]; then
  asan_targets=(adaps-scheduler adaps-server adaps-worker adacomp_test compressor_test
                wire_codec_test messages_test scheduler_split_test server_inproc_test
                checkpoint_test worker_c_api_test cluster_integration_test hostile_client_test
                fault_test load_test curve_test fuzz_wire_codec_regression
                fuzz_messages_regression cluster_client_test transport_test worker_test
                shard_test optimizer_test compressor_two_phase_test authorization_test)
  # TSan in CI: the suites whose threads run in one process (codec, transport, server,
  # worker, scheduler, in-process clusters). The real-process integration suites run 5-20x
  # slower under TSan, past their dead timeouts on a loaded CI host (servers declared dead
  # in Elastic/Resume cases); 'tsan' runs them.
  tsan_targets=(adacomp_test compressor_test wire_codec_test fuzz_wire_codec_regression
                messages_test transport_test shard_test optimizer_test
                compressor_two_phase_test server_inproc_test engine_test worker_test
                worker_fusion_test worker_sparse_pull_test worker_local_steps_test
                worker_pipeline_test worker_c_api_test cluster_client_test
                scheduler_split_test fuzz_messages_regression)
  # Tests whose executables the subset does not build.
  asan_exclude='NOT_BUILT|pytest|python_|deploy_|cpp_example|Train|trainer|Cuda'
  tsan_exclude="$tsan_exclude|Train|trainer|Cuda"
fi

build() {  # build_dir sanitize targets...   (ADAPS_SAN_CMAKE_ARGS: more cmake arguments)
  local dir=$1 san=$2
  shift 2
  # -O1 -g1: the usual optimisation for sanitizers, and quicker to build than -O2 -g.
  # shellcheck disable=SC2086
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
    -DADAPS_SANITIZE="$san" ${ADAPS_SAN_CMAKE_ARGS:-} \
    -DADAPS_CUDA=OFF -DADAPS_BUILD_BENCH=OFF >"$dir.cmake.log" 2>&1 || { cat "$dir.cmake.log"; exit 1; }
  ninja -C "$dir" -j "$jobs" "$@"
}

if [[ $which == asan || $which == all || $which == ci ]]; then
  echo "== sanitizers: address,undefined"
  build build-asan address,undefined "${asan_targets[@]}"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j 2 --timeout 600 -L 'unit|integration' \
      -E "$asan_exclude"
fi
if [[ $which == tsan || $which == all || $which == ci ]]; then
  echo "== sanitizers: thread"
  deps=$(bash tests/tsan-deps.sh)
  # A build-tsan configured against Debian's abseil or libzmq (cached by pkg-config and
  # find_package) starts afresh.
  if [[ -f build-tsan/CMakeCache.txt ]] && ! grep -q "^absl_DIR.*=$deps/" build-tsan/CMakeCache.txt; then
    rm -rf build-tsan
  fi
  PKG_CONFIG_PATH=$deps/lib/pkgconfig ADAPS_SAN_CMAKE_ARGS="-Dabsl_DIR=$deps/lib/cmake/absl" \
    build build-tsan thread "${tsan_targets[@]}"
  # second_deadlock_stack: both stacks of a lock-order inversion. The tests are run from the
  # build directory's RPATH, so they load the instrumented abseil and libzmq.
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp \
    ctest --test-dir build-tsan --output-on-failure -j 2 --timeout 900 -L 'unit|integration' \
      -E "$tsan_exclude" ${ADAPS_TSAN_REGEX:+-R "$ADAPS_TSAN_REGEX"}
fi
