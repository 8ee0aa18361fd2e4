#!/usr/bin/env python3
"""The Kubernetes deployment's static checks (tests/run.sh runs them; no cluster needed).

    target/k8s-tools/bin/python tests/kubernetes/check.py [--no-checkov] [--no-hadolint]

For every kustomization (deploy/kubernetes/base, overlays/*, examples/*):
  1. it renders with `kubectl kustomize`;
  2. every object validates strictly (unknown fields refused) against the Kubernetes JSON
     schemas of the oldest supported release (1.31) and of the newest the kubernetes-validate
     package ships. Custom resources, whose schemas that package lacks: a LeaderWorkerSet's
     leader and worker templates validate as the PodTemplateSpecs they are and its metadata as
     ObjectMeta; for LeaderWorkerSet, PodMonitor, InferencePool and HTTPRoute the spec is held to
     a strict schema of the fields ferrite uses (schemas.py, written from each project's API
     types);
  3. the objects agree with each other: Service, NetworkPolicy, PodDisruptionBudget and
     PodMonitor selectors select pods of the same rendering and name ports those pods declare;
     probes name declared ports; referenced ConfigMaps, ServiceAccounts and claims exist; every
     container has requests and limits and the restricted security settings; a worker's grace
     period covers its drain; tensor-parallel sizes match GPU counts; a LeaderWorkerSet's
     templates differ only where rank 0 does, and its ranks take FERRITE_TP and FERRITE_RANK
     from what LWS injects, one GPU each;
then checkov over all renderings (skips in deploy/kubernetes/.checkov.yaml) and hadolint over
deploy/docker/Dockerfile. Prints one line per failure and a closing `N passed, M failed`.
"""

import argparse
import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate

sys.path.insert(0, str(Path(__file__).resolve().parent))
import render  # noqa: E402
import schemas  # noqa: E402

ROOT = render.ROOT
KUBERNETES = render.KUBERNETES
OLDEST = "1.31"
RENDERED = ROOT / "target" / "kubernetes" / "rendered"

WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}


class Report:
    def __init__(self):
        self.passed = 0
        self.failed = []

    def check(self, ok, what):
        if ok:
            self.passed += 1
        else:
            self.failed.append(what)
            print(f"FAIL {what}")
        return ok


def name_of(obj):
    return f"{obj['kind']}/{obj['metadata']['name']}"


def pod_templates(obj):
    """(label, PodTemplateSpec) pairs of a workload or a LeaderWorkerSet."""
    kind = obj["kind"]
    if kind in WORKLOADS:
        return [(name_of(obj), obj["spec"]["template"])]
    if kind == "LeaderWorkerSet":
        lwt = obj["spec"]["leaderWorkerTemplate"]
        out = [(f"{name_of(obj)} workerTemplate", lwt["workerTemplate"])]
        if "leaderTemplate" in lwt:
            out.insert(0, (f"{name_of(obj)} leaderTemplate", lwt["leaderTemplate"]))
        return out
    return []


def template_labels(obj, template):
    """The labels pods of `template` carry (LWS adds its own on top of the template's)."""
    labels = dict(template.get("metadata", {}).get("labels", {}))
    if obj["kind"] == "LeaderWorkerSet":
        labels["leaderworkerset.sigs.k8s.io/name"] = obj["metadata"]["name"]
    return labels


def matches(selector, labels):
    """Whether a LabelSelector (matchLabels only, as ferrite's use) or a plain map selects."""
    if selector is None:
        return False
    wanted = selector.get("matchLabels", selector) if isinstance(selector, dict) else {}
    if "matchExpressions" in selector:
        return False
    return bool(wanted) and all(labels.get(k) == v for k, v in wanted.items())


def containers(template):
    spec = template["spec"]
    return spec.get("initContainers", []) + spec.get("containers", [])


def port_names(template):
    return {p["name"] for c in template["spec"].get("containers", []) for p in c.get("ports", []) if "name" in p}


def port_numbers(template):
    return {p["containerPort"] for c in template["spec"].get("containers", []) for p in c.get("ports", [])}


def has_port(template, port):
    return port in port_names(template) if isinstance(port, str) else port in port_numbers(template)


# ---------------------------------------------------------------------------------------------
# 2. schemas


