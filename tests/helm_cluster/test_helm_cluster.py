"""The chart on a real Kubernetes control plane (kube-apiserver 1.37 + etcd + scheduler, kwok nodes).

What `helm template` and kubeconform cannot show, checked here against the real API server:
strict server-side field validation (core kinds and the prometheus-operator/KEDA CRDs), PodSecurity
admission at the level docs/deploy.md promises, scheduling on tainted GPU nodes, a full install ->
`helm test` -> upgrade -> rollback -> uninstall for every ci/ values file, a GPU-count rollout on a full
node, and that each value the chart's validate helper rejects is one the API server rejects too.
kwok marks scheduled pods Running/Ready (and `helm test` pods Succeeded); containers do not run.
"""

from __future__ import annotations

import copy
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_cluster_support import CHART, FULL_NODE_TAINT

from tests.support.k8s_cluster import K8sCluster
from tests.support.paths import REPO_ROOT, versions

pytestmark = pytest.mark.helm_cluster

CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
CI_IDS = [p.name.removesuffix("-values.yaml") for p in CI_VALUES]
RELEASE = "demo"
INSTANCE = f"app.kubernetes.io/instance={RELEASE}"
# docs/deploy.md ("PodSecurity") promises this level for every pod of the chart, server included.
POD_SECURITY_LEVEL = "restricted"
# Secrets the ci/ values name; their contents are placeholders (no container reads them here).
SECRETS = {
    "hf-token": {"token": "x"},
    "kafka-sasl": {"username": "u", "password": "p"},
    "kafka-ca": {"ca.crt": "x"},
    "alert-webhook": {"url": "https://example.invalid/hook"},
    "kafka-user-vllm": {"user": "u", "pass": "p"},
}


# Server-side apply (no last-applied annotation: the dashboard ConfigMap is large) as a dry run, with
# strict field validation: unknown or duplicate fields are errors, for core kinds and CRDs alike.
DRY_RUN = ("apply", "--server-side", "--field-manager=ci", "--dry-run=server", "--validate=strict")


def _namespace(k8s: K8sCluster, name: str) -> str:
    labels = {f"pod-security.kubernetes.io/{mode}": POD_SECURITY_LEVEL
              for mode in ("enforce", "warn", "audit")}
    k8s.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
    for secret, data in SECRETS.items():
        k8s.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret, "namespace": name},
                   "stringData": data})
    return name


def _ok(proc, what: str) -> str:
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _render(helm, ns: str, *args: str) -> str:
    """The manifests `helm install` would send, with the capabilities this cluster has."""
    return _ok(helm("template", RELEASE, str(CHART), "-n", ns,
                    "--kube-version", versions()["K8S_VERSION"].lstrip("v"),
                    "--api-versions", "monitoring.coreos.com/v1", "--api-versions", "keda.sh/v1alpha1",
                    *args), "helm template")


def _release_pods(k8s: K8sCluster, ns: str) -> list[dict[str, Any]]:
    """The release's long-running pods (Deployments' ReplicaSets), not `helm test` pods or Jobs."""
    pods = k8s.get_json("pods", "-n", ns, "-l", INSTANCE)["items"]
    return [p for p in pods
            if any(o["kind"] == "ReplicaSet" for o in p["metadata"].get("ownerReferences", []))]


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.3)


