"""Helpers shared by the Helm chart tests (constants, helm runner, manifest lookups)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from tests.support.paths import REPO_ROOT

CHART = REPO_ROOT / "deploy" / "helm" / "vllm-lookahead"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
BAD_VALUES = sorted((Path(__file__).parent / "bad-values").glob("*.yaml"))
K8S_VERSIONS = ("1.30.0", "1.37.0")  # deploy/scripts/k8s-schemas.sh K8S_SCHEMA_VERSIONS
RELEASE, NAMESPACE = "demo", "llm"

Manifests = list[dict[str, Any]]


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm), *args], capture_output=True, text=True, timeout=60, check=False
    )


def by_kind(docs: Manifests, kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def component(docs: Manifests, kind: str, name: str) -> dict[str, Any]:
    """The one resource of `kind` whose app.kubernetes.io/component label is `name`."""
    found = [
        d
        for d in by_kind(docs, kind)
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == name
    ]
    assert len(found) == 1, f"expected one {kind} for component {name}, got {len(found)}"
    return found[0]


def container_env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def ci_file(name: str) -> Path:
    path = CHART / "ci" / f"{name}-values.yaml"
    assert path.exists(), path
    return path
