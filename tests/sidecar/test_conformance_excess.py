"""The excess log-prob test (``excess_test``): exact null, valid tails at the gate's alphas, power.

No mocks: synthetic log-prob rows (Zipf-like with noise, sharp and flat positions mixed, the shapes a
language model produces) and tokens drawn from the exact sampler distribution; the statistic is
computed by the production code (``score_full`` / ``score_topk`` -> ``SequenceScore.excess_sums``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from quality_sidecar.detectors.conformance_charts import ConformanceChart
from quality_sidecar.detectors.conformance_scoring import (
    SamplerParams,
    excess_logprob,
    sampler_probs,
    score_full,
    score_topk,
)
from quality_sidecar.detectors.conformance_stats import (
    EXCESS_MIN_TOKENS,
    excess_test,
    excess_totals,
)
from quality_sidecar.detectors.cusum import ExcessCusum

V = 200


def _rows(rng: np.random.Generator, n: int) -> np.ndarray:
    """Raw log-softmax rows: a Zipf slope from flat (0.3) to very sharp (6) plus noise."""
    slope = rng.choice([0.3, 1.0, 2.0, 4.0, 6.0], size=(n, 1))
    logits = -np.log(np.arange(1, V + 1)) * slope + rng.normal(0, 1.5, (n, V))
    logits = logits[:, rng.permutation(V)]
    return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))


def _draw(rng: np.random.Generator, q: np.ndarray) -> np.ndarray:
    u = rng.random((len(q), 1))
    return np.minimum((np.cumsum(q, axis=1) < u).sum(axis=1), q.shape[1] - 1)


def _topk(rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.argsort(-rows, axis=1)[:, :k]
    return ids, np.take_along_axis(rows, ids, axis=1)


@pytest.mark.parametrize("params", [SamplerParams(1.0), SamplerParams(0.8, top_p=0.9),
                                    SamplerParams(1.3, top_k=40, min_p=0.01)])
def test_full_rows_excess_is_the_fault_size_definition(params: SamplerParams) -> None:
    rng = np.random.default_rng(0)
    rows = _rows(rng, 300)
    y = _draw(rng, sampler_probs(rows, params))
    sc = score_full(rows, y, params, rng)
    assert len(sc.excess) == len(y) and np.allclose(sc.excess, excess_logprob(rows, y, params))
    q = sampler_probs(rows, params)
    m = np.where(q > 0, q * rows, 0).sum(axis=1)
    var = np.where(q > 0, q * (rows - m[:, None]) ** 2, 0).sum(axis=1)
    assert np.allclose(sc.excess_var, var)


def test_topk_coarsened_excess_is_exact_under_the_null() -> None:
    """From a server's top-20 at T=1 (tail bucket): z has mean 0, variance 1 and the right 1% tail."""
    rng = np.random.default_rng(1)
    pool = _rows(rng, 4000)
    q = np.exp(pool)
    params = SamplerParams(1.0)
    zs = []
    for _ in range(2500):
        idx = rng.integers(0, len(pool), size=EXCESS_MIN_TOKENS)
        rows = pool[idx]
        y = _draw(rng, q[idx])
        ids, lps = _topk(rows, 20)
        sc = score_topk(ids, lps, y, rows[np.arange(len(y)), y], params, rng, vocab_size=V)
        s, v, n = sc.excess_sums()
        assert n == len(y)  # plain T=1: every token is scored (known or bucket)
        zs.append(s / math.sqrt(v))
    z = np.array(zs)
    assert abs(z.mean()) < 4 / math.sqrt(len(z))
    assert 0.9 < z.var() < 1.1
    rej = np.mean([excess_test(x * 10.0, 100.0, EXCESS_MIN_TOKENS).pvalue < 0.01 for x in z])
    assert rej < 0.01 + 3 * math.sqrt(0.01 * 0.99 / len(z))


def test_false_positive_rate_at_the_gates_alphas() -> None:
    """The normal tail from EXCESS_MIN_TOKENS tokens on, at 1e-2 and 1e-3 (Holm's strictest step of
    the gate's nine tests at alpha 0.01 is 1.1e-3), on skewed rows (sharp positions with rare tokens)."""
    rng = np.random.default_rng(2)
    pool = _rows(rng, 3000)
    q = np.exp(pool)
    cq = np.cumsum(q, axis=1)
    mean = (q * pool).sum(axis=1)
    var = (q * pool * pool).sum(axis=1) - mean ** 2
    reps, n = 30000, EXCESS_MIN_TOKENS
    ps = []
    for _ in range(0, reps, 250):
        idx = rng.integers(0, len(pool), size=(250, n))
        u = rng.random((250, n, 1))
        y = np.minimum((cq[idx] < u).sum(axis=2), V - 1)
        s = (pool[idx, y] - mean[idx]).sum(axis=1)
        ps += [excess_test(a, b, n).pvalue for a, b in zip(s, var[idx].sum(axis=1))]
    ps = np.array(ps)
    for alpha in (1e-2, 1e-3):
        assert (ps < alpha).mean() < alpha + 3 * math.sqrt(alpha / reps), alpha


