#!/usr/bin/env bash
# Installs adaps from a build tree into a temporary prefix, builds examples/cpp against that
# prefix only (find_package(adaps) and pkg-config), and runs two copies of the example
# against the installed adaps-scheduler and adaps-server on loopback (OS-assigned port).
# Usage: test_installed.sh <adaps build dir> <adaps source dir>
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/adaps-install-test.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; for f in "$tmp"/*.log; do echo "== $f" >&2; cat "$f" >&2; done; exit 1; }

prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" > "$tmp/install.log" || fail "cmake --install"
libdir=$(ls -d "$prefix"/lib*/ | head -1)
[[ -f $libdir/libadaps_worker.so ]] || fail "no libadaps_worker.so in $libdir"
[[ -f $prefix/include/adaps/worker.h && -f $prefix/include/adaps/adaps_c.h ]] || fail "headers"
# The installed header must not need ZeroMQ, FlatBuffers, spdlog or CUDA headers.
if grep -E '#include [<"](zmq|flatbuffers|spdlog|cuda)' "$prefix"/include/adaps/*.h; then
  fail "public header includes a private dependency"
fi
# Only the public API is exported: no ZeroMQ/spdlog wrappers or internals leak out.
if nm -DC --defined-only "$libdir/libadaps_worker.so" | grep -E ' (T|W) adaps::(Transport|Server|Scheduler|.*Compressor)' ; then
  fail "internal symbols exported"
fi

cmake -S "$src/examples/cpp" -B "$tmp/ex" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  > "$tmp/configure.log" 2>&1 || fail "configure the example"
cmake --build "$tmp/ex" > "$tmp/build.log" 2>&1 || fail "build the example"
# pkg-config alone is enough too.
c++ -std=c++17 "$src/examples/cpp/push_pull.cc" -o "$tmp/push_pull_pc" \
  $(PKG_CONFIG_PATH=$libdir/pkgconfig pkg-config --cflags --libs adaps) -Wl,-rpath,"$libdir" \
  > "$tmp/pkgconfig.log" 2>&1 || fail "build the example with pkg-config"

"$prefix/bin/adaps-scheduler" --num_servers=1 --num_workers=2 --port_file="$tmp/port" \
  --log_level=warn > "$tmp/scheduler.log" 2>&1 & pids+=($!)
for _ in $(seq 200); do [[ -s $tmp/port ]] && break; sleep 0.05; done
[[ -s $tmp/port ]] || fail "scheduler port file"
addr=tcp://127.0.0.1:$(cat "$tmp/port")
"$prefix/bin/adaps-server" --scheduler="$addr" --log_level=warn > "$tmp/server.log" 2>&1 &
pids+=($!)
"$tmp/ex/adaps-example-push-pull" "$addr" 5 > "$tmp/w0.log" 2>&1 & w0=$!
"$tmp/push_pull_pc" "$addr" 5 > "$tmp/w1.log" 2>&1 & w1=$!
pids+=("$w0" "$w1")
wait "$w0" || fail "worker 0"
wait "$w1" || fail "worker 1"
cat "$tmp/w0.log" "$tmp/w1.log"
# SGD, lr 0.5, gradient w - t from w = 0: w = t * (1 - 0.5^5); t[7] = 8 -> 7.75.
grep -q "w = 0.9688 1.9375 .* 7.7500" "$tmp/w0.log" || fail "unexpected parameters"
grep -q "w = 0.9688 1.9375 .* 7.7500" "$tmp/w1.log" || fail "unexpected parameters"
echo "PASS: installed package builds the example and it trains against a local cluster"
