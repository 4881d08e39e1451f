#!/usr/bin/env bash
# Checks the deployment files without a Docker engine (none runs on these machines):
#  1. deploy/docker-compose.yml validates with docker-compose and describes 1 scheduler,
#     2 servers and 4 workers, each with a health check that tests the process (its port,
#     or a worker's ready file) and a bounded restart policy that leaves a finished job
#     down; .dockerignore keeps build folders and .git out of the build context;
#     deploy/docker-compose.curve.yml gives each role only its CURVE keys, read-only;
#  2. every ADAPS_* variable it sets (with the CURVE override too) names a flag of that
#     role's executable, and so does every flag of the training recipe (deploy/recipe.flags),
#     which the image carries;
#  3. the Dockerfile's build steps: the same install script and install rules
#     (deploy/docker-build.sh) -- install-deps.sh build succeeds, the targets it builds
#     exist, `cmake --install` of this build yields the executables and the Python module;
#  4. the runtime stage's packages (deploy/runtime-packages.txt) provide every shared
#     library the installed executables and the Python module load.
#   tests/deploy/compose_test.sh BUILD_DIR
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?build dir}" && pwd)
fail() { echo "FAILED: $*"; exit 1; }
command -v docker-compose >/dev/null || fail "docker-compose is not installed (deploy/install-deps.sh installs it)"

echo "== 1. compose file"
compose="$repo/deploy/docker-compose.yml"
config=$(docker-compose -f "$compose" config 2>&1) || fail "docker-compose config: $config"
# docker-compose (Debian's is 1.29, Python) depends on python3-yaml.
json=$(/usr/bin/python3 -c 'import sys, yaml, json; print(json.dumps(yaml.safe_load(sys.stdin)))' <<<"$config") ||
  fail "cannot read the compose config as YAML"

/usr/bin/python3 - "$json" <<'PY' || exit 1
import json, sys
cfg = json.loads(sys.argv[1])
roles = {}
for name, svc in cfg["services"].items():
    role = svc.get("environment", {}).get("ADAPS_ROLE")
    roles.setdefault(role, []).append(name)
    if "healthcheck" not in svc: sys.exit(f"FAILED: service {name} has no healthcheck")
    if "restart" not in svc: sys.exit(f"FAILED: service {name} has no restart policy")
want = {"scheduler": 1, "server": 2, "worker": 4}
got = {r: len(v) for r, v in roles.items()}
if got != want: sys.exit(f"FAILED: roles {got}, want {want}")
print("compose: services by role", {r: sorted(v) for r, v in roles.items()})

# The job must end: a container that exited 0 (the scheduler after Shutdown, the servers
# following it, a finished worker) is not started again, and a crash only a few times.
import re
for name, svc in cfg["services"].items():
    m = re.fullmatch(r"on-failure(?::(\d+))?", str(svc["restart"]))
    if str(svc["restart"]) != "no" and not (m and m.group(1) and 1 <= int(m.group(1)) <= 10):
        sys.exit(f"FAILED: service {name} has restart '{svc['restart']}': want 'no' or "
                 "'on-failure:N' (N <= 10); unless-stopped and always restart a finished job")

# Health checks test the process's real state, never something always true.
for name, svc in cfg["services"].items():
    env, test = svc["environment"], svc["healthcheck"]["test"]
    text = " ".join(test) if isinstance(test, list) else str(test)
    if re.search(r"kill -0|\btrue\b|exit 0", text):
        sys.exit(f"FAILED: service {name}: health check '{text}' is always true")
    role = env["ADAPS_ROLE"]
    if role in ("scheduler", "server"):
        if f"/dev/tcp/127.0.0.1/{env['ADAPS_PORT']}" not in text:
            sys.exit(f"FAILED: service {name}: health check '{text}' does not test its port")
    elif env.get("ADAPS_READY_FILE", "") == "" or env["ADAPS_READY_FILE"] not in text:
        sys.exit(f"FAILED: service {name}: health check '{text}' does not test ADAPS_READY_FILE")
print("compose: restart policies bounded, health checks test ports and ready files")
PY

echo "== 1b. the encrypted override (deploy/docker-compose.curve.yml) gives each role its keys"
curve_config=$(ADAPS_CURVE_DIR=/keys docker-compose -f "$compose" -f "$repo/deploy/docker-compose.curve.yml" config 2>&1) ||
  fail "docker-compose config with the CURVE override: $curve_config"
curve_json=$(/usr/bin/python3 -c 'import sys, yaml, json; print(json.dumps(yaml.safe_load(sys.stdin)))' <<<"$curve_config") ||
  fail "cannot read the CURVE compose config as YAML"
