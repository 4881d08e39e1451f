#!/usr/bin/env python3
"""Checks that deploy/docker-compose.yml and deploy/k8s describe the same adaps job.

  compose_k8s_agree.py COMPOSE_CONFIG K8S_DIR [KUBECTL_RENDERED]

COMPOSE_CONFIG is `docker-compose -f deploy/docker-compose.yml config` (YAML). K8S_DIR is
rendered here with the few kustomize features deploy/k8s/kustomization.yaml uses (resources,
images, labels, replacements; any other key is an error, so that a new feature cannot be
ignored silently). KUBECTL_RENDERED, when given, is `kubectl kustomize K8S_DIR`: it must
equal this rendering, which keeps the small renderer honest where kubectl is installed.

Compared, per role: the image; the environment (every ADAPS_* variable and its value, but for
the ones that name the platform's own objects, PLATFORM below); the ports (the executables'
ADAPS_PORT/ADAPS_METRICS_PORT against compose's health checks and published ports and the
pods' containerPorts and Services); the servers' checkpoint volume (mounted at
ADAPS_CHECKPOINT_DIR in both); the number of servers and workers. Exit 1 with every
disagreement listed.
"""
import copy
import os
import re
import sys

import yaml

# Variables that differ by design: each names an object of its platform.
PLATFORM = {
    "ADAPS_IDENTITY": "a compose service's name; a pod's name or Job completion index",
    "ADAPS_ADVERTISE": "the server's DNS name: a compose service, a StatefulSet pod",
    "ADAPS_SCHEDULER": "the scheduler's DNS name (its port is compared)",
    "ADAPS_READY_FILE": "compose's worker health check; Kubernetes probes /metrics",
}
KNOWN_KUSTOMIZE_KEYS = {"apiVersion", "kind", "labels", "resources", "images", "replacements"}


def fail_usage(msg):
    print(f"compose_k8s_agree: {msg}", file=sys.stderr)
    sys.exit(2)


def get_path(doc, path):
    for part in path.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def set_path(doc, path, value):
    parts = path.split(".")
    for part in parts[:-1]:
        doc = doc.setdefault(part, {})
    doc[parts[-1]] = value


def render(k8s_dir):
    """The kustomization in k8s_dir, rendered as kustomize does for the features it uses."""
    kfile = os.path.join(k8s_dir, "kustomization.yaml")
    if not os.path.exists(kfile):
        fail_usage(f"no {kfile}")
    kust = yaml.safe_load(open(kfile))
    unknown = set(kust) - KNOWN_KUSTOMIZE_KEYS
    if unknown:
        fail_usage(f"{kfile} uses {sorted(unknown)}, which this renderer does not apply: "
                   "teach it (tests/deploy/compose_k8s_agree.py) or render with kubectl")
    docs = []
    for res in kust.get("resources", []):
        docs += [d for d in yaml.safe_load_all(open(os.path.join(k8s_dir, res))) if d]
    for img in kust.get("images", []):
        for d in docs:
            for c in containers(d):
                name, _, _ = c["image"].partition(":")
                if name == img["name"]:
                    c["image"] = f"{img.get('newName', name)}:{img['newTag']}"
    for lab in kust.get("labels", []):
        if lab.get("includeSelectors") or lab.get("includeTemplates"):
            fail_usage("labels with includeSelectors/includeTemplates are not applied here")
        for d in docs:
            d["metadata"].setdefault("labels", {}).update(lab["pairs"])
    for rep in kust.get("replacements", []):
        src = rep["source"]
        found = [d for d in docs if d["kind"] == src["kind"] and d["metadata"]["name"] == src["name"]]
        if len(found) != 1:
            fail_usage(f"replacement source {src['kind']}/{src['name']}: {len(found)} objects")
        value = get_path(found[0], src["fieldPath"])
        for tgt in rep["targets"]:
            sel = tgt["select"]
            for d in docs:
                if d["kind"] == sel["kind"] and d["metadata"]["name"] == sel["name"]:
                    for path in tgt["fieldPaths"]:
                        old = get_path(d, path)
                        # kustomize keeps the target's type: "2" into an int field is 2.
                        set_path(d, path, int(value) if isinstance(old, int) else value)
    return docs


def containers(doc):
    return get_path(doc, "spec.template.spec.containers") or []


def canonical(docs):
    return sorted((yaml.safe_dump(d, sort_keys=True) for d in docs))


