"""``benchmarks/selection_oracle.py``: the selection headroom it reports is a real bound.

The script's figures (benchmarks/results/README.md, "selection headroom") say how much a better choice
among the drafter's candidates could give.  Checked here on two held-out prompts with the demo model:
the best candidate per step is never below the drafter's own draft nor below any single source, the
drafter's accepted tokens per step agree with the simulated compression, and the JSON holds its command.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import selection_oracle  # noqa: E402


def test_accepted_counts_the_leading_tokens_greedy_produced() -> None:
    assert selection_oracle.accepted([5, 6, 7], [5, 6, 9, 7]) == 2
    assert selection_oracle.accepted([], [1]) == 0
    assert selection_oracle.accepted([1, 2], [1]) == 1  # the output ended


def test_rule_key_buckets_the_evidence_a_fixed_rule_could_use() -> None:
    # context match 5 -> 4+, two shared leading tokens, memory match 7 -> 6+, first-token frequency 0.95
    assert selection_oracle.rule_key([1, 2, 3], 5, [1, 2, 4], [0.95, 0.5], 7) == (4, 2, 2, 4)
    assert selection_oracle.rule_key([1], 1, [2], [0.1], 1) == (1, 0, 0, 0)


def test_the_oracle_bounds_the_drafter_and_every_source(tmp_path: Path, demo_model: Path) -> None:
    out = tmp_path / "oracle.json"
    assert selection_oracle.main(["--model", str(demo_model), "--n", "2", "--max-tokens", "24", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    acc = res["accepted_per_step"]
    assert res["command"].startswith("python benchmarks/selection_oracle.py") and res["decode_steps_scored"] > 5
    assert acc["oracle_all"] >= acc["oracle_context_memory"] >= acc["drafter"] > 0
    for source in ("context", "memory"):
        assert acc["oracle_all"] >= acc[source]
    assert res["oracle_gain"]["all"] >= 0
    # a fixed rule (one choice per evidence key) can never beat the per-step best of the same candidates
    assert 0 <= res["fixed_rule_bound"]["gain"] <= res["oracle_gain"]["context_memory"] + 1e-12
    # 1 + accepted per decode step is what a step commits: close to the simulated compression (which
    # also counts the prefill step and the cut at max_tokens)
    assert res["committed_per_step"]["drafter"] == pytest.approx(res["compression"], rel=0.25)