/usr/bin/python3 - "$curve_json" <<'PY' || exit 1
import json, sys
cfg = json.loads(sys.argv[1])
want = {"scheduler": {"ADAPS_CURVE_SERVER_KEY": "server.key", "ADAPS_CURVE_ALLOWED_CLIENTS": "allowed_clients"},
        "server": {"ADAPS_CURVE_SERVER_KEY": "server.key", "ADAPS_CURVE_CLIENT_KEY": "client.key",
                   "ADAPS_CURVE_ALLOWED_CLIENTS": "allowed_clients"},
        "worker": {"ADAPS_CURVE_SERVER_KEY": "server.pub", "ADAPS_CURVE_CLIENT_KEY": "client.key"}}
for name, svc in cfg["services"].items():
    env = svc["environment"]
    curve = {k: v for k, v in env.items() if k.startswith("ADAPS_CURVE_")}
    mounts = {v["target"]: v for v in svc.get("volumes", []) if isinstance(v, dict) and v.get("type") == "bind"}
    need = want[env["ADAPS_ROLE"]]
    if set(curve) != set(need):
        sys.exit(f"FAILED: {name}: CURVE variables {sorted(curve)}, want {sorted(need)}")
    for var, f in need.items():
        m = mounts.get(curve[var])
        if not curve[var].endswith("/" + f) or not m or m["source"] != "/keys/" + f or not m.get("read_only"):
            sys.exit(f"FAILED: {name}: {var}={curve[var]} is not /keys/{f} mounted read-only")
    if len(mounts) != len(need):
        sys.exit(f"FAILED: {name} mounts {sorted(m['source'] for m in mounts.values())}: only its own keys")
print("compose curve: every service gets its role's keys, read-only; workers no server secret")
PY

echo "== 1c. .dockerignore keeps build folders and .git out of the context"
/usr/bin/python3 - "$repo" "$build" <<'PY' || exit 1
import os, re, subprocess, sys
repo, build = sys.argv[1], sys.argv[2]
path = os.path.join(repo, ".dockerignore")
if not os.path.exists(path): sys.exit("FAILED: no .dockerignore at the repository root")
pats = [l.strip() for l in open(path) if l.strip() and not l.startswith("#")]
if any(p.startswith("!") for p in pats): sys.exit("FAILED: this check does not handle '!' patterns")
def rx(p):  # Docker's matching: '**' any directories, '*' within one, relative to the root
    p = p.strip("/")
    out = re.escape(p).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
    return re.compile(out.replace(r"\?", "[^/]") + "$")
rxs = [rx(p) for p in pats]
def ignored(rel):
    parts = rel.split("/")
    return any(r.match("/".join(parts[:i])) for r in rxs for i in range(1, len(parts) + 1))
for must in [".git", "build", "build-asan", "bench/accuracy/runs"]:
    if not ignored(must): sys.exit(f"FAILED: .dockerignore does not exclude {must}")
tracked = subprocess.run(["git", "-C", repo, "ls-files"], capture_output=True, text=True).stdout.split()
needed = [f for f in tracked if re.search(r"(\.(cc|h|cu|fbs|py|txt|cmake|sh|in)|CMakeLists\.txt)$", f)
          and not f.startswith(("bench/accuracy/runs/", ".ci/"))]
lost = [f for f in needed if ignored(f)]
if lost: sys.exit(f"FAILED: .dockerignore excludes files the build needs: {lost[:5]}")
size = 0
for root, dirs, files in os.walk(repo):
    rel = os.path.relpath(root, repo)
    dirs[:] = [d for d in dirs if not ignored(os.path.normpath(os.path.join(rel, d)))]
    for f in files:
        r = os.path.normpath(os.path.join(rel, f))
        if not ignored(r): size += os.path.getsize(os.path.join(root, f))
if size > 50e6: sys.exit(f"FAILED: the build context would still be {size / 1e6:.0f} MB")
print(f"dockerignore: {len(needed)} source files kept, context {size / 1e6:.1f} MB")
PY

echo "== 2. ADAPS_* variables name real flags"
for role in scheduler server worker; do
  help=$("$build/$role/adaps-$role" --helpfull 2>&1)
  vars=$(/usr/bin/python3 - "$curve_json" "$role" <<'PY'
import json, sys
cfg, role = json.loads(sys.argv[1]), sys.argv[2]
names = set()
for svc in cfg["services"].values():
    env = svc.get("environment", {})
    if env.get("ADAPS_ROLE") == role:
        names |= {k for k in env if k.startswith("ADAPS_") and k != "ADAPS_ROLE"}
print(" ".join(sorted(names)))
PY
)
  for v in $vars; do
    flag=$(tr '[:upper:]' '[:lower:]' <<<"${v#ADAPS_}")
    grep -qE -- "--$flag \(" <<<"$help" || fail "$v is set for $role but adaps-$role has no --$flag"
  done
  echo "$role: $vars"
done

