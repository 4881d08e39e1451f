#!/usr/bin/env bash
# The main job, in one command: sets up (Debian packages), builds, starts a local cluster
# (1 scheduler, 2 servers, 4 workers) and trains the Fashion-MNIST MLP with AdaComp for a
# few epochs, then prints the final test accuracy and the bytes saved against dense.
#
# Arguments go to every adaps-worker and override the defaults below, e.g.
#   bash deploy/run-local.sh --compressor=dense
#   bash deploy/run-local.sh --model=cnn --epochs=2
# The training recipe (the servers' and the workers' flags) is deploy/recipe.flags, which the
# image's entrypoint also applies (docker-compose.yml, deploy/k8s): plain SGD on the servers
# with recompressed pulls at bin size 100, the momentum 0.9 on the workers as DGC's momentum
# correction (--local_momentum), biases compressed at bin size 100. These close the accuracy
# gap to dense/dense (docs/accuracy.md, "The main command").
# ADAPS_SERVER_ARGS replaces the servers' flags (with servers running momentum themselves,
# pass --local_momentum=0 to the workers).
set -euo pipefail
cd "$(dirname "$0")/.."
recipe() {
  local flags
  flags=$(sed -n "s/^$1:[[:space:]]*//p" deploy/recipe.flags)
  [[ -n $flags ]] || { echo "run-local: deploy/recipe.flags has no '$1:' line" >&2; exit 2; }
  echo "$flags"
}
server_recipe=$(recipe server)
worker_recipe=$(recipe worker)
echo "run-local: setting up and building (log: /tmp/adaps-build.log)"
bash deploy/build.sh adaps-scheduler adaps-server adaps-worker >/tmp/adaps-build.log 2>&1 || { tail -50 /tmp/adaps-build.log; exit 1; }
# shellcheck disable=SC2086  # the recipe is words
exec bash deploy/launch.sh --servers 2 --workers 4 --bin "${ADAPS_BUILD_DIR:-build}" \
  --scheduler-args "--log_level=warn" \
  --server-args "${ADAPS_SERVER_ARGS:-$server_recipe --log_level=warn}" \
  -- $worker_recipe --log_level=warn "$@"