def main():
    if len(sys.argv) not in (3, 4):
        fail_usage(__doc__.strip().splitlines()[2].strip())
    compose = yaml.safe_load(open(sys.argv[1]))
    docs = render(sys.argv[2])
    errors = []

    def check(ok, msg):
        if not ok:
            errors.append(msg)

    if len(sys.argv) == 4:
        kubectl_docs = [d for d in yaml.safe_load_all(open(sys.argv[3])) if d]
        check(canonical(kubectl_docs) == canonical(docs),
              "the renderer's output differs from `kubectl kustomize`: fix the renderer")

    # Compose: services by role.
    c_roles = {}
    for name, svc in compose["services"].items():
        env = {k: str(v) for k, v in (svc.get("environment") or {}).items()}
        c_roles.setdefault(env.get("ADAPS_ROLE"), []).append((name, svc, env))
    # Kubernetes: containers by role, with their ConfigMaps' variables.
    cms = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    k_roles = {}
    for d in docs:
        for c in containers(d):
            env = {}
            for src in c.get("envFrom", []):
                env.update(cms.get(src["configMapRef"]["name"], {}))
            for e in c.get("env", []):
                env[e["name"]] = str(e.get("value", "<valueFrom>"))
            k_roles.setdefault(env.get("ADAPS_ROLE"), []).append((d, c, env))
    check(set(c_roles) == {"scheduler", "server", "worker"}, f"compose roles {sorted(c_roles, key=str)}")
    check(set(k_roles) == {"scheduler", "server", "worker"}, f"k8s roles {sorted(k_roles, key=str)}")
    if errors:
        return report(errors)

    def adaps_env(env):
        return {k: v for k, v in env.items() if k.startswith("ADAPS_") and k not in PLATFORM}

    for role in ("scheduler", "server", "worker"):
        services = c_roles[role]
        check(len(k_roles[role]) == 1, f"k8s: {len(k_roles[role])} {role} containers, want 1")
        obj, c, k_env = k_roles[role][0]
        # Every compose service of a role runs the same settings, bar the platform's names.
        first_name, _, first_env = services[0]
        for name, svc, env in services[1:]:
            check(adaps_env(env) == adaps_env(first_env),
                  f"compose: {name}'s settings differ from {first_name}'s")
        c_env = adaps_env(first_env)
        k_env_cmp = adaps_env(k_env)
        for key in sorted(set(c_env) | set(k_env_cmp)):
            check(c_env.get(key) == k_env_cmp.get(key),
                  f"{role}: {key} is {c_env.get(key)!r} in compose ({first_name}) but "
                  f"{k_env_cmp.get(key)!r} in k8s ({obj['kind']} {obj['metadata']['name']})")
        if role != "scheduler":
            cs, ks = first_env.get("ADAPS_SCHEDULER", ""), k_env.get("ADAPS_SCHEDULER", "")
            check(cs.rpartition(":")[2] == ks.rpartition(":")[2] and cs.startswith("tcp://")
                  and ks.startswith("tcp://"),
                  f"{role}: ADAPS_SCHEDULER {cs} (compose) and {ks} (k8s) differ in port")
        # The image.
        for name, svc, _ in services:
            check(svc.get("image") == c["image"],
                  f"{role}: image {svc.get('image')} in compose ({name}), {c['image']} in k8s")
        # Ports: the flags' ports are the pods' containerPorts and compose's health checks.
        ports = {p["name"]: str(p["containerPort"]) for p in c.get("ports", [])}
        for var, port_name in (("ADAPS_PORT", "zmq"), ("ADAPS_METRICS_PORT", "metrics")):
            if var in c_env:
                check(ports.get(port_name) == c_env[var],
                      f"{role}: {var} {c_env[var]} but k8s containerPort {port_name} is "
                      f"{ports.get(port_name)}")
        for name, svc, env in services:
            test = svc.get("healthcheck", {}).get("test", [])
            text = " ".join(test) if isinstance(test, list) else str(test)
            m = re.search(r"/dev/tcp/127\.0\.0\.1/(\d+)", text)
            if m:
                check(m.group(1) == env.get("ADAPS_PORT"),
                      f"compose: {name}'s health check probes port {m.group(1)}, "
                      f"ADAPS_PORT is {env.get('ADAPS_PORT')}")
            for p in svc.get("ports", []):
                target = str(p["target"]) if isinstance(p, dict) else str(p).split(":")[-1]
                check(target in ports.values(),
                      f"compose: {name} publishes port {target}, not a containerPort in k8s")
        # Volumes: the servers' checkpoints.
        ckpt = c_env.get("ADAPS_CHECKPOINT_DIR")
        c_mounts = []
        for name, svc, _ in services:
            for v in svc.get("volumes", []):
                c_mounts.append(v["target"] if isinstance(v, dict) else str(v).split(":")[1])
        k_mounts = [m["mountPath"] for m in c.get("volumeMounts", [])]
        if role == "server":
            check(ckpt is not None, "server: no ADAPS_CHECKPOINT_DIR")
            check(c_mounts == [ckpt] * len(services),
                  f"compose: server volumes mounted at {c_mounts}, want {ckpt} in each")
            claims = {t["metadata"]["name"] for t in obj["spec"].get("volumeClaimTemplates", [])}
            check([m["mountPath"] for m in c.get("volumeMounts", []) if m["name"] in claims] == [ckpt],
                  f"k8s: the server's claim is mounted at {k_mounts}, want {ckpt}")
        else:
            check(not c_mounts and not k_mounts,
                  f"{role}: volumes {c_mounts} (compose), {k_mounts} (k8s): none expected")

    # The job's size.
    s_env = c_roles["scheduler"][0][2]
    sts = k_roles["server"][0][0]
    job = k_roles["worker"][0][0]
    check(str(len(c_roles["server"])) == s_env.get("ADAPS_NUM_SERVERS") == str(sts["spec"]["replicas"]),
          f"servers: {len(c_roles['server'])} compose services, scheduler's ADAPS_NUM_SERVERS "
          f"{s_env.get('ADAPS_NUM_SERVERS')}, StatefulSet replicas {sts['spec']['replicas']}")
    check(str(len(c_roles["worker"])) == s_env.get("ADAPS_NUM_WORKERS") == str(job["spec"]["completions"]),
          f"workers: {len(c_roles['worker'])} compose services, scheduler's ADAPS_NUM_WORKERS "
          f"{s_env.get('ADAPS_NUM_WORKERS')}, Job completions {job['spec']['completions']}")
    return report(errors)


def report(errors):
    if errors:
        print("\n".join("FAILED: " + e for e in errors))
        return 1
    print("compose and k8s agree: images, environment (but "
          f"{', '.join(sorted(PLATFORM))}), ports, checkpoint volumes, 1 scheduler, servers and "
          "workers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
