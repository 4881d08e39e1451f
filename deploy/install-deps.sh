#!/usr/bin/env bash
# Installs the Debian 12 packages adaps needs to build, test and run. Idempotent: when every
# package is already installed it does nothing (no apt-get update, no network).
set -euo pipefail

# build: what compiling adaps (libraries, executables, Python module) needs; the Dockerfile's
# build stage installs only these. all (default): also tests, benchmarks, fuzzing, the
# accuracy study and the deployment checks (docker.io and debootstrap: the Docker step of
# tests/run-all.sh, which makes its base images with deploy/docker-base.sh; slurm-wlm and
# munge: the Slurm step, tests/deploy/slurm_test.sh, a Slurm cluster of network namespaces).
BUILD_PACKAGES=(
  build-essential cmake pkg-config ninja-build
  libzmq3-dev cppzmq-dev
  libflatbuffers-dev flatbuffers-compiler
  libabsl-dev libspdlog-dev libeigen3-dev zlib1g-dev prometheus-cpp-dev
  python3 python3-dev python3-numpy pybind11-dev python3-pybind11
  # OpenBLAS takes libblas.so.3 over from the reference BLAS that numpy and Debian's torch
  # would otherwise run on (one core: ~1-5 GFLOP/s against ~35-190; adaps.blas records which).
  libopenblas0-pthread
)
TEST_PACKAGES=(
  libgtest-dev libgmock-dev libbenchmark-dev
  dataset-fashion-mnist
  python3-pytest python3-matplotlib python3-torch python3-venv
  clang-14 libclang-rt-14-dev
  docker-compose iproute2 python3-zmq
  docker.io debootstrap
  slurm-wlm munge
)
case "${1:-all}" in
  build) PACKAGES=("${BUILD_PACKAGES[@]}") ;;
  all) PACKAGES=("${BUILD_PACKAGES[@]}" "${TEST_PACKAGES[@]}") ;;
  *) echo "usage: install-deps.sh [build|all]" >&2; exit 2 ;;
esac
if [[ "${ADAPS_DEPS_EXTRA:-}" != "" ]]; then
  read -r -a extra <<<"${ADAPS_DEPS_EXTRA}"
  PACKAGES+=("${extra[@]}")
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps: missing packages: ${missing[*]}" >&2
  echo "install-deps: run as root (or install them with sudo apt-get install)" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
