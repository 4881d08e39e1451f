#!/usr/bin/env bash
# The main job, in one command: sets up (Debian packages), builds, starts a local cluster
# (1 scheduler, 2 servers, 4 workers) and trains the Fashion-MNIST MLP with AdaComp for a
# few epochs, then prints the final test accuracy and the bytes saved against dense.
#
# Arguments go to every adaps-worker and override the defaults below, e.g.
#   bash deploy/run-local.sh --compressor=dense
#   bash deploy/run-local.sh --model=cnn --epochs=2
# ADAPS_SERVER_ARGS overrides the servers' flags (default: plain SGD with recompressed pulls
# at bin size 100; the momentum 0.9 runs on the workers as DGC's momentum correction,
# --local_momentum: with servers running momentum themselves, pass --local_momentum=0).
# These defaults close the accuracy gap to dense/dense (docs/accuracy.md, "The main command").
set -euo pipefail
cd "$(dirname "$0")/.."
echo "run-local: setting up and building (log: /tmp/adaps-build.log)"
bash deploy/build.sh adaps-scheduler adaps-server adaps-worker adaps_python >/tmp/adaps-build.log 2>&1 || { tail -50 /tmp/adaps-build.log; exit 1; }
exec bash deploy/launch.sh --servers 2 --workers 4 --bin "${ADAPS_BUILD_DIR:-build}" \
  --scheduler-args "--log_level=warn" \
  --server-args "${ADAPS_SERVER_ARGS:---optimizer=sgd --pull_bin_size=100 --log_level=warn}" \
  -- --mode=train --model=mlp --compressor=adacomp --pull=recompressed --local_momentum=0.9 \
  --compress_bias --bin_size_bias=100 --epochs=3 --log_level=warn "$@"
