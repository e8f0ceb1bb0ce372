"""Installing vllm-lookahead changes nothing unless it is asked for (issue 15, item 2).

Each case starts a real in-process vLLM engine on CPU in a fresh interpreter (tests/vllm/inert_app.py)
in this venv, where the plugin's ``vllm.general_plugins`` entry point is registered, so vLLM calls
``register()`` in the frontend, the EngineCore and the worker (one process here).  Checked: no patch in
the registry is applied, every declared patch target is the identical object before and after the
engine ran, and vLLM's own CPU expand kernel is left in place.  A vLLM outside the supported range is
SIMULATED by setting ``vllm.__version__`` (the version source of ``check_vllm_version``) before start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm]

APP = Path(__file__).with_name("inert_app.py")


def run_app(model: Path, fake_version: str, spec: str) -> dict:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("VLLM_LOOKAHEAD_TELEMETRY", None)
    r = subprocess.run([sys.executable, str(APP), str(model), fake_version, spec], capture_output=True,
                       text=True, timeout=600, env=env)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, (r.stdout[-2000:], r.stderr[-4000:])
    return json.loads(lines[-1][len("RESULT "):])


def test_unconfigured_plugin_leaves_vllm_unchanged_even_outside_the_version_range(demo_model):
    """One engine start (they are slow on 2 cores): with the simulated out-of-range version, which is
    the stricter case -- the real 0.32.0 takes the same path, since ``register()`` never looks at it."""
    fake_version = "0.31.0"
    res = run_app(demo_model, fake_version, "none")
    assert res["started"], res
    assert res["plugin_module_loaded"], "vLLM did not load the entry point: the test would prove nothing"
    assert res["applied"] == [], res["applied"]
    assert res["changed"] == [], res["changed"]
    assert len(res["declared"]) >= 15  # the whole registry was compared
    assert res["expand_impl_is_vllms"] is True
    assert not res["telemetry_loaded"]
    assert res["tokens"] == 8
    assert res["vllm_version"] == fake_version


def test_version_check_applies_where_the_plugin_is_used(demo_model):
    """Positive control for the simulation: the same fake version with lookahead configured is refused
    (at the proposer, in the worker), with the supported range in the message."""
    res = run_app(demo_model, "0.31.0", "lookahead")
    assert res["started"] is False
    assert "UnsupportedVLLMVersion" in res["error"] or "supports vLLM" in res["error"], res["error"]


def test_importing_the_plugin_does_not_import_numba():
    """The drafter's kernels are numba (core/kernels.py), and vLLM 0.32's kernel-override scan crashes
    once numba is loaded (vllm/fixes.py, safe_rebind_kernels): importing the package, its core and every
    patch-declaring module must not load it -- only a drafter starting inside an engine does."""
    code = ("import sys, vllm_lookahead, vllm_lookahead.core, vllm_lookahead.vllm.plugin\n"
            "from vllm_lookahead.vllm import patches\n"
            "patches.load_all()\n"
            "assert 'numba' not in sys.modules, 'numba imported'\n"
            "from vllm_lookahead.core.drafter import compile_kernels\n"
            "compile_kernels()\n"
            "assert 'numba' in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
