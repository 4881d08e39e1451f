#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang-14 (ASan + UBSan) and runs each for
# a bounded time, starting from the committed corpus. A crash fails the script and leaves
# the input under build-fuzz/crashes/: fix the bug, then commit the input to
# tests/fuzz/corpus/<target>/ so the regression test replays it in every build.
#
#   ADAPS_FUZZ_SECONDS  seconds per target (default 20)
#   ADAPS_FUZZ_SEED     libFuzzer seed (default 1, so that runs repeat as far as the
#                       targets' threads allow; 0 lets libFuzzer choose)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${ADAPS_FUZZ_SECONDS:-20}
build_dir=build-fuzz
bash deploy/install-deps.sh >/dev/null
CC=clang-14 CXX=clang++-14 cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DADAPS_FUZZ=ON -DADAPS_CUDA=OFF -DADAPS_BUILD_BENCH=OFF >"$build_dir.cmake.log" 2>&1 ||
  { cat "$build_dir.cmake.log"; exit 1; }
targets=$(ninja -C "$build_dir" -t targets all | sed -n 's/^\(fuzz_[a-z_]*\): phony$/\1/p' |
          grep -v -e _regression -e make_seeds | sort -u)
[[ -n "$targets" ]] || { echo "run-fuzz: no fuzz targets found" >&2; exit 1; }
# shellcheck disable=SC2086
ninja -C "$build_dir" $targets
mkdir -p "$build_dir/crashes"
for t in $targets; do
  name=${t#fuzz_}
  work=$(mktemp -d)
  cp -r "tests/fuzz/corpus/$name/." "$work/" 2>/dev/null || true
  echo "== fuzz $name for ${seconds}s"
  if ! "$build_dir/tests/fuzz/$t" -max_total_time="$seconds" -seed="${ADAPS_FUZZ_SEED:-1}" -print_final_stats=1 \
        -artifact_prefix="$build_dir/crashes/$name-" "$work" 2>"$build_dir/$name.log"; then
    tail -40 "$build_dir/$name.log"
    echo "run-fuzz: $name crashed; input saved under $build_dir/crashes/" >&2
    exit 1
  fi
  grep -E 'stat::number_of_executed_units|stat::peak_rss_mb' "$build_dir/$name.log" | sed "s/^/  $name /"
  rm -rf "$work"
done
echo "== fuzzing passed"