def _server_env(k8s: K8sCluster, ns: str, component: str = "server") -> dict[str, str]:
    deploy = k8s.get_json("deployment", "-n", ns, "-l", f"{INSTANCE},app.kubernetes.io/component={component}")
    (item,) = deploy["items"]
    container = item["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def _assert_release_running(k8s: K8sCluster, ns: str, values: dict[str, Any]) -> None:
    """Every Deployment rolled out, every pod admitted, Ready and on the right kind of node."""
    def settled(d: dict[str, Any]) -> bool:
        st = d["status"]
        return st.get("observedGeneration") == d["metadata"]["generation"] and d["spec"]["replicas"] >= 1 \
            and st.get("updatedReplicas") == st.get("readyReplicas") == st.get("replicas") == d["spec"]["replicas"]

    # A Deployment an HPA owns has no replicas in the chart (helm must not fight the HPA), so it starts
    # at 1 and the HPA controller scales it to minReplicas *after* `helm --wait` may have returned: for
    # those, wait for the HPA's minimum to be rolled out; every other Deployment must be complete now.
    hpa_min = {h["spec"]["scaleTargetRef"]["name"]: h["spec"].get("minReplicas", 1)
               for h in k8s.get_json("hpa", "-n", ns, "-l", INSTANCE)["items"]}
    for d in k8s.get_json("deployments", "-n", ns, "-l", INSTANCE)["items"]:
        name = d["metadata"]["name"]
        if name in hpa_min:
            def scaled(name: str = name) -> bool:
                cur = k8s.get_json("deployment", name, "-n", ns)
                return settled(cur) and cur["spec"]["replicas"] >= hpa_min[name]
            _wait(scaled, 90, f"{name} to roll out the HPA's minReplicas={hpa_min[name]}")
        else:  # `helm --wait` returned: the rollout must be complete, not just started
            assert settled(d), (name, d["status"])
    for rs in k8s.get_json("replicasets", "-n", ns, "-l", INSTANCE)["items"]:
        failures = [c for c in rs["status"].get("conditions", []) if c["type"] == "ReplicaFailure"]
        assert not failures, f"{rs['metadata']['name']}: {failures}"  # e.g. PodSecurity refused a pod
    pods = _release_pods(k8s, ns)
    assert pods, "no pods"
    nodes = {n["metadata"]["name"]: n for n in k8s.get_json("nodes")["items"]}
    gpus = int(values.get("server", {}).get("gpu", {}).get("count", 1))
    for pod in pods:
        ready = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
        assert pod["status"]["phase"] == "Running" and ready.get("Ready") == "True", pod["metadata"]["name"]
        node = nodes[pod["spec"]["nodeName"]]
        has_gpu = "nvidia.com/gpu" in node["status"]["allocatable"]
        component = pod["metadata"]["labels"]["app.kubernetes.io/component"]
        if component in ("server", "baseline"):
            assert has_gpu == (gpus > 0), (component, node["metadata"]["name"])
        else:
            assert not has_gpu, (component, node["metadata"]["name"])  # no GPU toleration


def test_control_plane_is_real(k8s: K8sCluster) -> None:
    version = json.loads(k8s.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == versions()["K8S_VERSION"]
    nodes = k8s.get_json("nodes")["items"]
    ready = {n["metadata"]["name"] for n in nodes
             if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])}
    assert ready == {"kwok-gpu-0", "kwok-gpu-1", "kwok-cpu-0", "kwok-gpu-full"}
    crds = set(k8s.crds)  # type: ignore[attr-defined]
    assert {"servicemonitors.monitoring.coreos.com", "podmonitors.monitoring.coreos.com",
            "prometheusrules.monitoring.coreos.com", "scaledobjects.keda.sh"} <= crds


