#!/usr/bin/env bash
# Checks the Kubernetes base (deploy/k8s) without a cluster: it renders with
# `kubectl kustomize` (alone and with components/curve), and structurally
#  1. every ADAPS_* variable a container gets (env and envFrom ConfigMaps) is a flag of the
#     executable its ADAPS_ROLE starts (the built executables' --helpfull);
#  2. the StatefulSet's replicas and the Job's completions/parallelism equal the
#     scheduler's --num_servers/--num_workers;
#  3. images are the one deploy/Dockerfile builds, run through its entrypoint; ports agree
#     between the flags, containerPorts, Services, probes and addresses; the checkpoint
#     volume is mounted where --checkpoint_dir points and the Dockerfile creates it;
#  4. the alert rules and the Grafana dashboard use only metric names of common/metrics.h;
#  5. every role exports metrics (ADAPS_METRICS_PORT on 0.0.0.0, a containerPort "metrics",
#     prometheus.io annotations naming that port); the scheduler and servers are probed on
#     /metrics for readiness and liveness, the workers for liveness.
#   tests/deploy/k8s_test.sh BUILD_DIR [K8S_DIR]    (K8S_DIR: default deploy/k8s, for tests)
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?build dir}" && pwd)
k8s=$(cd "${2:-$repo/deploy/k8s}" && pwd)
fail() { echo "FAILED: $*"; exit 1; }
if ! command -v kubectl >/dev/null; then
  echo "SKIP: kubectl is not installed (Debian: kubernetes-client)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

base=$(kubectl kustomize "$k8s" 2>&1) || fail "kubectl kustomize $k8s: $base"
# The CURVE component, as a user's overlay would add it.
cp -r "$k8s" "$tmp/base"
printf 'resources: [base]\ncomponents: [base/components/curve]\n' >"$tmp/kustomization.yaml"
curve=$(kubectl kustomize "$tmp" 2>&1) || fail "kubectl kustomize with components/curve: $curve"
for role in scheduler server worker; do
  "$build/$role/adaps-$role" --helpfull >"$tmp/$role.help" 2>&1
  grep -q -- "--log_level" "$tmp/$role.help" || fail "cannot read adaps-$role --helpfull"
done

printf '%s\n' "$base" >"$tmp/base.yaml"
printf '%s\n' "$curve" >"$tmp/curve.yaml"
/usr/bin/python3 - "$repo" "$tmp" "$k8s" <<'PY' || exit 1
import json, re, sys, yaml
repo, tmp, k8s = sys.argv[1:4]
base_text, curve_text = open(f"{tmp}/base.yaml").read(), open(f"{tmp}/curve.yaml").read()
errors = []
def check(ok, msg):
    if not ok: errors.append(msg)

def flags(role):
    return set(re.findall(r"^\s+--([a-z0-9_]+) \(", open(f"{tmp}/{role}.help").read(), re.M))

dockerfile = open(f"{repo}/deploy/Dockerfile").read()
image = re.search(r"docker build -f deploy/Dockerfile -t (\S+)", dockerfile).group(1)
entry = open(f"{repo}/deploy/docker-entrypoint.sh").read()
roles = re.search(r"^\s*((?:[a-z]+\|)+[a-z]+)\)", entry, re.M).group(1).split("|")

