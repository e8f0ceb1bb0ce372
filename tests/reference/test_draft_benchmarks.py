"""``benchmarks/draft_calibration.py`` and ``benchmarks/draft_row_cost.py``: what their figures rest on.

The calibration replay (benchmarks/results/README.md, "Are the estimates calibrated?") bins every drafted
token by its estimate: checked on two held-out prompts with the demo model that the bins hold every drafted
token once, the committed shares are shares, the context evidence classes are the kernel's, and the JSON
holds its command and the code it ran.  The row-cost proposer must draft exactly n tokens for every
decoding row and none for a row still prefilling (vLLM's convention: an empty sampled list).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import draft_calibration  # noqa: E402
import draft_row_cost  # noqa: E402


def test_fixed_draft_proposer_drafts_n_copies_of_the_last_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FIXED_DRAFT_N", "3")
    prop = draft_row_cost.FixedDraft(None)
    assert prop.propose([[5], [], [7, 9]]) == [[5, 5, 5], [], [9, 9, 9]]
    monkeypatch.setenv("FIXED_DRAFT_N", "0")
    assert draft_row_cost.FixedDraft(None).propose([[5]]) == [[]]


def test_ranking_quality_orders_not_calibration() -> None:
    """A perfect order scores AUC 1 and reaches the perfect committed share; a constant estimate (calibrated
    on average, no order) scores 0.5; a reversed order 0; ties count half."""
    hit = [True, True, False, False]
    best = draft_calibration.ranking_quality([0.9, 0.8, 0.2, 0.1], hit)
    assert best["auc"] == 1.0 and best["committed"] == 2
    assert [t["committed_share"] for t in best["top"]] == [t["perfect_order"] for t in best["top"]]
    assert draft_calibration.ranking_quality([0.5] * 4, hit)["auc"] == 0.5
    worst = draft_calibration.ranking_quality([0.1, 0.2, 0.8, 0.9], hit)
    assert worst["auc"] == 0.0 and worst["top"][1]["committed_share"] == 0.0
    assert draft_calibration.ranking_quality([0.9, 0.5, 0.5, 0.1], hit)["auc"] == 0.875  # one tie of four pairs
    assert abs(best["brier"] - (0.01 + 0.04 + 0.04 + 0.01) / 4) < 1e-12
    assert draft_calibration.ranking_quality([0.3], [True])["auc"] is None  # no uncommitted token to compare


@pytest.mark.slow
def test_calibration_bins_hold_every_drafted_token_once(tmp_path: Path, demo_model: Path) -> None:
    out = tmp_path / "calibration.json"
    assert draft_calibration.main(["--model", str(demo_model), "--n", "2", "--max-tokens", "32", "--json",
                                   str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["command"].startswith("python benchmarks/draft_calibration.py")
    assert len(res["code"]["commit"]) in (40, len("unknown"))
    assert res["drafted_tokens"] > 0 and 0 < res["committed_draft_tokens"] <= res["drafted_tokens"]
    cal = res["calibration"]
    assert sum(row["tokens"] for row in cal["all"]) == res["drafted_tokens"]
    assert sum(row["tokens"] for s in ("context", "memory") for row in cal[s]) <= res["drafted_tokens"]
    committed = sum(round(row["tokens"] * row["committed_share"]) for row in cal["all"])
    assert committed == res["committed_draft_tokens"]
    assert all(0.0 <= row["committed_share"] <= 1.0 for s in cal.values() for row in s)
    assert set(res["context_first_token_by_evidence"]) <= set(draft_calibration.CLASSES)
    assert res["compression"] > 1.0
    rank = res["ranking"]["all"]
    assert rank["tokens"] == res["drafted_tokens"] and rank["committed"] == res["committed_draft_tokens"]
    assert rank["auc"] is None or 0.0 <= rank["auc"] <= 1.0
    assert all(t["committed_share"] <= t["perfect_order"] for t in rank["top"])