def validate_k8s(report, where, obj, versions):
    for version in versions:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
            report.check(True, "")
        except kubernetes_validate.ValidationError as e:
            path = "/".join(str(p) for p in e.path)
            report.check(False, f"{where}: {name_of(obj)} invalid for Kubernetes {version} at {path}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError:
            report.check(False, f"{where}: {name_of(obj)}: no schema for {obj['apiVersion']} {obj['kind']}")


def validate_custom(report, where, obj, versions):
    """What can be checked of a custom resource: metadata as ObjectMeta, embedded pod templates
    as PodTemplates, and the spec against schemas.py."""
    meta_only = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}
    validate_k8s(report, where, meta_only, versions)
    for label, template in pod_templates(obj):
        as_pod_template = {"apiVersion": "v1", "kind": "PodTemplate",
                           "metadata": {"name": obj["metadata"]["name"]}, "template": template}
        for version in versions:
            try:
                kubernetes_validate.validate(as_pod_template, version, strict=True)
                report.check(True, "")
            except kubernetes_validate.ValidationError as e:
                path = "/".join(str(p) for p in e.path)
                report.check(False, f"{where}: {label} invalid as a PodTemplateSpec ({version}) at {path}: {e.message}")
    schema = schemas.CUSTOM.get((obj["apiVersion"], obj["kind"]))
    if not report.check(schema is not None, f"{where}: {name_of(obj)}: no schema for {obj['apiVersion']} {obj['kind']}"):
        return
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(obj), key=lambda e: list(e.path))
    for e in errors:
        path = "/".join(str(p) for p in e.path)
        report.check(False, f"{where}: {name_of(obj)} at {path}: {e.message}")
    if not errors:
        report.check(True, "")


def is_builtin(obj):
    return (obj["apiVersion"], obj["kind"]) not in schemas.CUSTOM


# ---------------------------------------------------------------------------------------------
# 3. the objects agree with each other


def check_consistency(report, where, objs):
    by_kind = {}
    for o in objs:
        by_kind.setdefault(o["kind"], {})[o["metadata"]["name"]] = o
    templates = [(o, label, t) for o in objs for label, t in pod_templates(o)]

    def selected(selector):
        return [(o, label, t) for o, label, t in templates if matches(selector, template_labels(o, t))]

    for svc in by_kind.get("Service", {}).values():
        sel = svc["spec"].get("selector")
        pods = selected(sel)
        report.check(bool(pods), f"{where}: {name_of(svc)} selects no pod")
        for o, label, t in pods:
            for port in svc["spec"]["ports"]:
                target = port.get("targetPort", port["port"])
                report.check(has_port(t, target), f"{where}: {name_of(svc)} port {port['name']} targets {target!r}, which {label} does not declare")

    for np in by_kind.get("NetworkPolicy", {}).values():
        pods = selected(np["spec"]["podSelector"])
        report.check(bool(pods), f"{where}: {name_of(np)} selects no pod")
        for rule in np["spec"].get("ingress", []):
            for peer in rule.get("from", []):
                if "podSelector" in peer and "namespaceSelector" not in peer:
                    report.check(bool(selected(peer["podSelector"])), f"{where}: {name_of(np)} admits pods {peer['podSelector']} that do not exist")
            for port in rule.get("ports", []):
                p = port.get("port")
                report.check(any(has_port(t, p) for _, _, t in pods) if isinstance(p, str) else True,
                             f"{where}: {name_of(np)} names port {p!r} that no selected pod declares")

    for pdb in by_kind.get("PodDisruptionBudget", {}).values():
        report.check(bool(selected(pdb["spec"]["selector"])), f"{where}: {name_of(pdb)} selects no pod")

    for pm in by_kind.get("PodMonitor", {}).values():
        pods = selected(pm["spec"]["selector"])
        report.check(bool(pods), f"{where}: {name_of(pm)} selects no pod")
        ports = {e["port"] for e in pm["spec"]["podMetricsEndpoints"]}
        for o, label, t in pods:
            # The ranks > 0 of a multinode pool serve no /metrics: a LeaderWorkerSet's workers
            # are not scraped, its leader is.
            if o["kind"] == "LeaderWorkerSet" and label.endswith("workerTemplate"):
                continue
            report.check(bool(ports & port_names(t)), f"{where}: {name_of(pm)} scrapes none of {sorted(ports)} on {label}")
    for ip in by_kind.get("InferencePool", {}).values():
        pods = selected(ip["spec"]["selector"])
        report.check(bool(pods), f"{where}: {name_of(ip)} selects no pod")
        for o, label, t in pods:
            for p in ip["spec"]["targetPorts"]:
                report.check(has_port(t, p["number"]), f"{where}: {name_of(ip)} targets port {p['number']} that {label} lacks")
        epp = ip["spec"]["endpointPickerRef"]
        svc = by_kind.get("Service", {}).get(epp["name"])
        report.check(svc is not None and any(p["port"] == epp["port"]["number"] for p in svc["spec"]["ports"]),
                     f"{where}: {name_of(ip)}'s endpoint picker {epp['name']}:{epp['port']['number']} is no Service port")

    # A gateway keeps the Responses API's stored responses in its memory: with more than one
    # replica, a client must keep reaching the one that answered it.
    gateway = by_kind.get("Service", {}).get("ferrite-gateway")
    if gateway is not None:
        report.check(gateway["spec"].get("sessionAffinity") == "ClientIP",
                     f"{where}: {name_of(gateway)} is not sticky (sessionAffinity: ClientIP), so "
                     "previous_response_id would miss on another gateway replica")

    for hpa in by_kind.get("HorizontalPodAutoscaler", {}).values():
        ref = hpa["spec"]["scaleTargetRef"]
        report.check(ref["name"] in by_kind.get(ref["kind"], {}), f"{where}: {name_of(hpa)} scales a missing {ref['kind']}/{ref['name']}")

    for o, label, t in templates:
        check_pod(report, where, by_kind, o, label, t)

    for lws in by_kind.get("LeaderWorkerSet", {}).values():
        check_leader_worker(report, where, lws)


