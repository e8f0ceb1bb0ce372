"""The chart's release gate: the Helm test Job and the Argo Rollouts AnalysisTemplate render from the
real pinned helm binary with the arguments endpoint mode needs, the Job validates against the
Kubernetes schema (kubeconform, offline), and the switches and guards work.  The cluster tier
(tests/helm_cluster/) admits the ci/ values files, including the gate Job of everything-on."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.paths import REPO_ROOT, cache_dir, tool

pytestmark = pytest.mark.helm

CHART = REPO_ROOT / "deploy" / "helm" / "vllm-lookahead"
EVERYTHING = CHART / "ci" / "everything-on-values.yaml"
ARGO = "argoproj.io/v1alpha1/AnalysisTemplate"


def _helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tool("helm")), "template", "demo", str(CHART), "--namespace", "llm", *args],
                          capture_output=True, text=True, timeout=60, check=False)


def _render(*args: str) -> list[dict[str, Any]]:
    proc = _helm(*args)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def _gate(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and d["metadata"]["labels"].get("app.kubernetes.io/component") == "gate"]


def test_gate_is_off_by_default() -> None:
    docs = _render("--api-versions", ARGO)
    assert not _gate(docs, "Job") and not _gate(docs, "AnalysisTemplate")


def test_gate_job_is_a_helm_test_between_the_two_services() -> None:
    docs = _render("-f", str(EVERYTHING))
    (job,) = _gate(docs, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert job["spec"]["backoffLimit"] == 0
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["vllm-lookahead", "gate"]
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    args = dict(a.split("=", 1) for a in c["args"] if a.startswith("--") and "=" in a)
    for flag in ("--baseline-url", "--candidate-url"):
        host = args[flag].removeprefix("http://").split(".", 1)[0]
        assert host in services, (flag, args[flag], services)
    assert args["--baseline-url"] != args["--candidate-url"]
    assert args["--model"] == "llama-8b" and c["args"][-2:] == ["--limit", "20"]
    assert args["--policy"] == "/etc/vllm-lookahead-gate/policy.yaml"
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("gate-policy")]
    policy = yaml.safe_load(cm["data"]["policy.yaml"])
    from vllm_lookahead.gate.policy import validate

    assert validate(policy)["criteria"]["pass_rate_overall"]["ni_margin"] == 0.05  # the gate accepts it
    assert pod["securityContext"]["runAsNonRoot"] and c["securityContext"]["readOnlyRootFilesystem"]
    # the AnalysisTemplate needs the Argo CRDs: not rendered where the API is not served
    assert not _gate(docs, "AnalysisTemplate")


def test_analysis_template_runs_the_same_gate_with_rollout_args() -> None:
    docs = _render("-f", str(EVERYTHING), "--api-versions", ARGO)
    (tmpl,) = _gate(docs, "AnalysisTemplate")
    (metric,) = tmpl["spec"]["metrics"]
    assert metric["count"] == 1 and metric["failureLimit"] == 0
    (c,) = metric["provider"]["job"]["spec"]["template"]["spec"]["containers"]
    assert "--baseline-url={{args.baseline-url}}" in c["args"] and "--candidate-url={{args.candidate-url}}" in c["args"]
    (job,) = _gate(docs, "Job")
    # the same flags as the Helm test apart from the URLs
    strip = [a for a in c["args"] if not a.startswith(("--baseline-url", "--candidate-url"))]
    assert strip == [a for a in job["spec"]["template"]["spec"]["containers"][0]["args"]
                     if not a.startswith(("--baseline-url", "--candidate-url"))]
    assert {a["name"] for a in tmpl["spec"]["args"]} == {"baseline-url", "candidate-url"}


def test_gate_without_baseline_is_a_clear_error() -> None:
    proc = _helm("--set", "gate.enabled=true")
    assert proc.returncode != 0 and "gate.enabled needs baseline.enabled" in proc.stderr
    proc = _helm("--set", "baseline.enabled=true", "--set", "gate.concurrency=0")
    assert proc.returncode != 0 and "concurrency" in proc.stderr


@pytest.mark.parametrize("version", ["1.30.0", "1.37.0"])
def test_gate_job_passes_kubeconform(tmp_path: Path, version: str) -> None:
    out = tmp_path / "gate.yaml"
    proc = _helm("-f", str(EVERYTHING), "--show-only", "templates/gate-job.yaml", "--kube-version", version)
    assert proc.returncode == 0, proc.stderr
    out.write_text(proc.stdout)
    schemas = cache_dir() / "k8s-schemas"
    loc = f"{schemas}/{{{{ .NormalizedKubernetesVersion }}}}-standalone{{{{ .StrictSuffix }}}}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json"
    res = subprocess.run([str(tool("kubeconform")), "-strict", "-summary", "-kubernetes-version", version,
                          "-schema-location", loc, str(out)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0 and "Valid: 1" in res.stdout, res.stdout + res.stderr
