#!/usr/bin/env bash
# Installs the Debian 12 packages adaps needs to build, test and run. Idempotent: when every
# package is already installed it does nothing (no apt-get update, no network).
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config ninja-build
  libzmq3-dev cppzmq-dev
  libflatbuffers-dev flatbuffers-compiler
  libabsl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libspdlog-dev libeigen3-dev
  dataset-fashion-mnist
  python3 python3-numpy python3-pytest python3-matplotlib
)
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