def probe_port(probe):
    for kind in ("grpc", "httpGet", "tcpSocket"):
        if kind in probe:
            return probe[kind]["port"]
    return None


def env_value(container, name):
    for e in container.get("env", []):
        if e["name"] == name:
            return e.get("value")
    return None


def check_pod(report, where, by_kind, obj, label, template):
    spec = template["spec"]
    sa = spec.get("serviceAccountName")
    report.check(sa in by_kind.get("ServiceAccount", {}), f"{where}: {label} runs as a missing ServiceAccount {sa!r}")
    if sa in by_kind.get("ServiceAccount", {}):
        needs_token = by_kind["ServiceAccount"][sa].get("automountServiceAccountToken", True)
        report.check(spec.get("automountServiceAccountToken") is needs_token,
                     f"{where}: {label}: automountServiceAccountToken must be set, and true only where the ServiceAccount needs a token")
    psc = spec.get("securityContext", {})
    report.check(psc.get("runAsNonRoot") is True and psc.get("seccompProfile", {}).get("type") == "RuntimeDefault",
                 f"{where}: {label}: pod securityContext needs runAsNonRoot and seccomp RuntimeDefault")
    for v in spec.get("volumes", []):
        if "configMap" in v:
            report.check(v["configMap"]["name"] in by_kind.get("ConfigMap", {}), f"{where}: {label} mounts a missing ConfigMap {v['configMap']['name']}")
        if "persistentVolumeClaim" in v:
            report.check(v["persistentVolumeClaim"]["claimName"] in by_kind.get("PersistentVolumeClaim", {}),
                         f"{where}: {label} mounts a missing claim {v['persistentVolumeClaim']['claimName']}")
    volumes = {v["name"] for v in spec.get("volumes", [])}
    volumes |= {c["metadata"]["name"] for c in obj.get("spec", {}).get("volumeClaimTemplates", [])}
    for c in containers(template):
        cname = f"{label} container {c['name']}"
        res = c.get("resources", {})
        for part in ("requests", "limits"):
            for r in ("cpu", "memory"):
                report.check(r in res.get(part, {}), f"{where}: {cname} has no {part}.{r}")
        sc = c.get("securityContext", {})
        report.check(sc.get("allowPrivilegeEscalation") is False and sc.get("readOnlyRootFilesystem") is True
                     and sc.get("capabilities", {}).get("drop") == ["ALL"],
                     f"{where}: {cname}: needs allowPrivilegeEscalation false, readOnlyRootFilesystem, capabilities drop ALL")
        for ref in c.get("envFrom", []):
            if "configMapRef" in ref:
                report.check(ref["configMapRef"]["name"] in by_kind.get("ConfigMap", {}), f"{where}: {cname} reads a missing ConfigMap")
        for m in c.get("volumeMounts", []):
            report.check(m["name"] in volumes, f"{where}: {cname} mounts a missing volume {m['name']}")
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            if kind in c:
                port = probe_port(c[kind])
                declared = {p.get("name") for p in c.get("ports", [])} | {p["containerPort"] for p in c.get("ports", [])}
                report.check(port in declared, f"{where}: {cname} {kind} probes port {port!r}, which the container does not declare")
        if c in spec.get("containers", []) and obj["kind"] != "Job":
            report.check("readinessProbe" in c and "livenessProbe" in c, f"{where}: {cname} lacks a readiness or liveness probe")
        check_drain(report, where, cname, spec, c)
        check_tp(report, where, cname, c)


