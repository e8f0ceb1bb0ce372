"""A decoder that removes its own evidence is caught by the difference between the arms.

Two ways a faulty candidate can hide from the T>0 checks: its outputs cannot be judged (aborted,
errored: ``twosample_unscored`` in the windowed Holm family), or the baseline server refuses to score
them (e.g. rejects their token ids: ``twosample_evidence_loss``, Fisher at each candidate give-up).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from quality_sidecar.monitor import ArmComparison, MonitorConfig
from quality_sidecar.pipeline import Pipeline
from quality_sidecar.service import ServiceConfig
from tests.support.synth import SampleStream

pytestmark = pytest.mark.unit


def _feed(cmp: ArmComparison, rates: dict[str, float], n: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    alarms = []
    for i in range(n):
        arm = "candidate" if i % 10 else "baseline"  # a 90/10 split
        alarms += cmp.scorer_finished(arm, bool(rng.random() < rates[arm]))
    return alarms


def test_equal_give_up_rates_are_silent_and_a_candidate_that_loses_its_evidence_alarms() -> None:
    cfg = MonitorConfig()
    for seed in range(5):
        assert not _feed(ArmComparison("m", cfg), {"baseline": 0.03, "candidate": 0.03}, 20_000, seed)
    cmp = ArmComparison("m", cfg)
    alarms = _feed(cmp, {"baseline": 0.03, "candidate": 0.15}, 20_000, 7)
    assert [a.detector for a in alarms] == ["twosample_evidence_loss"] and alarms[0].arm == "candidate"
    assert "given up: candidate" in alarms[0].result.extra["detail"]
    assert cmp.acknowledge("twosample_evidence_loss") == ["twosample_evidence_loss"]
    assert cmp.lost == {"baseline": [0, 0], "candidate": [0, 0]}


def test_state_round_trip() -> None:
    cfg = MonitorConfig()
    cmp = ArmComparison("m", cfg)
    _feed(cmp, {"baseline": 0.03, "candidate": 0.03}, 500, 1)
    again = ArmComparison("m", cfg)
    again.set_state(json.loads(json.dumps(cmp.get_state())))
    assert again.lost == cmp.lost


def test_unscorable_t_above_0_samples_are_flagged_for_the_arm_comparison() -> None:
    pipe = Pipeline(ServiceConfig.from_dict({"monitor": {"text_test": False}}))
    s = SampleStream(seed=3, model="m", greedy_fraction=0.0).take(2)
    for x in s:
        x["prompt_token_ids"] = [1, 2, 3]
    s[1]["output"]["finish_reason"] = "abort"
    feats = pipe.classify(s)
    assert [f.flags["unscored"] for f in feats] == [False, True]
    pipe.worker_failed(s[0], "rejected")
    assert pipe.charts.compare["m"].lost["candidate"] == [1, 1]