@pytest.mark.parametrize("values_file", CI_VALUES, ids=CI_IDS)
def test_release_lifecycle(k8s: K8sCluster, helm, values_file: Path, record_property) -> None:
    """dry-run (strict) -> install -> helm test -> upgrade -> rollback -> uninstall, on the real server."""
    started, steps = time.monotonic(), {}

    def step(name: str) -> None:  # seconds per step, in the JUnit XML (benchmarks/results/helm_cluster_tier.json)
        steps[name] = round(time.monotonic() - started - sum(steps.values()), 2)

    ns = _namespace(k8s, "ci-" + values_file.name.removesuffix("-values.yaml"))
    values = yaml.safe_load(values_file.read_text()) or {}

    # 1. Server-side dry-run of every manifest (hook pod included) with strict field validation.
    #    PodSecurity "warn" is on, so a pod template below the level shows up as a warning here.
    dry = k8s.kubectl(*DRY_RUN, "-n", ns, "-f", "-",
                      input=_render(helm, ns, "-f", str(values_file)), check=False)
    assert dry.returncode == 0, dry.stderr
    assert "Warning" not in dry.stderr, dry.stderr

    step("dry_run")

    # 2. Install and wait: pods admitted under enforce=<level>, scheduled, Ready.
    notes = _ok(helm("install", RELEASE, str(CHART), "-n", ns, "-f", str(values_file), "--wait",
                     "--timeout", "120s"), "helm install")
    _assert_release_running(k8s, ns, values)
    server = values.get("server", {})
    hpa = values.get("hpa", {})
    replicas = hpa.get("minReplicas", 1) if hpa.get("enabled") else server.get("replicaCount", 1)
    single = replicas == 1 and server.get("pdb", {}).get("enabled", True)
    assert ("one server replica, so no PodDisruptionBudget" in notes) == single, notes
    pdbs = {p["metadata"]["labels"]["app.kubernetes.io/component"]
            for p in k8s.get_json("pdb", "-n", ns, "-l", INSTANCE)["items"]}
    assert ("server" in pdbs) == (replicas > 1 and server.get("pdb", {}).get("enabled", True)), pdbs
    rate = _server_env(k8s, ns)["VLLM_LOOKAHEAD_SAMPLE_RATE"]

    step("install")

    # 3. helm test: the hook pod is created, admitted under the same level, and (kwok) succeeds.
    out = _ok(helm("test", RELEASE, "-n", ns, "--timeout", "60s"), "helm test")
    assert re.search(r"TEST SUITE:\s+\S+-test-health", out) and re.search(r"Phase:\s+Succeeded", out), out
    hook = k8s.get_json("pods", "-n", ns, "-l", f"{INSTANCE},app.kubernetes.io/component=test-health")
    (pod,) = hook["items"]
    assert pod["status"]["phase"] == "Succeeded"

    step("helm_test")

    # 4. Upgrade with a changed pod template: a rollout on the server, revision 2.
    _ok(helm("upgrade", RELEASE, str(CHART), "-n", ns, "-f", str(values_file),
             "--set-json", "telemetry.sampler.rate=0.5", "--wait", "--timeout", "120s"), "helm upgrade")
    assert _server_env(k8s, ns)["VLLM_LOOKAHEAD_SAMPLE_RATE"] == "0.5"
    _assert_release_running(k8s, ns, values)

    step("upgrade")

    # 5. Rollback to revision 1: the old template is back and rolled out (revision 3).
    _ok(helm("rollback", RELEASE, "1", "-n", ns, "--wait", "--timeout", "120s"), "helm rollback")
    assert _server_env(k8s, ns)["VLLM_LOOKAHEAD_SAMPLE_RATE"] == rate
    _assert_release_running(k8s, ns, values)
    history = json.loads(_ok(helm("history", RELEASE, "-n", ns, "-o", "json"), "helm history"))
    assert [h["revision"] for h in history] == [1, 2, 3] and history[-1]["status"] == "deployed"

    step("rollback")

    # 6. Uninstall: every workload and pod goes; a chart-made model-cache PVC is kept on purpose.
    _ok(helm("uninstall", RELEASE, "-n", ns, "--wait", "--timeout", "60s"), "helm uninstall")
    # (The last `helm test` pod stays, by its hook-delete-policy, so its log can be read.)
    _wait(lambda: not _release_pods(k8s, ns), 30, "pods to go")
    assert not k8s.get_json("deployments,services,configmaps", "-n", ns, "-l", INSTANCE)["items"]
    pvcs = k8s.get_json("pvc", "-n", ns, "-l", INSTANCE)["items"]
    if values.get("server", {}).get("modelCache", {}).get("type") == "pvc":
        (pvc,) = pvcs  # helm.sh/resource-policy: keep, bound to the static RWX volume
        assert pvc["status"]["phase"] == "Bound" and pvc["spec"]["volumeName"] == "model-cache-rwx"
        k8s.kubectl("delete", "pvc", pvc["metadata"]["name"], "-n", ns, "--wait=false")
    else:
        assert not pvcs
    step("uninstall")
    record_property("steps_s", json.dumps(steps))


def test_pod_security_is_enforced(k8s: K8sCluster) -> None:
    """The namespace level is really enforced: a root pod without a seccomp profile is refused."""
    ns = _namespace(k8s, "ci-podsecurity")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "root", "namespace": ns},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    proc = k8s.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    assert proc.returncode != 0 and f'violates PodSecurity "{POD_SECURITY_LEVEL}' in proc.stderr, proc.stderr


def test_docs_promise_the_tested_level() -> None:
    text = (REPO_ROOT / "docs" / "deploy.md").read_text()
    assert f"PodSecurity `{POD_SECURITY_LEVEL}`" in text


