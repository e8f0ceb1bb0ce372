"""``benchmarks/draft_row_cost.py``: what its figures rest on.

The row-cost proposer must draft exactly n tokens for every decoding row and none for a row still
prefilling (vLLM's convention: an empty sampled list).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import draft_row_cost  # noqa: E402


def test_fixed_draft_proposer_drafts_n_copies_of_the_last_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FIXED_DRAFT_N", "3")
    prop = draft_row_cost.FixedDraft(None)
    assert prop.propose([[5], [], [7, 9]]) == [[5, 5, 5], [], [9, 9, 9]]
    monkeypatch.setenv("FIXED_DRAFT_N", "0")
    assert draft_row_cost.FixedDraft(None).propose([[5]]) == [[]]