def analyse(docs, label):
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs if d}
    cms = {n: d.get("data", {}) for (k, n), d in by.items() if k == "ConfigMap"}
    workloads = {k: d for (k, n), d in by.items() if k in ("Deployment", "StatefulSet", "Job")}
    env_of = {}
    for kind, w in workloads.items():
        spec = w["spec"]["template"]["spec"]
        for c in spec["containers"]:
            where = f"{label}: {kind} {w['metadata']['name']} container {c['name']}"
            env = {}
            for src in c.get("envFrom", []):
                name = src["configMapRef"]["name"]
                check(name in cms, f"{where}: envFrom names a missing ConfigMap {name}")
                env.update(cms.get(name, {}))
            for e in c.get("env", []):
                env[e["name"]] = e.get("value", "<from " + json.dumps(e.get("valueFrom")) + ">")
            role = env.get("ADAPS_ROLE")
            check(role in roles, f"{where}: ADAPS_ROLE {role} is not a role of the entrypoint")
            if role not in roles: continue
            have = flags(role)
            for v in env:
                if v.startswith("ADAPS_") and v != "ADAPS_ROLE":
                    flag = v[len("ADAPS_"):].lower()
                    check(flag in have, f"{where}: {v} is not a flag of adaps-{role}")
            check(c["image"].split(":")[0].split("/")[-1] == image,
                  f"{where}: image {c['image']} is not {image} (deploy/Dockerfile)")
            check("command" not in c, f"{where}: command overrides the image's entrypoint")
            ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            for probe in ("readinessProbe", "livenessProbe"):
                p = c.get(probe)
                if role != "worker":
                    check(p is not None, f"{where}: no {probe}")
                if p and "httpGet" in p:
                    port = ports.get(p["httpGet"]["port"], p["httpGet"]["port"])
                    check(str(port) == env.get("ADAPS_METRICS_PORT"),
                          f"{where}: {probe} on port {port}, ADAPS_METRICS_PORT is "
                          f"{env.get('ADAPS_METRICS_PORT')}")
                    check(p["httpGet"]["path"] == "/metrics", f"{where}: {probe} not on /metrics")
                if p and "tcpSocket" in p:
                    port = ports.get(p["tcpSocket"]["port"], p["tcpSocket"]["port"])
                    check(str(port) == env.get("ADAPS_PORT"), f"{where}: {probe} on port {port}")
            if "ADAPS_PORT" in env:
                check(str(ports.get("zmq")) == env["ADAPS_PORT"],
                      f"{where}: containerPort zmq {ports.get('zmq')} != ADAPS_PORT {env['ADAPS_PORT']}")
            if "ADAPS_METRICS_PORT" in env:
                check(str(ports.get("metrics")) == env["ADAPS_METRICS_PORT"],
                      f"{where}: containerPort metrics != ADAPS_METRICS_PORT")
            mport = env.get("ADAPS_METRICS_PORT")
            check(mport is not None and mport != "-1", f"{where}: no ADAPS_METRICS_PORT")
            check(env.get("ADAPS_METRICS_HOST", "0.0.0.0") == "0.0.0.0",
                  f"{where}: ADAPS_METRICS_HOST is not 0.0.0.0 (the kubelet could not probe)")
            ann = w["spec"]["template"]["metadata"].get("annotations", {})
            check(ann.get("prometheus.io/scrape") == "true" and
                  ann.get("prometheus.io/port") == mport and
                  ann.get("prometheus.io/path") == "/metrics",
                  f"{where}: prometheus.io annotations {ann} do not name port {mport} /metrics")
            wanted = ("livenessProbe",) if role == "worker" else ("readinessProbe", "livenessProbe")
            for probe in wanted:
                check("httpGet" in (c.get(probe) or {}), f"{where}: {probe} is not on /metrics")
            env_of[role] = (env, w, c)
    check(set(env_of) == {"scheduler", "server", "worker"}, f"{label}: roles {sorted(env_of)}")
    if errors: return
    s_env, _, _ = env_of["scheduler"]
    sts, job = workloads["StatefulSet"], workloads["Job"]
    check(str(sts["spec"]["replicas"]) == s_env.get("ADAPS_NUM_SERVERS"),
          f"{label}: StatefulSet replicas {sts['spec']['replicas']} != scheduler's "
          f"ADAPS_NUM_SERVERS {s_env.get('ADAPS_NUM_SERVERS')}")
    for field in ("completions", "parallelism"):
        check(str(job["spec"][field]) == s_env.get("ADAPS_NUM_WORKERS"),
              f"{label}: Job {field} {job['spec'][field]} != scheduler's ADAPS_NUM_WORKERS "
              f"{s_env.get('ADAPS_NUM_WORKERS')}")
    check(job["spec"].get("completionMode") == "Indexed", f"{label}: the Job is not Indexed")
    # The scheduler's Service and the address the others dial.
    svc = by.get(("Service", "adaps-scheduler"))
    check(svc is not None, f"{label}: no Service adaps-scheduler")
    if svc:
        sport = {p["name"]: p for p in svc["spec"]["ports"]}
        check(str(sport["zmq"]["port"]) == s_env["ADAPS_PORT"],
              f"{label}: Service adaps-scheduler port != scheduler ADAPS_PORT")
        want = f"tcp://adaps-scheduler:{sport['zmq']['port']}"
        for role in ("server", "worker"):
            check(env_of[role][0].get("ADAPS_SCHEDULER") == want,
                  f"{label}: {role} ADAPS_SCHEDULER {env_of[role][0].get('ADAPS_SCHEDULER')} != {want}")
    # Servers: headless Service, stable identity and address, checkpoint volume.
    v_env, _, v_c = env_of["server"]
    hs = by.get(("Service", sts["spec"]["serviceName"]))
    check(hs is not None and hs["spec"].get("clusterIP") == "None",
          f"{label}: the StatefulSet's serviceName is no headless Service")
    if hs:
        check(str(hs["spec"]["ports"][0]["port"]) == v_env["ADAPS_PORT"],
              f"{label}: headless Service port != server ADAPS_PORT")
    check(v_env.get("ADAPS_IDENTITY") == "$(POD_NAME)", f"{label}: server identity is not the pod name")
    check(v_env.get("ADAPS_ADVERTISE") ==
          f"tcp://$(POD_NAME).{sts['spec']['serviceName']}:{v_env['ADAPS_PORT']}",
          f"{label}: server ADAPS_ADVERTISE {v_env.get('ADAPS_ADVERTISE')}")
    claims = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
    mounts = {m["name"]: m["mountPath"] for m in v_c.get("volumeMounts", [])}
    ckpt = v_env.get("ADAPS_CHECKPOINT_DIR")
    check(any(mounts.get(c) == ckpt for c in claims),
          f"{label}: no volumeClaimTemplate mounted at ADAPS_CHECKPOINT_DIR {ckpt}")
    check(ckpt is not None and ckpt in dockerfile,
          f"{label}: the Dockerfile does not create ADAPS_CHECKPOINT_DIR {ckpt}")
    check("job-completion-index" in env_of["worker"][0].get("ADAPS_IDENTITY", ""),
          f"{label}: worker identity is not the Job completion index")
    return env_of

