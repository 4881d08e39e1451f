#!/usr/bin/env bash
# The main job, in one command: sets up (Debian packages), builds, and runs adaps locally.
# For now this is the codec demo: it compresses a realistic gradient stream with AdaComp and
# prints what it saved. Arguments are passed to the demo (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/build.sh >/tmp/adaps-build.log 2>&1 || { tail -50 /tmp/adaps-build.log; exit 1; }
exec "${ADAPS_BUILD_DIR:-build}/bench/adaps-codec-demo" "$@"
