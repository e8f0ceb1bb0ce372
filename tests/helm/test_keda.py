"""The optional KEDA ScaledObjects: what they scale, that KEDA understands them, what they query.

- ci/keda-values.yaml renders a ScaledObject per Deployment, no HPA (KEDA owns it) and no
  `replicas` field on the scaled Deployments (the chart would fight the autoscaler on upgrade);
- every trigger metadata and TriggerAuthentication parameter is one KEDA's pinned scaler source
  declares (struct tags of pkg/scalers/*_scaler.go in the KEDA Go module), enum values included -
  the CRD leaves trigger metadata free-form, so the API server cannot catch a misspelt key;
- the prometheus queries parse and, evaluated by promtool, count only this release's pods (not the
  baseline arm, another release or another namespace);
- contradictory settings fail the render with a message.
The ScaledObject/TriggerAuthentication schemas themselves are checked by kubeconform (KEDA CRDs in
the offline schemas) and by the helm_cluster tier, which installs every ci/ file.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_chart_support import CHART, NAMESPACE, RELEASE, by_kind, ci_file, run_helm

from tests.support.paths import tool, versions

pytestmark = pytest.mark.helm


@cache
def _keda_params(scaler: str) -> dict[str, dict[str, Any]]:
    """name -> {orders, enum} from the `keda:"..."` struct tags of one pinned KEDA scaler."""
    mod = f"github.com/kedacore/keda/v2@{versions()['KEDA_VERSION']}"
    proc = subprocess.run(["go", "mod", "download", "-json", mod], capture_output=True, text=True, timeout=300,
                          check=False, env={**os.environ, "GOFLAGS": "-mod=mod"}, cwd="/")
    assert proc.returncode == 0, f"{mod} not in the Go module cache: run scripts/setup.sh k8s\n{proc.stderr}"
    src = (Path(json.loads(proc.stdout)["Dir"]) / "pkg" / "scalers" / f"{scaler}_scaler.go").read_text()
    out = {}
    for tag in re.findall(r'keda:"([^"]+)"', src):
        fields = dict(f.strip().split("=", 1) for f in tag.split(",") if "=" in f)
        if "name" in fields:
            out[fields["name"]] = {"orders": set(fields.get("order", "").split(";")),
                                   "enum": set(fields["enum"].split(";")) if "enum" in fields else None}
    assert len(out) > 5, f"no keda tags parsed from {scaler}_scaler.go"
    return out


def _objects(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["labels"]["app.kubernetes.io/component"]: d for d in by_kind(docs, "ScaledObject")}


def test_keda_off_by_default(render) -> None:
    docs = render(ci_file("defaults"))
    assert not by_kind(docs, "ScaledObject") and not by_kind(docs, "TriggerAuthentication")


def test_scaled_objects_target_the_deployments_and_own_their_replicas(render) -> None:
    docs = render(ci_file("keda"))
    objs = _objects(docs)
    assert set(objs) == {"server", "quality-sidecar"}
    deployments = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
    for so in objs.values():
        target = so["spec"]["scaleTargetRef"]
        assert target["kind"] == "Deployment" and target["name"] in deployments
        assert "replicas" not in deployments[target["name"]]["spec"], target["name"]
        assert so["spec"]["minReplicaCount"] <= so["spec"]["maxReplicaCount"]
    assert not by_kind(docs, "HorizontalPodAutoscaler")
    server = objs["server"]["spec"]
    assert server["triggers"][0]["type"] == "prometheus"
    assert "vllm:num_requests_waiting" in server["triggers"][0]["metadata"]["query"]
    assert server["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"][
        "stabilizationWindowSeconds"] == 600
    # The un-scaled defaults still pin the replica count.
    plain = {d["metadata"]["name"]: d for d in by_kind(render(ci_file("defaults")), "Deployment")}
    assert all("replicas" in d["spec"] for d in plain.values())


def _check_trigger(trigger: dict[str, Any], auth: dict[str, Any] | None) -> None:
    params = _keda_params({"kafka": "kafka", "prometheus": "prometheus"}[trigger["type"]])
    for key, value in trigger["metadata"].items():
        assert key in params and "triggerMetadata" in params[key]["orders"], f"KEDA has no {trigger['type']} {key!r}"
        enum = params[key]["enum"]
        assert enum is None or value in enum, f"{key}={value!r} not in {sorted(enum)}"
    if auth is not None:
        for ref in auth["spec"]["secretTargetRef"]:
            p = ref["parameter"]
            assert p in params and "authParams" in params[p]["orders"], f"KEDA {trigger['type']} has no auth {p!r}"


def test_triggers_use_only_parameters_keda_declares(render) -> None:
    docs = render(ci_file("keda"))
    auths = {a["metadata"]["name"]: a for a in by_kind(docs, "TriggerAuthentication")}
    objs = _objects(docs)
    kafka = objs["quality-sidecar"]["spec"]["triggers"][0]
    assert kafka["type"] == "kafka"
    md = kafka["metadata"]
    assert (md["consumerGroup"], md["topic"], md["sasl"], md["tls"]) == (
        "quality-sidecar", "vllm-lookahead-samples", "scram_sha512", "enable")
    assert md["allowIdleConsumers"] == "false"  # never more consumers than partitions
    auth = auths[kafka["authenticationRef"]["name"]]
    assert {r["parameter"] for r in auth["spec"]["secretTargetRef"]} == {"username", "password", "ca"}
    _check_trigger(kafka, auth)
    _check_trigger(objs["server"]["spec"]["triggers"][0], None)
    prom = _objects(render(ci_file("keda"), "--set", "keda.sidecar.trigger=prometheus"))["quality-sidecar"]
    _check_trigger(prom["spec"]["triggers"][0], None)
    # The check can fail: a misspelt key is caught.
    with pytest.raises(AssertionError):
        _check_trigger({"type": "kafka", "metadata": {"lagTreshold": "5"}}, None)
    plain = _objects(render(ci_file("keda"), "--set", "kafka.securityProtocol=PLAINTEXT"))["quality-sidecar"]
    assert "authenticationRef" not in plain["spec"]["triggers"][0]
    assert not {"sasl", "tls"} & set(plain["spec"]["triggers"][0]["metadata"])


def test_prometheus_queries_count_only_this_release(render, tmp_path: Path) -> None:
    docs = render(ci_file("keda"), "--set", "keda.sidecar.trigger=prometheus")
    objs = _objects(docs)
    server_q = objs["server"]["spec"]["triggers"][0]["metadata"]["query"]
    lag_q = objs["quality-sidecar"]["spec"]["triggers"][0]["metadata"]["query"]
    server = f"{RELEASE}-vllm-lookahead-server"
    ns = f'namespace="{NAMESPACE}"'
    series = [
        # two candidate pods of this release: 3 + 4 waiting
        (f'vllm:num_requests_waiting{{{ns}, vllm_lookahead_arm="candidate", pod="{server}-7d9f-abcde"}}', "3x10"),
        (f'vllm:num_requests_waiting{{{ns}, vllm_lookahead_arm="candidate", pod="{server}-7d9f-fghij"}}', "4x10"),
        # not counted: the baseline arm, another release, another namespace
        (f'vllm:num_requests_waiting{{{ns}, vllm_lookahead_arm="baseline", pod="{RELEASE}-vllm-lookahead-baseline-1-x"}}',
         "50x10"),
        (f'vllm:num_requests_waiting{{{ns}, vllm_lookahead_arm="candidate", pod="other-vllm-lookahead-server-1-x"}}',
         "50x10"),
        (f'vllm:num_requests_waiting{{namespace="other", vllm_lookahead_arm="candidate", pod="{server}-1-x"}}',
         "50x10"),
        # sidecar lag: two partitions of this group, plus another group's
        (f'kafka_consumergroup_group_lag{{{ns}, group="quality-sidecar", topic="vllm-lookahead-samples", '
         'partition="0"}', "100x10"),
        (f'kafka_consumergroup_group_lag{{{ns}, group="quality-sidecar", topic="vllm-lookahead-samples", '
         'partition="1"}', "250x10"),
        (f'kafka_consumergroup_group_lag{{{ns}, group="other", topic="vllm-lookahead-samples", partition="0"}}',
         "9999x10"),
    ]
    rules = tmp_path / "empty.yaml"
    rules.write_text(yaml.safe_dump({"groups": []}))
    spec = tmp_path / "keda-queries.yaml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(rules)], "tests": [{
        "interval": "30s", "input_series": [{"series": s, "values": v} for s, v in series],
        "promql_expr_test": [
            {"expr": server_q, "eval_time": "2m", "exp_samples": [{"labels": "{}", "value": 7}]},
            {"expr": lag_q, "eval_time": "2m", "exp_samples": [{"labels": "{}", "value": 350}]},
        ]}]}, sort_keys=False))
    proc = subprocess.run([str(tool("promtool")), "test", "rules", str(spec)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(("sets", "message"), [
    (["hpa.enabled=true"], "keda.server.enabled and hpa.enabled"),
    (["keda.server.maxReplicaCount=1", "keda.server.minReplicaCount=2"], "keda.server.maxReplicaCount"),
    (["sidecar.enabled=false"], "keda.sidecar.enabled needs sidecar.enabled"),
    (["keda.prometheus.serverAddress="], "keda.prometheus.serverAddress is empty"),
    (["keda.sidecar.trigger=lag"], "/keda/sidecar/trigger"),  # the schema's enum
])
def test_contradictory_settings_fail_with_a_message(helm: Path, sets: list[str], message: str) -> None:
    args = ["template", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(ci_file("keda"))]
    for s in sets:
        args += ["--set", s]
    proc = run_helm(helm, *args)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
