"""Where things are in the checkout, and where scripts/setup.sh put the pinned tools (one place, read
from scripts/versions.env)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def with_checkout_on_path(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the checkout first on ``PYTHONPATH``: a process a test or benchmark starts (a CLI,
    ``vllm-lookahead serve`` and the engine core it forks) imports ``tests.*`` -- the fault proposers
    -- and this checkout's packages."""
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(REPO_ROOT)]
    return {**env, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), *rest])}


def versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (REPO_ROOT / "scripts" / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


def cache_dir() -> Path:
    return Path(os.environ.get("VLLM_LOOKAHEAD_CACHE", Path.home() / ".cache" / "vllm-lookahead"))


def tool(name: str) -> Path:
    """Path of a Go-built tool (helm, kubeconform, jaeger); raises with the fix if it is missing."""
    path = cache_dir() / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run `scripts/setup.sh {name}` first")
    return path


def kafka_libs() -> Path:
    path = cache_dir() / f"kafka-{versions()['KAFKA_VERSION']}" / "libs"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run `scripts/setup.sh kafka` first")
    return path
