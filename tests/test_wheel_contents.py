"""The wheel is exactly the two runtime packages, and nothing in them reaches into ``tests``.

Test-only code (service helpers, the fault proposers and their vLLM patches) lives under ``tests/``,
which the package find in pyproject.toml never includes, so no list of excluded modules exists to
drift.  What is checked: the wheel's modules are the checkout's package trees file for file (nothing
left out, nothing extra), and no module of the wheel imports ``tests`` (which an installed wheel
does not have).
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("vllm_lookahead", "quality_sidecar")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> dict[str, bytes]:
    """Build the wheel (setuptools in this venv, no network, ~2 s) from a copy of the sources, so
    that the build writes nothing into the shared checkout; {name: content} of its files."""
    src = tmp_path_factory.mktemp("src")
    out = tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    proc = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                           "print(build_meta.build_wheel(sys.argv[1]))", str(out)],
                          cwd=src, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    with zipfile.ZipFile(out / proc.stdout.strip().splitlines()[-1]) as z:
        return {n: z.read(n) for n in z.namelist()}


def imports_of_tests(source: str | bytes) -> list[str]:
    """The ``import tests...`` / ``from tests... import`` statements of a module (any depth)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
        found += [n for n in names if n == "tests" or n.startswith("tests.")]
    return found


def test_wheel_modules_are_exactly_the_package_trees(wheel) -> None:
    in_wheel = {n for n in wheel if n.endswith(".py")}
    in_tree = {p.relative_to(ROOT).as_posix() for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
               if "__pycache__" not in p.parts}
    assert in_tree and in_wheel == in_tree
    tops = {n.split("/", 1)[0] for n in wheel if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == set(PACKAGES)


def test_no_module_of_the_wheel_imports_tests(wheel) -> None:
    bad = {n: imports_of_tests(src) for n, src in wheel.items() if n.endswith(".py")}
    assert {n: v for n, v in bad.items() if v} == {}


def test_the_import_scan_finds_an_import_of_tests() -> None:
    src = "import os\ndef f():\n    from tests.faults import SPEC\n    import tests.support.paths as p\n"
    assert imports_of_tests(src) == ["tests.faults", "tests.support.paths"]
    assert imports_of_tests("from .tests import x\nimport testsuite\n") == []
