#!/usr/bin/env bash
# The build steps of the Dockerfile's build stage, as a script so that they can be checked
# without a Docker engine (tests/deploy/compose_test.sh runs them):
#   install the build packages, configure a release build without tests, build, install
#   into PREFIX.
#   deploy/docker-build.sh BUILD_DIR PREFIX
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:?build dir}
prefix=${2:?install prefix}
bash deploy/install-deps.sh build
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DADAPS_CUDA=OFF \
  -DADAPS_BUILD_TESTS=OFF -DADAPS_BUILD_BENCH=OFF
ninja -C "$build_dir" adaps-scheduler adaps-server adaps-worker adaps-keygen adaps_worker_shared adaps_python
cmake --install "$build_dir" --prefix "$prefix"