def check_drain(report, where, cname, spec, c):
    """A worker's grace period covers its preStop and its drain, with 10 s to spare."""
    drain = env_value(c, "FERRITE_DRAIN_TIMEOUT_S")
    if drain is None:
        return
    pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    grace = spec.get("terminationGracePeriodSeconds", 30)
    if pre_stop:
        # A rank > 0 outlives its leader's drain; the grace period covers the sleep.
        report.check(pre_stop >= int(drain) and grace >= pre_stop + 10,
                     f"{where}: {cname}: preStop {pre_stop}s must cover the drain ({drain}s) and the grace period {grace}s the preStop + 10s")
    else:
        report.check(grace >= int(drain) + 10, f"{where}: {cname}: grace period {grace}s < drain {drain}s + 10s")


def check_tp(report, where, cname, c):
    tp = env_value(c, "FERRITE_TP")
    gpus = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
    if tp is None or gpus is None or tp.startswith("$("):
        return
    args = c.get("args", [])
    # `serve --tp N` puts N ranks in the pod; a `worker` is one rank on one GPU.
    want = int(tp) if args[:1] == ["serve"] else 1
    report.check(int(gpus) == want, f"{where}: {cname}: FERRITE_TP={tp} with nvidia.com/gpu {gpus}")
    # N ranks in one pod: each on a GPU of its own (NCCL refuses two on one).
    if want > 1:
        devices = env_value(c, "FERRITE_DEVICES") or ""
        listed = [d for d in devices.split(",") if d.strip()]
        report.check(sorted(int(d) for d in listed) == list(range(want)),
                     f"{where}: {cname}: FERRITE_DEVICES={devices!r} must list GPUs 0..{want - 1}, one per rank")


def check_leader_worker(report, where, lws):
    lwt = lws["spec"]["leaderWorkerTemplate"]
    report.check(lwt.get("restartPolicy") == "RecreateGroupOnPodRestart", f"{where}: {name_of(lws)}: restartPolicy must be RecreateGroupOnPodRestart")
    leader, worker = copy.deepcopy(lwt["leaderTemplate"]), copy.deepcopy(lwt["workerTemplate"])
    # The ranks > 0 declare only ports they listen on: a subset of rank 0's (which alone serves
    # the worker API, the collective listener and /metrics).
    for lc, wc in zip(leader["spec"]["containers"], worker["spec"]["containers"]):
        lp = [p for p in lc.get("ports", [])]
        report.check(all(p in lp for p in wc.get("ports", [])),
                     f"{where}: {name_of(lws)}: container {wc['name']} of the workers declares ports rank 0 does not")
    # Where rank 0 may differ from the other ranks; everything else must be the same.
    for t in (leader, worker):
        t["metadata"]["labels"].pop("ferrite.dev/rank-role", None)
        t["spec"].pop("terminationGracePeriodSeconds", None)
        t["spec"]["affinity"]["podAntiAffinity"] = None
        for c in t["spec"]["containers"]:
            for k in ("readinessProbe", "startupProbe", "lifecycle", "ports"):
                c.pop(k, None)
    report.check(leader == worker, f"{where}: {name_of(lws)}: leader and worker templates differ beyond the rank-0 fields")
    # A group is one pool: its size and each pod's rank are what LWS injects (LWS_GROUP_SIZE,
    # LWS_WORKER_INDEX, ahead of the template's env), one GPU per rank.
    for label, t in pod_templates(lws):
        for c in t["spec"]["containers"]:
            if c.get("args", [])[:1] != ["worker"]:
                continue
            cname = f"{label} container {c['name']}"
            report.check(env_value(c, "FERRITE_TP") == "$(LWS_GROUP_SIZE)", f"{where}: {cname}: FERRITE_TP must be $(LWS_GROUP_SIZE)")
            report.check(env_value(c, "FERRITE_RANK") == "$(LWS_WORKER_INDEX)", f"{where}: {cname}: FERRITE_RANK must be $(LWS_WORKER_INDEX)")
            gpus = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
            report.check(gpus is None or int(gpus) == 1, f"{where}: {cname}: one rank per pod drives one GPU, not {gpus}")


