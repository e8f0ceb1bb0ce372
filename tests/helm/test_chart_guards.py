"""Chart guards added after the real API server run (issue 16): PDBs, rollout override, the server's
security context, the `helm test` hook, and values the validate helper must still accept.

The rejections themselves are bad-values files (test_helm_chart.py::test_bad_values_rejected); the
cluster tier (tests/helm_cluster) shows the API server refuses the same values and admits the pods.
"""

from __future__ import annotations

import pytest
from helm_chart_support import by_kind, ci_file, component

pytestmark = pytest.mark.helm


def _pdb_components(docs) -> set[str]:
    return {p["metadata"]["labels"]["app.kubernetes.io/component"] for p in by_kind(docs, "PodDisruptionBudget")}


def test_pdb_only_with_more_than_one_replica(render) -> None:
    assert _pdb_components(render()) == set()  # one replica: no budget that pretends to protect it
    docs = render(None, "--set", "server.replicaCount=2")
    (pdb,) = by_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert _pdb_components(render(None, "--set", "hpa.enabled=true", "--set", "hpa.minReplicas=3")) == {"server"}
    assert _pdb_components(render(ci_file("everything-on"))) == {"server", "quality-sidecar"}


def test_rollout_override(render) -> None:
    docs = render(None, "--set", "server.maxUnavailable=1", "--set", "server.maxSurge=0")
    rolling = component(docs, "Deployment", "server")["spec"]["strategy"]["rollingUpdate"]
    assert rolling == {"maxUnavailable": 1, "maxSurge": 0}


def test_server_meets_pod_security_restricted(render) -> None:
    """The fields PodSecurity "restricted" checks, on the server and baseline pods of every arm."""
    for docs in (render(), render(ci_file("everything-on")), render(ci_file("cpu-minimal"))):
        for d in by_kind(docs, "Deployment"):
            pod = d["spec"]["template"]["spec"]
            psc = pod.get("securityContext", {})
            assert psc.get("runAsNonRoot") is True and psc.get("seccompProfile", {}).get("type") == "RuntimeDefault"
            assert psc.get("runAsUser", 1) != 0
            for c in pod["containers"]:
                sc = c["securityContext"]
                assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
                assert not sc["capabilities"].get("add")
            assert all(set(v) & {"emptyDir", "persistentVolumeClaim", "secret", "configMap"} for v in pod["volumes"])
        server = component(docs, "Deployment", "server")["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in server["containers"][0]["env"]}
        assert env["HOME"] == "/home/vllm"  # a writable HOME for the non-root UID


def test_helm_test_hook(render) -> None:
    docs = render(ci_file("everything-on"))
    hook = component(docs, "Pod", "test-health")
    assert hook["metadata"]["annotations"]["helm.sh/hook"] == "test"
    args = hook["spec"]["containers"][0]["args"]
    assert any(a.endswith("-server:8000/health") for a in args)
    assert any(a.endswith("-quality-sidecar:9400/healthz") for a in args)
    # The sidecar NetworkPolicy restricts /healthz to metricsFrom: the hook pod is let in too.
    (policy,) = by_kind(docs, "NetworkPolicy")
    peers = policy["spec"]["ingress"][0]["from"]
    assert any(p.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component") == "test-health"
               for p in peers)


@pytest.mark.parametrize("args", [
    ("--set", "model.tensorParallelSize=2", "--set", "server.gpu.count=4",
     "--set-json", 'model.extraArgs=["--pipeline-parallel-size=2"]'),
    ("--set", "server.gpu.count=2", "--set-json", 'model.extraArgs=["--data-parallel-size", "2"]'),
    ("--set", "server.resources.requests.cpu=500m", "--set", "server.resources.limits.cpu=1"),
    ("--set", "commonLabels.team=ml-platform", "--set", "commonLabels.example\\.com/tier=gold"),
    ("--set", "server.replicaCount=2", "--set", "server.modelCache.type=pvc",
     "--set-json", 'server.modelCache.accessModes=["ReadWriteMany"]'),
], ids=["tp-x-pp", "tp-x-dp", "cpu-millicores", "prefixed-label", "rwx-cache"])
def test_validate_accepts_good_values(render, args: tuple[str, ...]) -> None:
    assert render(None, *args)  # render() asserts helm succeeded