analyse(list(yaml.safe_load_all(base_text)), "base")
curve_roles = analyse(list(yaml.safe_load_all(curve_text)), "curve")
if curve_roles:
    for role, want in (("scheduler", {"ADAPS_CURVE_SERVER_KEY", "ADAPS_CURVE_ALLOWED_CLIENTS"}),
                       ("server", {"ADAPS_CURVE_SERVER_KEY", "ADAPS_CURVE_CLIENT_KEY",
                                   "ADAPS_CURVE_ALLOWED_CLIENTS"}),
                       ("worker", {"ADAPS_CURVE_SERVER_KEY", "ADAPS_CURVE_CLIENT_KEY"})):
        check(want <= set(curve_roles[role][0]), f"curve: {role} lacks {want}")

# Metric names: the alerts and the dashboard use only names of the catalog.
catalog = set(re.findall(r'"(adaps_[a-z_]+)"', open(f"{repo}/common/metrics.h").read()))
check(len(catalog) > 10, "cannot read the metric names of common/metrics.h")
def used(text):
    names = set(re.findall(r"\b(adaps_[a-z_]+)", text))
    return {re.sub(r"_(bucket|count|sum)$", "", n) for n in names}
alerts = yaml.safe_load(open(f"{k8s}/alerts.yaml"))
exprs = " ".join(r["expr"] for g in alerts["groups"] for r in g["rules"])
for n in sorted(used(exprs) - catalog):
    check(False, f"alerts.yaml uses {n}, not a metric of common/metrics.h")
dash = json.load(open(f"{repo}/deploy/grafana/adaps.json"))
targets = " ".join(t["expr"] for p in dash["panels"] for t in p.get("targets", []))
check(targets, "the dashboard has no queries")
for n in sorted(used(targets) - catalog):
    check(False, f"deploy/grafana/adaps.json uses {n}, not a metric of common/metrics.h")

if errors:
    print("\n".join("FAILED: " + e for e in errors))
    sys.exit(1)
print(f"k8s: base and curve render; flags, counts, image {image}, ports, volumes, "
      f"{len(alerts['groups'][0]['rules'])} alerts and {len(dash['panels'])} panels agree")
PY
echo "k8s_test: OK"
