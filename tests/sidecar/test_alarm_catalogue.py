"""The alarm catalogue (quality_sidecar/alarms.py) covers every alarm the sidecar can raise, its texts
reach the alert events, and docs/sidecar.md's alarm table is what scripts/gen_alarm_table.py renders
from it (so the docs cannot drift from what operators are told)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from quality_sidecar.alarms import CATALOGUE, OTHER, describe
from quality_sidecar.monitor import RATE_CHARTS, MonitorConfig, arm_comparison_tests

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_alarm_table", ROOT / "scripts" / "gen_alarm_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_docs_table_is_current() -> None:
    assert _generator().main(["--check"]) == 0, "run python scripts/gen_alarm_table.py"


def test_check_fails_on_a_stale_table_and_a_run_rewrites_it(tmp_path: Path) -> None:
    gen = _generator()
    text = gen.DOC.read_text()
    stale = text.replace("| `refusal` | refusal rate rose |", "| `refusal` | refusals went up |")
    assert stale != text
    gen.DOC = tmp_path / "sidecar.md"
    gen.DOC.write_text(stale)
    assert gen.main(["--check"]) == 1 and gen.DOC.read_text() == stale
    assert gen.main([]) == 0 and gen.DOC.read_text() == text


def test_every_alarm_the_sidecar_raises_has_its_own_entry() -> None:
    named = {*RATE_CHARTS, "length_up", "length_down", "acceptance_down", "exact_match", "sampling_conformance",
             "impossible_tokens", "repeated_samples", "twosample_unscored", "twosample_evidence_loss"}
    missing = sorted(named - set(CATALOGUE))
    assert not missing, f"alarms without a catalogue entry: {missing}"
    # the rest of the two-sample family shares one entry
    for test in arm_comparison_tests(MonitorConfig()):
        assert describe(f"twosample_{test}") in (CATALOGUE.get(f"twosample_{test}"), CATALOGUE[OTHER])
    assert all(t.meaning and t.action for t in CATALOGUE.values())