# ---------------------------------------------------------------------------------------------
# the rest


def check_dashboard(report):
    a = (ROOT / "deploy/grafana/ferrite-dashboard.json").read_bytes()
    b = (KUBERNETES / "base/observability/ferrite-dashboard.json").read_bytes()
    report.check(a == b, "deploy/kubernetes/base/observability/ferrite-dashboard.json differs from deploy/grafana/ferrite-dashboard.json (copy it again)")


def check_epp_metric_names(report, objs):
    """The EPP's metric flags name metrics ferrite exports."""
    names = (ROOT / "services/telemetry/src/metrics.rs").read_text()
    for o in objs:
        if o["kind"] != "Deployment":
            continue
        for c in o["spec"]["template"]["spec"]["containers"]:
            for arg in c.get("args", []):
                m = re.match(r"--[a-z-]+-metric=(.+)", arg)
                if m:
                    report.check(f'"{m.group(1)}"' in names, f"EPP flag {arg}: no such metric in services/telemetry/src/metrics.rs")


def run_checkov(report, bin_dir):
    cmd = [str(bin_dir / "checkov"), "--directory", str(RENDERED), "--framework", "kubernetes",
           "--config-file", str(KUBERNETES / ".checkov.yaml"), "--output", "json", "--quiet"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    try:
        results = json.loads(out.stdout)
    except json.JSONDecodeError:
        report.check(False, f"checkov printed no JSON (exit {out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        return
    results = results if isinstance(results, list) else [results]
    passed = failed = skipped = 0
    for r in results:
        summary = r.get("summary", {})
        passed += summary.get("passed", 0)
        failed += summary.get("failed", 0)
        skipped += summary.get("skipped", 0)
        for f in r.get("results", {}).get("failed_checks", []):
            report.check(False, f"checkov {f['check_id']} ({f['check_name']}) on {f['resource']} in {Path(f['file_path']).name}")
    report.check(out.returncode == 0 and failed == 0, f"checkov exited {out.returncode}")
    print(f"checkov: {passed} passed, {failed} failed, {skipped} skipped (deploy/kubernetes/.checkov.yaml)")


def run_hadolint(report, bin_dir):
    docker = ROOT / "deploy/docker"
    out = subprocess.run([str(bin_dir / "hadolint"), "--config", str(docker / ".hadolint.yaml"), str(docker / "Dockerfile")],
                         capture_output=True, text=True)
    report.check(out.returncode == 0, f"hadolint deploy/docker/Dockerfile:\n{out.stdout}{out.stderr}")
    print(f"hadolint: deploy/docker/Dockerfile {'clean' if out.returncode == 0 else 'FAILED'}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-checkov", action="store_true")
    parser.add_argument("--no-hadolint", action="store_true")
    args = parser.parse_args()
    bin_dir = Path(sys.executable).parent
    versions = [OLDEST, kubernetes_validate.utils.latest_version()]
    report = Report()
    RENDERED.mkdir(parents=True, exist_ok=True)
    for old in RENDERED.glob("*.yaml"):
        old.unlink()
    everything = []
    for name in render.kustomizations():
        try:
            text = render.render_yaml(name)
        except RuntimeError as e:
            report.check(False, str(e))
            continue
        objs = [o for o in render.yaml.safe_load_all(text) if o]
        (RENDERED / (name.replace("/", "-") + ".yaml")).write_text(text)
        everything += objs
        kinds = {}
        for o in objs:
            kinds[o["kind"]] = kinds.get(o["kind"], 0) + 1
            if is_builtin(o):
                validate_k8s(report, name, o, versions)
            else:
                validate_custom(report, name, o, versions)
        check_consistency(report, name, objs)
        listed = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        print(f"{name}: {len(objs)} objects ({listed})")
    print(f"validated against Kubernetes {' and '.join(versions)} (strict)")
    check_dashboard(report)
    check_epp_metric_names(report, everything)
    if not args.no_checkov:
        run_checkov(report, bin_dir)
    if not args.no_hadolint:
        run_hadolint(report, bin_dir)
    print(f"kubernetes: {report.passed} passed, {len(report.failed)} failed")
    sys.exit(1 if report.failed else 0)


if __name__ == "__main__":
    main()
