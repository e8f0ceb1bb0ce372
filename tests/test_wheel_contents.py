"""The wheel leaves the test/dev-only modules out; a source checkout (editable install) keeps them."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from vllm_lookahead.decoders import SpecError, check_class

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
DEV_ONLY = ("vllm_lookahead/devtools/", "vllm_lookahead/gate/faulty.py", "vllm_lookahead/vllm/fault_patches.py")


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> list[str]:
    """Build the wheel (setuptools in this venv, no network, ~2 s) from a copy of the sources, so
    that the build writes nothing into the shared checkout."""
    src = tmp_path_factory.mktemp("src")
    out = tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for pkg in ("vllm_lookahead", "quality_sidecar"):
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    proc = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                           "print(build_meta.build_wheel(sys.argv[1]))", str(out)],
                          cwd=src, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    whl = out / proc.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(whl) as z:
        return z.namelist()


def test_wheel_leaves_dev_only_modules_out(wheel_names):
    assert not [n for n in wheel_names if n.startswith(DEV_ONLY)]


def test_wheel_keeps_the_rest(wheel_names):
    for name in ("vllm_lookahead/decoders.py", "vllm_lookahead/gate/engine.py", "vllm_lookahead/vllm/patches.py",
                 "vllm_lookahead/core/drafter.py", "vllm_lookahead/gate/default_policy.yaml",
                 "quality_sidecar/sources/record.py", "quality_sidecar/service.py"):
        assert name in wheel_names


@pytest.mark.parametrize("module", ["vllm_lookahead.devtools.paths", "vllm_lookahead.gate.faulty",
                                    "vllm_lookahead.vllm.fault_patches"])
def test_checkout_still_imports_them(module):
    assert importlib.util.find_spec(module) is not None


def test_fault_decoder_missing_from_the_wheel_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm_lookahead.gate.faulty", None)  # as if not installed
    with pytest.raises(SpecError, match="test-only and not in the installed wheel"):
        check_class("vllm_lookahead.gate.faulty.DraftTemperatureProposer", "custom:x")
