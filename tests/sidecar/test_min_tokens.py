"""vLLM's ``min_tokens`` promise as an exact check: an output that stops on EOS or a stop token id within
its first ``min_tokens`` tokens holds a token its sampler could not draw (``min_tokens_check``), counted on
the impossible-token chart with reason ``min_tokens`` at any temperature.  The injected violations below
are fault injection (a real server masks them; ``test_conformance_serve.py`` checks a real server's
outputs pass)."""

from __future__ import annotations

import pytest

from quality_sidecar.config import ServiceConfig
from quality_sidecar.detectors.exact_checks import min_tokens_check
from quality_sidecar.pipeline import Pipeline
from tests.support.synth import SampleStream

pytestmark = pytest.mark.unit


def _sample(n: int, min_tokens: int, finish: str = "stop", stop_reason: object = None) -> dict:
    return {"sampling": {"temperature": 0.0, "min_tokens": min_tokens},
            "output": {"token_ids": list(range(n)), "num_tokens": n, "finish_reason": finish,
                       "stop_reason": stop_reason}}


def test_what_counts_as_an_impossible_stop() -> None:
    assert min_tokens_check(_sample(3, 8)) == (3, 1)  # EOS as the 3rd token, 8 promised
    assert min_tokens_check(_sample(8, 8)) == (8, 1)  # EOS at position 7 < 8
    assert min_tokens_check(_sample(9, 8)) == (8, 0)  # EOS at position 8: allowed
    assert min_tokens_check(_sample(3, 8, stop_reason=13)) == (3, 1)  # a stop token id
    assert min_tokens_check(_sample(3, 8, stop_reason="\n\n")) == (3, 0)  # stop strings: text, left out
    assert min_tokens_check(_sample(3, 8, finish="length")) == (3, 0)
    assert min_tokens_check(_sample(3, 0)) is None and min_tokens_check(_sample(0, 8)) is None


def _stream(arm: str, bad_every: int, n: int, seed: int) -> list[dict]:
    out = SampleStream(seed=seed, model="m", arm=arm, greedy_fraction=1.0).take(n)
    for i, s in enumerate(out):
        s["sampling"]["min_tokens"] = 8
        ids = s["output"]["token_ids"] or [1] * 20
        cut = 4 if bad_every and i % bad_every == 0 else max(len(ids), 9)
        s["output"].update(token_ids=(ids * 20)[:cut], num_tokens=cut, finish_reason="stop", stop_reason=None)
    return out


def test_a_candidate_that_stops_inside_min_tokens_alarms_and_an_exact_one_does_not() -> None:
    exact = Pipeline(ServiceConfig.from_dict({"monitor": {"text_test": False}}))
    for k in range(4):
        assert not [a for a in exact.process(_stream("baseline", 0, 200, k) + _stream("candidate", 0, 200, 10 + k))
                    if a.detector == "impossible_tokens"]
    assert exact.charts.conformance["m"].impossible.arms["candidate"]["impossible"] == 0
    faulty = Pipeline(ServiceConfig.from_dict({"monitor": {"text_test": False}}))
    faulty.process(_stream("baseline", 0, 200, 1))
    alarms = [a for a in faulty.process(_stream("candidate", 10, 200, 2)) if a.detector == "impossible_tokens"]
    assert [a.arm for a in alarms] == ["candidate"]
    st = faulty.charts.conformance["m"].impossible.arms["candidate"]
    assert st["reasons"] == {"min_tokens": 20} and st["alarm"]


def test_the_offline_score_runs_the_exact_checks_per_arm(tmp_path) -> None:
    """``quality-sidecar score`` counts the same exact checks without a baseline server: the faulty
    candidate's stops inside ``min_tokens`` are impossible tokens with an alarm, the exact baseline's none."""
    from quality_sidecar.offline import score_file

    from .conftest import write_jsonl

    src = write_jsonl(tmp_path / "s.jsonl", _stream("baseline", 0, 200, 1) + _stream("candidate", 10, 200, 2))
    rep = score_file(str(src), {"monitor": {"text_test": False}}, permutations=10)["exact_checks"]
    base, cand = rep["arms"]["baseline"], rep["arms"]["candidate"]
    assert base["samples_checked"] == cand["samples_checked"] == 200
    assert base["impossible_tokens"] == {"min_tokens": 0} and not base["impossible_alarm"]
    assert cand["impossible_tokens"] == {"min_tokens": 20} and cand["impossible_alarm"] and len(cand["examples"]) == 5
    assert cand["positions_checked"] == 20 * 4 + 180 * 8
