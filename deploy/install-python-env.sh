#!/usr/bin/env bash
# Makes the virtual environment in which the tests run adaps.torch under the Python package
# index's torch 2.x, Lightning, Transformers, Accelerate and PEFT (the versions in
# deploy/python-venv-requirements.txt), beside Debian's torch 1.13 that /usr/bin/python3 has.
#
#   bash deploy/install-python-env.sh        prints the environment's python on its last line
#
#   ADAPS_VENV   where (default /opt/adaps/venv-torch2). It is made from Debian's
#                /usr/bin/python3, the interpreter the adaps module is built for.
#
# Idempotent: when the environment holds exactly the pinned versions it does nothing (no
# network). The index's Linux torch brings its CUDA libraries: about 5.7 GB on disk, 72 s to
# install here (2026-12-05, the index reached at about 140 MB/s).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${ADAPS_VENV:-/opt/adaps/venv-torch2}
req=deploy/python-venv-requirements.txt
stamp="$venv/.adaps-requirements"

if [[ -x "$venv/bin/python" && -f "$stamp" ]] && cmp -s "$req" "$stamp"; then
  echo "install-python-env: $venv has the pinned packages" >&2
  echo "$venv/bin/python"
  exit 0
fi
if ! /usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null; then
  echo "install-python-env: Debian's python3-venv is missing (apt-get install python3-venv)" >&2
  exit 1
fi
echo "install-python-env: installing $(grep -v '^#' "$req" | tr '\n' ' ')into $venv" >&2
start=$(date +%s)
mkdir -p "$(dirname "$venv")"
/usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req" >&2
# The stamp last: an install cut off half way is redone next time.
cp "$req" "$stamp"
echo "install-python-env: done in $(( $(date +%s) - start ))s ($(du -sh "$venv" | cut -f1))" >&2
echo "$venv/bin/python"