def test_gpu_count_change_on_a_full_node(k8s: K8sCluster, helm) -> None:
    """2 pods x 1 GPU fill a 2-GPU node; moving to 1 pod x 2 GPUs deadlocks with the default
    surge-first strategy and completes with server.maxUnavailable=1, maxSurge=0."""
    ns = _namespace(k8s, "ci-full-node")
    base = [
        "--set", "sidecar.enabled=false",
        "--set", "monitoring.serviceMonitor.enabled=false", "--set", "monitoring.prometheusRule.enabled=false",
        "--set", "monitoring.grafanaDashboard.enabled=false",
        "--set", "server.nodeSelector.vllm-lookahead\\.test/pool=full",
        "--set-json", "server.tolerations=" + json.dumps([
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": FULL_NODE_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}]),
    ]
    _ok(helm("install", RELEASE, str(CHART), "-n", ns, *base, "--set", "server.replicaCount=2",
             "--wait", "--timeout", "60s"), "helm install")
    assert len(_release_pods(k8s, ns)) == 2
    two_gpus = ["--set", "server.replicaCount=1", "--set", "server.gpu.count=2",
                "--set", "model.tensorParallelSize=2"]
    _ok(helm("upgrade", RELEASE, str(CHART), "-n", ns, *base, *two_gpus), "helm upgrade (default strategy)")

    def pending_new_pod() -> dict[str, Any] | None:
        for pod in _release_pods(k8s, ns):
            gpus = pod["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu")
            sched = {c["type"]: c for c in pod["status"].get("conditions", [])}.get("PodScheduled", {})
            if gpus == "2" and sched.get("reason") == "Unschedulable":
                return sched
        return None

    def old_pods() -> list[dict[str, Any]]:
        return [p for p in _release_pods(k8s, ns) if "deletionTimestamp" not in p["metadata"]
                and p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"]

    sched = _wait(pending_new_pod, 30, "the 2-GPU pod to be unschedulable")
    assert "Insufficient nvidia.com/gpu" in sched["message"], sched
    # The old ReplicaSet goes down to 1 (maxUnavailable 0 keeps one available), freeing one GPU of
    # the two the new pod needs; then nothing moves: the old pod stays, the new one waits.
    _wait(lambda: len(old_pods()) == 1, 30, "the old ReplicaSet to scale down to one pod")
    time.sleep(3)
    (old,) = old_pods()
    assert old["status"]["phase"] == "Running" and pending_new_pod() is not None

    _ok(helm("upgrade", RELEASE, str(CHART), "-n", ns, *base, *two_gpus,
             "--set", "server.maxUnavailable=1", "--set", "server.maxSurge=0", "--wait", "--timeout", "60s"),
        "helm upgrade (maxUnavailable 1)")
    _wait(lambda: [p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
                   for p in _release_pods(k8s, ns)] == ["2"], 30, "one 2-GPU pod")
    # helm's --wait counts a Deployment ready at replicas - maxUnavailable ready pods (here 0), so
    # it can return before the new pod is Ready: wait for the rollout itself (docs/deploy.md).
    k8s.kubectl("rollout", "status", "deployment", "-n", ns, "-l", INSTANCE, "--timeout=60s", timeout=70)
    _assert_release_running(k8s, ns, {"server": {"gpu": {"count": 2}}})
    _ok(helm("uninstall", RELEASE, "-n", ns, "--wait"), "helm uninstall")


def _mutate(docs: list[dict[str, Any]], kind: str, component: str, change) -> list[dict[str, Any]]:
    out = copy.deepcopy(docs)
    (target,) = [d for d in out if d["kind"] == kind
                 and d["metadata"]["labels"].get("app.kubernetes.io/component") == component]
    change(target)
    return out


def _server_container(d: dict[str, Any]) -> dict[str, Any]:
    return d["spec"]["template"]["spec"]["containers"][0]


# The four values schema + kubeconform accepted but the API server refused (issue 16): each as a
# mutation of the rendered defaults, the API server's message, and the chart's bad-values file.
API_RULES = {
    "kafka-port": (
        "NetworkPolicy", "quality-sidecar",
        lambda d: d["spec"]["egress"][1]["ports"][0].update(port=99999),
        r"must be between 1 and 65535", "kafka-port-out-of-range.yaml"),
    "liveness-success-threshold": (
        "Deployment", "server",
        lambda d: _server_container(d)["livenessProbe"].update(successThreshold=2),
        r"livenessProbe.successThreshold: Invalid value: 2: must be 1", "liveness-success-threshold.yaml"),
    "label-with-space": (
        "Deployment", "server",
        lambda d: d["metadata"]["labels"].update(team="ml platform"),
        r"a valid label must be an empty string or consist of alphanumeric", "label-value-with-space.yaml"),
    "memory-request-above-limit": (
        "Deployment", "server",
        lambda d: _server_container(d)["resources"]["requests"].update(memory="64Gi"),
        r"must be less than or equal to memory limit", "memory-request-above-limit.yaml"),
}


@pytest.mark.parametrize("rule", list(API_RULES))
def test_chart_rejects_what_the_api_server_rejects(k8s: K8sCluster, helm, rule: str) -> None:
    kind, component, change, server_msg, bad_file = API_RULES[rule]
    ns = _namespace(k8s, "ci-rules")
    docs = [d for d in yaml.safe_load_all(_render(helm, ns)) if d]
    broken = _mutate(docs, kind, component, change)
    proc = k8s.kubectl(*DRY_RUN, "-n", ns, "-f", "-",
                       input="\n---\n".join(yaml.safe_dump(d) for d in broken), check=False)
    assert proc.returncode != 0 and re.search(server_msg, proc.stderr), proc.stderr
    # ...and the chart refuses the value first, with its own message, before talking to the server.
    bad = REPO_ROOT / "tests" / "helm" / "bad-values" / bad_file
    expected = bad.read_text().splitlines()[0].removeprefix("# expect: ")
    install = helm("install", "rejected", str(CHART), "-n", ns, "-f", str(bad))
    assert install.returncode != 0 and re.search(expected, install.stderr), install.stderr
    assert not k8s.get_json("secrets", "-n", ns, "-l", "owner=helm,name=rejected")["items"]
