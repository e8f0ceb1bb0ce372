"""Fixtures for the Helm chart tests: the real helm and kubeconform binaries, offline schemas, renders.

Everything runs the pinned binaries built by scripts/setup.sh; nothing here needs a cluster or
the network.  Renders are cached per module because a `helm template` costs ~0.2 s of CPU on the
shared 2-core CI machine and many tests read the same manifests.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from helm_chart_support import CHART, K8S_VERSIONS, NAMESPACE, RELEASE, Manifests, run_helm

from tests.support.paths import cache_dir, tool


@pytest.fixture(scope="session")
def helm() -> Path:
    return tool("helm")


@pytest.fixture(scope="session")
def kubeconform() -> Path:
    return tool("kubeconform")


@pytest.fixture(scope="session")
def k8s_schemas() -> Path:
    """Offline schema root; an error with the fix when scripts/setup.sh has not made it yet."""
    root = cache_dir() / "k8s-schemas"
    needed = [root / f"v{v}-standalone-strict" / "deployment-apps-v1.json" for v in K8S_VERSIONS]
    needed.append(root / "crds" / "prometheusrule-monitoring.coreos.com-v1.json")
    missing = [str(p) for p in needed if not p.exists()]
    if missing:
        raise FileNotFoundError(
            f"offline Kubernetes schemas missing ({missing[0]}): run `scripts/setup.sh k8s_schemas`"
        )
    return root


@pytest.fixture(scope="module")
def render(helm: Path) -> Callable[..., Manifests]:
    """render(values_file=None, *extra_args) -> parsed manifests (cached); fails with helm's stderr."""
    cache: dict[tuple[str, ...], Manifests] = {}

    def _render(values: Path | None = None, *extra: str) -> Manifests:
        args = [
            "template",
            RELEASE,
            str(CHART),
            "--namespace",
            NAMESPACE,
            "--kube-version",
            K8S_VERSIONS[0],
        ]
        if values is not None:
            args += ["-f", str(values)]
        args += list(extra)
        key = tuple(args)
        if key not in cache:
            proc = run_helm(helm, *args)
            assert proc.returncode == 0, f"helm {' '.join(args)} failed:\n{proc.stderr}"
            cache[key] = [d for d in yaml.safe_load_all(proc.stdout) if d]
        return cache[key]

    return _render
