#!/usr/bin/env bash
# Simulated hosts on one machine: network namespaces joined by veth pairs to a bridge that
# lives in its own namespace (the machine's own network is never touched). Host i has the
# address ${SUBNET}.$((10 + i)) on eth0. Optionally every link is limited with a token
# bucket (tc tbf) in both directions, to stand in for a slow network between machines.
#
#   deploy/netns-hosts.sh up PREFIX N [RATE]    e.g. up adaps 7 100mbit
#   deploy/netns-hosts.sh down PREFIX
#   deploy/netns-hosts.sh addr PREFIX I         print host I's address
#   deploy/netns-hosts.sh check                 exit 0 when namespaces can be made here
#
# Run a command on host I with: ip netns exec PREFIX-hI COMMAND...
# Needs root (CAP_NET_ADMIN) and iproute2.
set -euo pipefail
SUBNET=${ADAPS_NETNS_SUBNET:-10.213.0}

die() { echo "netns-hosts: $*" >&2; exit 1; }

cmd=${1:-}
case "$cmd" in
  check)
    command -v ip >/dev/null || { echo "iproute2 (ip) is not installed"; exit 1; }
    [[ $(id -u) -eq 0 ]] || { echo "needs root to create network namespaces"; exit 1; }
    probe="adaps-probe-$$"
    ip netns add "$probe" 2>/dev/null || { echo "cannot create network namespaces here"; exit 1; }
    ok=0
    ip -n "$probe" link add br0 type bridge 2>/dev/null || ok=1
    ip netns del "$probe"
    [[ $ok -eq 0 ]] || { echo "cannot create a bridge inside a namespace here"; exit 1; }
    exit 0
    ;;
  up)
    prefix=${2:?prefix}; n=${3:?host count}; rate=${4:-}
    sw="$prefix-sw"
    ip netns add "$sw"
    ip -n "$sw" link set lo up
    ip -n "$sw" link add br0 type bridge
    ip -n "$sw" link set br0 up
    for ((i = 0; i < n; i++)); do
      h="$prefix-h$i"
      ip netns add "$h"
      ip -n "$h" link set lo up
      ip -n "$sw" link add "p$i" type veth peer name eth0 netns "$h"
      ip -n "$sw" link set "p$i" master br0 up
      ip -n "$h" addr add "$SUBNET.$((10 + i))/24" dev eth0
      ip -n "$h" link set eth0 up
      if [[ -n "$rate" ]]; then
        # Egress of the host and egress of its bridge port: both directions are limited.
        ip netns exec "$h" tc qdisc add dev eth0 root tbf rate "$rate" burst 64kb latency 50ms
        ip netns exec "$sw" tc qdisc add dev "p$i" root tbf rate "$rate" burst 64kb latency 50ms
      fi
    done
    ;;
  down)
    prefix=${2:?prefix}
    for ns in $(ip netns list | awk '{print $1}' | grep -E "^$prefix-(sw|h[0-9]+)$" || true); do
      ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
      ip netns del "$ns"
    done
    ;;
  addr)
    echo "$SUBNET.$((10 + ${3:?host index}))"
    ;;
  *)
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
    [[ -z "$cmd" ]] && exit 2
    die "unknown command '$cmd'"
    ;;
esac
