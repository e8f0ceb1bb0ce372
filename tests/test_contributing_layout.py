"""CONTRIBUTING.md's "Layout" block matches the tree.

Why: the block listed modules deleted long before anyone noticed (pool, context index, Jacobi state).
Both directions are checked: every path it names exists, and every package directory directly under
``vllm_lookahead/`` and ``quality_sidecar/`` is named in it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("vllm_lookahead", "quality_sidecar")


def layout_paths(text: str) -> list[str]:
    """The first word of each line of the fenced block under ``## Layout``."""
    m = re.search(r"^## Layout\n```\n(.*?)^```", text, flags=re.S | re.M)
    assert m, "CONTRIBUTING.md has no fenced block under '## Layout'"
    return [ln.split()[0] for ln in m.group(1).splitlines() if ln.strip()]


def test_every_layout_path_exists() -> None:
    paths = layout_paths((ROOT / "CONTRIBUTING.md").read_text())
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"CONTRIBUTING.md's Layout names paths that do not exist: {missing}"


def test_every_package_directory_is_in_the_layout() -> None:
    named = {p.rstrip("/") for p in layout_paths((ROOT / "CONTRIBUTING.md").read_text())}
    dirs = [f"{pkg}/{d.name}" for pkg in PACKAGES for d in sorted((ROOT / pkg).iterdir())
            if d.is_dir() and (d / "__init__.py").exists()]
    assert dirs, "no package directories found: the check would be vacuous"
    unnamed = [d for d in dirs if d not in named]
    assert not unnamed, f"package directories missing from CONTRIBUTING.md's Layout: {unnamed}"


def test_layout_parsing_catches_a_stale_entry() -> None:
    stale = "# C\n\n## Layout\n```\nvllm_lookahead/core/pool.py   the n-gram pool\n```\n"
    paths = layout_paths(stale)
    assert paths == ["vllm_lookahead/core/pool.py"]
    assert not (ROOT / paths[0]).exists()
