#!/usr/bin/env bash
# Makes the base images deploy/Dockerfile starts from, debian:12 and debian:12-slim, when
# the Docker engine does not have them: first by pulling them (a registry may be reachable),
# else from the Debian archive this machine's apt uses, with debootstrap (minbase variant,
# several minutes) and `docker import`. Both tags then name the same image. Does nothing
# when both exist; when only one exists the other is tagged from it.
#
#   deploy/docker-base.sh
#     ADAPS_DEBIAN_MIRROR  the archive to bootstrap from (default: the first bookworm
#                          archive in /etc/apt/sources.list(.d), else deb.debian.org)
#     ADAPS_BASE_PULL      0 skips the pull attempt (default 1; it gives up after 60 s)
# Exit status: 0 when both tags exist at the end; 1 with the reason otherwise.
set -euo pipefail
say() { echo "docker-base: $*"; }
die() { echo "docker-base: FAILED: $*" >&2; exit 1; }
tags=(debian:12 debian:12-slim)

command -v docker >/dev/null || die "no docker command (Debian: apt-get install docker.io)"
docker info >/dev/null 2>&1 || die "the Docker engine does not answer (start it: dockerd &)"
have() { docker image inspect "$1" >/dev/null 2>&1; }

missing=()
for t in "${tags[@]}"; do have "$t" || missing+=("$t"); done
if [[ ${#missing[@]} -eq 0 ]]; then
  say "${tags[*]} present; nothing to do"
  exit 0
fi
if [[ ${#missing[@]} -eq 1 ]]; then
  for t in "${tags[@]}"; do [[ $t == "${missing[0]}" ]] || from=$t; done
  docker tag "$from" "${missing[0]}" || die "docker tag $from ${missing[0]} failed"
  say "tagged ${missing[0]} from $from"
  exit 0
fi

if [[ ${ADAPS_BASE_PULL:-1} != 0 ]]; then
  say "pulling ${tags[*]} (at most 60 s each)"
  pulled=1
  for t in "${tags[@]}"; do
    timeout 60 docker pull -q "$t" >/dev/null 2>&1 || { pulled=0; break; }
  done
  if [[ $pulled == 1 ]]; then say "pulled ${tags[*]}"; exit 0; fi
  say "cannot pull them (no registry reachable); building from the Debian archive"
fi

[[ $(id -u) -eq 0 ]] || die "debootstrap needs root"
command -v debootstrap >/dev/null || die "no debootstrap (Debian: apt-get install debootstrap)"
mirror=${ADAPS_DEBIAN_MIRROR:-}
if [[ -z $mirror ]]; then
  # One-line ("deb URL bookworm main") and deb822 ("URIs: URL" + "Suites: bookworm ...")
  # sources; the security archive is no base archive.
  shopt -s nullglob
  lists=(/etc/apt/sources.list /etc/apt/sources.list.d/*.list) sources=(/etc/apt/sources.list.d/*.sources)
  mirror=$(cat /dev/null "${lists[@]}" 2>/dev/null |
    awk '$1 == "deb" && $3 == "bookworm" && $2 !~ /security/ { print $2; exit }' || true)
  if [[ -z $mirror ]]; then
    mirror=$(cat /dev/null "${sources[@]}" | awk '
      /^URIs:/ { uri = $2 } /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == "bookworm") ok = 1 }
      /^$/ { if (ok && uri !~ /security/ && found == "") found = uri; uri = ""; ok = 0 }
      END { if (ok && uri !~ /security/ && found == "") found = uri; print found }' || true)
  fi
  mirror=${mirror:-http://deb.debian.org/debian}
fi
root=$(mktemp -d /var/tmp/adaps-debian12.XXXXXX)
trap 'rm -rf "$root"' EXIT
log=$root.log
say "debootstrap --variant=minbase bookworm from $mirror (several minutes; log: $log)"
start=$(date +%s)
if ! debootstrap --variant=minbase bookworm "$root" "$mirror" >"$log" 2>&1; then
  tail -20 "$log" >&2
  die "debootstrap from $mirror failed (log: $log)"
fi
# Docker's debian images keep no apt lists or caches; the Dockerfile runs apt-get update.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
tar -C "$root" -c . | docker import -c 'CMD ["bash"]' -m "debootstrap minbase bookworm" \
  - "${tags[0]}" >/dev/null || die "docker import failed"
docker tag "${tags[0]}" "${tags[1]}" || die "docker tag ${tags[1]} failed"
rm -f "$log"
say "made ${tags[*]} from $mirror in $(( $(date +%s) - start ))s"