@pytest.mark.parametrize("factor,sign", [(0.9, +1), (1.15, -1)])
def test_temperature_faults_are_detected_with_direction(factor: float, sign: int) -> None:
    rng = np.random.default_rng(3)
    rows = _rows(rng, 3000)
    params = SamplerParams(1.0)
    y = _draw(rng, sampler_probs(rows, SamplerParams(factor)))  # the faulty sampler
    ids, lps = _topk(rows, 20)
    sc = score_topk(ids, lps, y, rows[np.arange(len(y)), y], params, rng, vocab_size=V)
    t = excess_test(*sc.excess_sums())
    assert t.pvalue < 1e-3 and np.sign(t.statistic) == sign, t.detail
    assert ("sharper" in t.detail) == (sign > 0)


def test_excess_totals_of_split_samples_equal_the_whole_streams_sums() -> None:
    """The stream test of many samples (gate, diagnostics) adds the samples' triples: the same sums as
    one sample of all their tokens; a sample with nothing scored (None, empty) adds nothing."""
    rng = np.random.default_rng(4)
    rows = _rows(rng, 600)
    y = _draw(rng, np.exp(rows))
    params = SamplerParams(1.0)
    whole = score_full(rows, y, params, rng).excess_sums()
    parts = [score_full(rows[a:b], y[a:b], params, rng).excess_sums() for a, b in ((0, 250), (250, 251), (251, 600))]
    s, v, n = excess_totals([parts[0], None, parts[1], [], parts[2]])
    assert n == whole[2] == 600
    assert math.isclose(s, whole[0], rel_tol=1e-9) and math.isclose(v, whole[1], rel_tol=1e-9)
    assert excess_totals([]) == (0.0, 0.0, 0)


def test_too_few_tokens_is_no_evidence() -> None:
    t = excess_test(50.0, 1.0, EXCESS_MIN_TOKENS - 1)
    assert t.pvalue == 1.0 and "too few" in t.detail


def _scored_stream(rng: np.random.Generator, n_samples: int, factor: float = 1.0, tokens: int = 48):
    """Samples of ``tokens`` tokens scored from a server's top-20 (T=1), drawn at temperature ``factor``."""
    pool = _rows(rng, 6000)
    ids, lps = _topk(pool, 20)
    q = sampler_probs(pool, SamplerParams(factor))
    out = []
    for _ in range(n_samples):
        idx = rng.integers(0, len(pool), size=tokens)
        y = _draw(rng, q[idx])
        out.append(score_topk(ids[idx], lps[idx], y, pool[idx, y], SamplerParams(1.0), rng, vocab_size=V))
    return out


def test_excess_chart_keeps_its_ert_at_the_production_shift() -> None:
    """The excess increments are skewed (rare unlikely tokens): check the Gaussian calibration at the
    sidecar's shift (0.04) on ~3.5M null tokens (12,000 scored samples, replayed in 6 random orders)."""
    rng = np.random.default_rng(12)
    scores = _scored_stream(rng, 12_000)
    c = ExcessCusum(ert_tokens=30_000, shift=0.04, restart_after_alarm=True)
    tokens = 0
    for _ in range(6):
        c.update([(scores[i].excess, scores[i].excess_var) for i in rng.permutation(len(scores))])
        tokens += 48 * len(scores)
    assert tokens / max(1, c.alarms_) > 30_000 * 0.85, c.alarms_
    assert abs(c.mean_excess) < 0.02


def test_conformance_chart_alarms_on_a_sharper_sampler_and_keeps_state() -> None:
    rng = np.random.default_rng(13)
    chart = ConformanceChart(ert_tokens=1e9, shift=0.04)
    r = chart.update(_scored_stream(rng, 1500, factor=0.9))
    assert r.alarm and r.alarm_new and r.alarm_index is not None and "sharper" in r.extra["direction"]
    assert r.extra["mean_excess_nats_per_token"] > 0
    again = chart.update(_scored_stream(rng, 20))
    assert again.alarm and not again.alarm_new  # latched until acknowledged
    twin = ConformanceChart(ert_tokens=1e9, shift=0.04)
    twin.set_state(chart.get_state())
    assert twin.alarm_ and twin.alarm_index_ == chart.alarm_index_ and twin.excess.v_n_ == chart.excess.v_n_
    chart.reset()
    assert not chart.alarm_ and not chart.update(_scored_stream(rng, 50)).alarm


