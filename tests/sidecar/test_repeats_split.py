"""``repeated_samples`` under unequal traffic splits: silent on exact decoders, loud on a reused stream.

A 5-10% baseline holdback is the normal deployment.  Comparing each arm's samples with its own earlier
outputs made the busier arm repeat more (more earlier outputs to match), so an exact decoder at a 90/10
split alarmed; the chart now compares disjoint pairs, matched by prompt across the arms.  This is a
simulation with a traffic mix chosen to be hard: Zipf prompt popularity, and popular prompts with the
most repetitive answers (the case where any difference in how the arms weight prompts shows).
"""

from __future__ import annotations

import numpy as np
import pytest

from quality_sidecar.detectors.repeats import RepeatChart

pytestmark = pytest.mark.unit

N_REQUESTS = 60_000
N_PROMPTS = 3_000


def _traffic(seed: int, candidate_share: float, reused: bool):
    """(arm, prompt key, output key) per request.  Exact: every output an independent draw from its
    prompt's answer distribution.  ``reused``: the candidate's k-th sample of a prompt is its (k mod 1)
    draw of one fixed stream -- every sample exact, all samples of a prompt identical."""
    rng = np.random.default_rng(seed)
    pop = 1.0 / np.arange(1, N_PROMPTS + 1) ** 1.1
    prompts = rng.choice(N_PROMPTS, N_REQUESTS, p=pop / pop.sum())
    # Popular prompts have few, concentrated answers (repeat probability up to ~0.9); rare ones many.
    n_answers = np.minimum(1 + (np.arange(N_PROMPTS) // 40), 200)
    cdfs = [np.cumsum(1.0 / np.arange(1, k + 1) ** 2.0) for k in n_answers]
    draws = [int(np.searchsorted(c, u * c[-1])) for c, u in zip((cdfs[p] for p in prompts), rng.random(N_REQUESTS))]
    arms = np.where(rng.random(N_REQUESTS) < candidate_share, "candidate", "baseline").tolist()
    fixed: dict[int, int] = {}
    for arm, p, out in zip(arms, prompts.tolist(), draws):
        if reused and arm == "candidate":
            out = fixed.setdefault(p, out)
        yield arm, f"p{p}", f"o{out}"


def _run(seed: int, candidate_share: float, reused: bool) -> tuple[RepeatChart, int | None, float]:
    chart = RepeatChart()
    first, min_p = None, 1.0
    for i, (arm, pk, ok) in enumerate(_traffic(seed, candidate_share, reused)):
        r = chart.update(arm, pk, ok)
        if r is not None:
            min_p = min(min_p, r.pvalue)
            if r.alarm_new and first is None:
                first = i + 1
    return chart, first, min_p


@pytest.mark.parametrize("share", [0.9, 0.1, 0.5])
def test_exact_decoder_is_silent_at_any_split(share: float) -> None:
    for seed in (1, 2):
        chart, first, min_p = _run(seed, share, reused=False)
        arms = chart.arms
        assert first is None, (share, seed, arms)
        # It had evidence to judge: thousands of comparisons with natural repeats in both arms.
        assert arms["candidate"]["matched"] > 1_000 and arms["candidate"]["discordant"] > 300, arms
        assert min(arms[a]["repeats"] for a in arms) > 500, arms
        assert min_p > 1e-4, (share, seed, min_p)


@pytest.mark.parametrize("share", [0.9, 0.1])
def test_reused_stream_alarms_at_any_split(share: float) -> None:
    chart, first, _ = _run(3, share, reused=True)
    assert first is not None and first < 15_000, (share, first, chart.arms)  # measured: 10,133 at 10% candidate


def test_state_round_trip_continues_exactly() -> None:
    """A restart from the checkpointed state gives the same statistics as an uninterrupted run."""
    events = list(_traffic(4, 0.9, reused=True))[:30_000]
    whole = RepeatChart()
    for e in events:
        whole.update(*e)
    half = RepeatChart()
    for e in events[:15_000]:
        half.update(*e)
    import json

    resumed = RepeatChart()
    resumed.set_state(json.loads(json.dumps(half.get_state())))
    for e in events[15_000:]:
        resumed.update(*e)
    assert resumed.arms == whole.arms and resumed.arms["candidate"]["alarm"]
