#!/usr/bin/env bash
# Compiles adaps's Python module (worker/python/adaps_module.cc) on a machine that has a
# compiler, pybind11 and the Python headers but none of adaps's build dependencies (the GPU
# machine): against the carried libadaps_worker.so (which holds everything else, the device
# path included) and the carried Abseil headers. bench/gpu-check.sh runs it.
#
#   bash bench/gpu/build-module.sh CARRY OUT_DIR [PYTHON]
#
# CARRY: the folder bench/gpu-prepare.sh made (lib/libadaps_worker.so.*, lib/libabsl_*,
# include/absl); OUT_DIR/adaps/ receives the package (its .py files and _core), to put on
# PYTHONPATH. The module finds the carried libraries by its RUNPATH (no LD_LIBRARY_PATH, so
# that the Python's own libstdc++ stays the one loaded). Exit 0 built; 4 no compiler, pybind11
# or Python headers on this machine (said why); 1 the compile failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
CARRY=$(cd "${1:?CARRY}" && pwd)
OUT_DIR=${2:?OUT_DIR}
PY=${3:-python3}
CXX=${CXX:-$(command -v g++ || command -v c++ || command -v clang++ || true)}
[[ -n "$CXX" ]] || { echo "build-module: no C++ compiler (g++, c++, clang++)"; exit 4; }
flags=$("$PY" - <<'PY' 2>/dev/null
import os, sysconfig
import pybind11
inc = sysconfig.get_paths()["include"]
if not os.path.exists(os.path.join(inc, "Python.h")):
    raise SystemExit(1)
print("-I%s -I%s %s" % (pybind11.get_include(), inc, sysconfig.get_config_var("EXT_SUFFIX")))
PY
) || { echo "build-module: $PY has no pybind11 or no Python.h"; exit 4; }
read -r inc_pb inc_py suffix <<<"$flags"
mkdir -p "$OUT_DIR/adaps"
cp worker/python/adaps/*.py "$OUT_DIR/adaps/"
worker_lib=$(ls "$CARRY"/lib/libadaps_worker.so.* | head -1)
absl_libs=$(ls "$CARRY"/lib/libabsl_*.so* 2>/dev/null || ls /usr/lib/x86_64-linux-gnu/libabsl_*.so.* 2>/dev/null)
# shellcheck disable=SC2086
"$CXX" -O2 -std=c++17 -shared -fPIC -fvisibility=hidden -DADAPS_WORKER_WITH_CUDA \
  "$inc_pb" "$inc_py" -I"$CARRY/include" -Iworker/include \
  worker/python/adaps_module.cc -o "$OUT_DIR/adaps/_core$suffix" \
  -Wl,--as-needed "$worker_lib" $absl_libs -Wl,-rpath,"$CARRY/lib" || exit 1
echo "build-module: $OUT_DIR/adaps/_core$suffix"