def test_exact_sampling_raises_no_alarm_on_either_chart() -> None:
    rng = np.random.default_rng(14)
    chart = ConformanceChart(ert_tokens=1e9, shift=0.04)
    r = chart.update(_scored_stream(rng, 3000))
    assert not r.alarm and chart.alarms_ == 0


def _masked_stream(rng: np.random.Generator, n_samples: int, late_factor: float = 1.0, tokens: int = 48):
    """Samples with a draft mask (random verification steps: 30% without a draft, else a geometric
    number of accepted drafts, at most 4, then a recovered or bonus token: acceptance as at T>0, where
    few tokens sit deep in a draft); tokens at draft position >= 2 are drawn at temperature
    ``late_factor``, the others exactly.  Returns (scores, per-token draft positions, masks)."""
    from quality_sidecar.baseline_scoring import draft_positions

    pool = _rows(rng, 6000)
    ids, lps = _topk(pool, 20)
    q_exact, q_late = sampler_probs(pool, SamplerParams(1.0)), sampler_probs(pool, SamplerParams(late_factor))
    scores, positions, masks = [], [], []
    for _ in range(n_samples):
        mask = ""
        while len(mask) < tokens:
            a = min(4, int(rng.geometric(0.7)) - 1)
            mask += "." if rng.random() < 0.3 else "A" * a + ("B" if a == 4 else "R")
        mask = mask[:tokens]
        pos = draft_positions({"spec": {"draft_mask": mask}, "output": {"token_ids": [0] * tokens}})
        idx = rng.integers(0, len(pool), size=tokens)
        y = np.where(pos >= 2, _draw(rng, q_late[idx]), _draw(rng, q_exact[idx]))
        scores.append(score_topk(ids[idx], lps[idx], y, pool[idx, y], SamplerParams(1.0), rng, vocab_size=V))
        positions.append(pos)
        masks.append(mask)
    return scores, positions, masks


def test_draft_positions_from_the_mask() -> None:
    from quality_sidecar.baseline_scoring import draft_positions

    smp = {"spec": {"draft_mask": ".AARAAB.R"}, "output": {"token_ids": list(range(9))}}
    assert draft_positions(smp).tolist() == [0, 1, 2, 3, 1, 2, 3, 0, 1]
    assert draft_positions({"spec": {"draft_mask": ".A"}, "output": {"token_ids": [1, 2, 3]}}) is None
    assert draft_positions({"spec": None, "output": {"token_ids": [1]}}) is None


def test_a_fault_at_late_draft_positions_alarms_on_its_own_chart_first() -> None:
    """Sharper sampling (x0.8) at draft positions >= 2 only (~22% of the tokens): diluted over every
    token the excess chart needs more samples than the chart of late positions, which alarms first and
    says so (measured: 35 vs 152 samples here)."""
    rng = np.random.default_rng(15)
    scores, positions, _ = _masked_stream(rng, 2000, late_factor=0.8)
    with_mask, without = ConformanceChart(ert_tokens=1e9, shift=0.04), ConformanceChart(ert_tokens=1e9, shift=0.04)
    first = {}
    for i, (sc, pos) in enumerate(zip(scores, positions)):
        for name, chart, p in (("mask", with_mask, [pos]), ("none", without, None)):
            r = chart.update([sc], p)
            if r.alarm_new:
                first.setdefault(name, (i, r.extra["chart"]))
    assert first["mask"][1] == "late_draft_positions", first
    assert first["mask"][0] < 0.9 * first.get("none", (len(scores), ""))[0], first
    assert with_mask.late.mean_excess > 0.05 and "sharper" in with_mask.late.direction_
    twin = ConformanceChart(ert_tokens=1e9, shift=0.04)
    twin.set_state(with_mask.get_state())
    assert twin.late.alarm_ and twin.late.v_n_ == with_mask.late.v_n_


def test_exact_sampling_with_draft_masks_raises_no_alarm() -> None:
    rng = np.random.default_rng(17)
    scores, positions, _ = _masked_stream(rng, 3000)
    chart = ConformanceChart(ert_tokens=1e9, shift=0.04)
    r = chart.update(scores, positions)
    assert not r.alarm and chart.alarms_ == 0 and chart.late.tokens_ > 30_000
    assert abs(chart.late.sum_x_) / math.sqrt(chart.late.tokens_) < 4  # the selected scores stay mean 0