echo "== 2b. the training recipe (deploy/recipe.flags) names real flags; the image carries it"
recipe=$repo/deploy/recipe.flags
grep -q "COPY deploy/recipe.flags /opt/adaps/share/adaps/recipe.flags" "$repo/deploy/Dockerfile" ||
  fail "the Dockerfile does not copy deploy/recipe.flags where the entrypoint reads it"
grep -q "/opt/adaps/share/adaps/recipe.flags" "$repo/deploy/docker-entrypoint.sh" ||
  fail "the entrypoint does not read /opt/adaps/share/adaps/recipe.flags"
for role in server worker; do
  flags=$(sed -n "s/^$role:[[:space:]]*//p" "$recipe")
  [[ -n $flags ]] || fail "deploy/recipe.flags has no '$role:' line"
  help=$("$build/$role/adaps-$role" --helpfull 2>&1)
  for f in $flags; do
    name=${f#--}; name=${name%%=*}
    grep -qE -- "--$name \(" <<<"$help" || fail "deploy/recipe.flags: adaps-$role has no --$name"
  done
  echo "recipe $role: $flags"
done

echo "== 3. Dockerfile build steps"
grep -q "deploy/docker-build.sh" "$repo/deploy/Dockerfile" || fail "the Dockerfile no longer calls deploy/docker-build.sh"
bash "$repo/deploy/install-deps.sh" build >/dev/null || fail "install-deps.sh build failed"
targets=$(sed -n 's/^ninja -C "\$build_dir" //p' "$repo/deploy/docker-build.sh")
[[ -n $targets ]] || fail "cannot read the targets of deploy/docker-build.sh"
for t in $targets; do
  ninja -C "$build" -t query "$t" >/dev/null 2>&1 || fail "target $t of docker-build.sh is not in the build"
done
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null || fail "cmake --install failed"
for f in bin/adaps-scheduler bin/adaps-server bin/adaps-worker bin/adaps-keygen; do
  [[ -x $prefix/$f ]] || fail "$f not installed"
done
module=$(find "$prefix" -name '_core*.so' | head -1)
[[ -n $module ]] || fail "the Python module was not installed"
lib=$(find "$prefix" -name 'libadaps_worker.so*' -type f | head -1)
[[ -n $lib ]] || fail "libadaps_worker.so was not installed"
echo "installed: $(cd "$prefix" && find . -type f | wc -l) files"

echo "== 4. runtime packages provide every shared library"
runtime=$(grep -v '^#' "$repo/deploy/runtime-packages.txt")
# The listed packages and everything they pull in (a dependency is installed with them),
# from the installed packages' metadata: offline, no apt lists needed.
closure=$(/usr/bin/python3 - $runtime <<'PY'
import re, subprocess, sys
out = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\t${Pre-Depends}, ${Depends}, ${Provides}\n"],
                     capture_output=True, text=True).stdout
deps, provided_by = {}, {}
for line in out.splitlines():
    name, _, rest = line.partition("\t")
    fields = [f.strip() for f in rest.split(",") if f.strip()]
    deps[name] = [re.split(r"[ :(]", alt.strip())[0] for f in fields for alt in f.split("|")]
seen, todo = set(), list(sys.argv[1:])
while todo:
    p = todo.pop()
    if p in seen: continue
    seen.add(p)
    todo.extend(deps.get(p, []))
print("\n".join(sorted(seen)))
PY
)
missing=0
declare -A owner=()
libs=$(for f in "$prefix"/bin/adaps-* "$module" "$lib"; do
  LD_LIBRARY_PATH="$prefix/lib" ldd "$f" | sed -n 's/^\s*\S* => \(\S*\) .*/\1/p'
done | grep -v "^$prefix" | sort -u)
paths=$(for l in $libs; do readlink -f "$l"; done | sort -u)
# One dpkg -S for every library (it is slow per call).
# shellcheck disable=SC2086
# Lines are "pkg[:arch][, pkg...]: path".
while read -r pkg path; do
  owner[$path]=$pkg
done < <(dpkg -S $paths ${paths//\/usr\/lib\//\/lib\/} 2>/dev/null | sed -n 's/^\([^:, ]*\)[^ ]*: \(.*\)$/\1 \2/p')
for p in $paths; do
  # Debian 12 merges /lib into /usr/lib; dpkg may know a library under either.
  pkg=${owner[$p]:-${owner[${p#/usr}]:-}}
  if [[ -z $pkg ]]; then
    echo "  $p belongs to no package"; missing=1
  elif ! grep -qx "$pkg" <<<"$closure"; then
    echo "  $p comes from $pkg, not in the runtime packages"; missing=1
  fi
done
echo "$(wc -w <<<"$paths") shared libraries checked"
[[ $missing -eq 0 ]] || fail "the runtime image would miss shared libraries"
echo "PASSED"
