#!/usr/bin/env bash
# Builds the two libraries adaps synchronizes through, abseil (absl::Mutex, absl::Notification)
# and libzmq (its lock-free pipes between a socket's thread and its I/O thread), with
# -fsanitize=thread from Debian's own source packages, at the versions installed, into
# build-tsan-deps/install. ThreadSanitizer sees only what is instrumented: against Debian's
# binaries every lock and every message handed through ZeroMQ looks like a race.
# tests/run-sanitizers.sh tsan calls it (and builds adaps against the result); about a minute
# of compiling on 2 cores once the sources are here.
# Usage: tests/tsan-deps.sh [dir]   (default build-tsan-deps; prints the install prefix)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(realpath -m "${1:-build-tsan-deps}")
prefix=$dir/install
if [[ -f $prefix/.done ]]; then
  echo "$prefix"
  exit 0
fi
mkdir -p "$dir/src"
log=$dir/build.log
: >"$log"
say() { echo "tsan-deps: $*" >&2; }

# The source packages need a deb-src line; Debian's images ship only deb lines.
if ! grep -rqs '^Types:.*deb-src\|^deb-src ' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  if [[ $(id -u) -ne 0 ]]; then
    say "no deb-src entry in /etc/apt and not root: add one for bookworm (main) and rerun"
    exit 1
  fi
  say "adding /etc/apt/sources.list.d/adaps-deb-src.sources (Debian's archive, sources)"
  cat >/etc/apt/sources.list.d/adaps-deb-src.sources <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  apt-get update -qq >>"$log" 2>&1 || { say "apt-get update failed, see $log"; exit 1; }
fi

fetch() {  # source-package binary-package -> unpacked tree $dir/src/<source-package>
  local src=$1 bin=$2 version
  version=$(dpkg-query -W -f='${Version}' "$bin") || { say "$bin is not installed"; exit 1; }
  if [[ ! -d $dir/src/$src ]]; then
    say "fetching the source of $src $version"
    (cd "$dir/src" && apt-get source -q --download-only "$src=$version" >>"$log" 2>&1 &&
      dpkg-source -q -x "${src}_${version#*:}.dsc" "$src" >>"$log" 2>&1) ||
      { say "apt-get source $src=$version failed, see $log"; exit 1; }
  fi
}
fetch abseil libabsl-dev
fetch zeromq3 libzmq3-dev

flags="-fsanitize=thread -fno-omit-frame-pointer -O1 -g1"
jobs=${ADAPS_JOBS:-$(nproc)}
# Abseil as Debian builds it (C++17, shared), so that absl::optional and friends keep
# Debian's ABI and inline namespace.
say "building abseil with ThreadSanitizer"
cmake -S "$dir/src/abseil" -B "$dir/abseil" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$flags" -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread \
  -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON -DBUILD_TESTING=OFF \
  -DCMAKE_INSTALL_PREFIX="$prefix" >>"$log" 2>&1 &&
  ninja -C "$dir/abseil" -j "$jobs" install >>"$log" 2>&1 ||
  { say "abseil failed to build, see $log"; exit 1; }
# libzmq with CURVE (libsodium), as Debian's.
say "building libzmq with ThreadSanitizer"
cmake -S "$dir/src/zeromq3" -B "$dir/zeromq3" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="$flags" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$flags" \
  -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread -DWITH_LIBSODIUM=ON -DENABLE_CURVE=ON \
  -DENABLE_DRAFTS=OFF -DWITH_DOCS=OFF -DBUILD_TESTS=OFF -DBUILD_STATIC=OFF -DWITH_PERF_TOOL=OFF \
  -DCMAKE_INSTALL_PREFIX="$prefix" >>"$log" 2>&1 &&
  ninja -C "$dir/zeromq3" -j "$jobs" install >>"$log" 2>&1 ||
  { say "libzmq failed to build, see $log"; exit 1; }
touch "$prefix/.done"
echo "$prefix"
