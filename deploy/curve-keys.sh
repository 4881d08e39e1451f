#!/usr/bin/env bash
# Makes a directory of CURVE keys for an encrypted adaps cluster, in the layout every
# deployment reads (docker-compose.curve.yml, adaps.sbatch --curve, the Kubernetes Secret of
# deploy/k8s/components/curve):
#   server.key  the cluster's server pair (the scheduler and the servers serve with it)
#   server.pub  its public key (the workers check the servers against it)
#   client.key  the pair every server and worker connects with
#   allowed_clients  the public keys admitted (client.pub; append more .pub files to admit more)
# Secrets (.key) are mode 0600. Existing keys are never overwritten.
#
#   deploy/curve-keys.sh DIR                 keys made with adaps-keygen from ADAPS_KEYGEN, the
#                                            PATH or build/scheduler/, owned by the caller
#   deploy/curve-keys.sh DIR --image IMAGE   keys made inside the image (its adaps-keygen) and
#                                            owned by its user, so that containers running
#                                            as that user read the mounted keys (compose)
set -euo pipefail
me=curve-keys
die() { echo "$me: $*" >&2; exit "${2:-1}"; }
dir=${1:-}
[[ -n $dir && $dir != -* ]] || die "usage: deploy/curve-keys.sh DIR [--image IMAGE]" 2
shift
image=""
if [[ $# -gt 0 ]]; then
  [[ $1 == --image && $# -eq 2 ]] || die "usage: deploy/curve-keys.sh DIR [--image IMAGE]" 2
  image=$2
fi
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
for f in server.key server.pub client.key client.pub allowed_clients; do
  [[ ! -e $dir/$f ]] || die "$dir/$f exists: not overwriting keys (use an empty directory)"
done
if [[ -n $image ]]; then
  command -v docker >/dev/null || die "no docker command"
  # As root in the container (the mounted directory is the caller's), then handed to the
  # image's user; the host keeps read access as root.
  docker run --rm --user 0 --entrypoint sh -v "$dir:/keys" -w /keys "$image" -c \
    "adaps-keygen server >/dev/null && adaps-keygen client >/dev/null && cp client.pub allowed_clients &&
     chown \$(id -u adaps):\$(id -g adaps) server.key server.pub client.key client.pub allowed_clients" ||
    die "cannot make the keys with $image's adaps-keygen"
else
  repo=$(cd "$(dirname "$0")/.." && pwd)
  keygen=${ADAPS_KEYGEN:-$(command -v adaps-keygen || echo "$repo/build/scheduler/adaps-keygen")}
  [[ -x $keygen ]] || die "adaps-keygen not found (build it: bash deploy/build.sh adaps-keygen; or set ADAPS_KEYGEN)"
  (cd "$dir" && "$keygen" server >/dev/null && "$keygen" client >/dev/null && cp client.pub allowed_clients) ||
    die "adaps-keygen failed in $dir"
fi
echo "$me: $dir: server.key server.pub client.key client.pub allowed_clients"
