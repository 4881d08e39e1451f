#!/usr/bin/env bash
# deploy/launch.sh --colocate: one server beside the workers on every host. Three "hosts"
# that are all this machine (127.0.0.1-3, loopback addresses; --via runs each command here,
# with the host's index in its environment): 4 workers land on hosts 1,2,3,1 and one server
# on each of the 3 hosts; the
# job (synthetic pushes with sparse pulls on mean servers) ends with exit 0. Without --hosts,
# one server per worker. --colocate with --servers is refused.
# Usage: launch_colocate_test.sh BUILD_DIR.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin=${1:-$repo/build}
out=$(mktemp /tmp/adaps-colocate.XXXXXX)
trap 'rm -f "$out"' EXIT
fail() { echo "FAIL: $*"; cat "$out"; exit 1; }
# The scheduler listens on P and server i on P+1+i: four ports, taken below the ephemeral
# range so that no port the OS hands another test meanwhile can be one of them (a port
# chosen by the OS for P alone once lost P+3 to a parallel test: "address in use").
port=$(python3 - <<'PY'
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(200):
    p = random.randrange(10000, low - 4)
    socks = []
    try:
        for q in range(p, p + 4):
            s = socket.socket(); s.bind(("0.0.0.0", q)); socks.append(s)
        print(p); break
    except OSError:
        pass
    finally:
        for s in socks: s.close()
PY
)
[[ -n $port ]] || fail "no four free consecutive ports"
job=(--mode=synthetic --tensors=200K --layers=2 --steps=4 --warmup=1 --compressor=adacomp
     --pull=sparse --log_level=warn)
timeout 240 bash "$repo/deploy/launch.sh" --bin "$bin" --colocate --workers 4 \
  --hosts 127.0.0.1,127.0.0.2,127.0.0.3 --via "env ADAPS_TEST_HOST={index}" --port "$port" \
  --scheduler-args "--log_level=warn" --server-args "--optimizer=mean --log_level=warn" \
  -- "${job[@]}" >"$out" 2>&1 || fail "the colocated job failed"
grep -q "3 servers, 4 workers" "$out" || fail "expected 3 servers for 3 hosts"
for want in "server 0 on 127.0.0.1" "server 1 on 127.0.0.2" "server 2 on 127.0.0.3" \
            "worker 0 on 127.0.0.1" "worker 2 on 127.0.0.3" "worker 3 on 127.0.0.1"; do
  grep -q "launch: $want" "$out" || fail "no '$want'"
done
[[ $(grep -c "SUMMARY" "$out") -ge 1 ]] || fail "no SUMMARY line"
grep -q "forwarded_answers=[1-9]" "$out" || fail "mean servers' sparse pulls were not forwarded"
timeout 240 bash "$repo/deploy/launch.sh" --bin "$bin" --colocate --workers 2 \
  --scheduler-args "--log_level=warn" --server-args "--optimizer=mean --log_level=warn" \
  -- "${job[@]}" >"$out" 2>&1 || fail "the local colocated job failed"
grep -q "2 servers, 2 workers" "$out" || fail "expected one server per worker locally"
bash "$repo/deploy/launch.sh" --bin "$bin" --colocate --servers 2 --workers 2 >"$out" 2>&1
[[ $? -eq 2 ]] && grep -q "drop --servers" "$out" || fail "--colocate with --servers accepted"
echo "PASS"
