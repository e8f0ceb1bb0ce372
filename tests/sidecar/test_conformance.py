"""Sampling-conformance statistics (quality_sidecar.detectors.conformance_*): exact under the null,
powerful against the T>0-only fault class, honest p-values at small alpha.

The null is simulated by sampling exactly as vLLM 0.32's sampler does (temperature, min-p, top-k,
top-p) from random log-prob rows; the faults sample at another temperature.  Every assertion can
fail: a scoring bug (wrong order, wrong top-p rule, wrong tail bucket) makes the null reject.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from quality_sidecar.detectors.conformance_scoring import (
    OOS_TOLERANCE_NATS,
    SamplerParams,
    score_full,
    score_topk,
)
from quality_sidecar.detectors.conformance_stats import (
    anderson_darling_uniform,
    likelihood_shift,
    pit_test,
)
from quality_sidecar.detectors.cusum import PitCusum, siegmund_arl

pytestmark = pytest.mark.unit
V = 300


def _vllm_sample(lp: np.ndarray, p: SamplerParams, rng: np.random.Generator, fault_t: float = 1.0) -> int:
    """One token as vLLM samples it (the reference implementation the scorer must agree with)."""
    q = _vllm_probs(lp, p, fault_t)
    return int(rng.choice(len(lp), p=q))


def _vllm_probs(lp: np.ndarray, p: SamplerParams, fault_t: float = 1.0) -> np.ndarray:
    a = lp / (p.temperature * fault_t)
    prob = np.exp(a - a.max())
    prob /= prob.sum()
    keep = np.ones(len(lp), bool)
    if p.min_p > 0:
        keep &= prob >= p.min_p * prob.max()
    if p.top_k > 0:
        kth = np.sort(np.where(keep, a, -np.inf))[::-1][p.top_k - 1]
        keep &= a >= kth
    q = np.where(keep, prob, 0.0)
    q /= q.sum()
    if p.top_p < 1:
        order = np.argsort(-q, kind="stable")
        above = np.cumsum(q[order]) - q[order]
        nucleus = np.zeros(len(lp), bool)
        nucleus[order] = above < p.top_p
        q = np.where(nucleus, q, 0.0)
        q /= q.sum()
    return q


@pytest.mark.parametrize("params", [SamplerParams(1.0), SamplerParams(0.7, top_p=0.9),
                                    SamplerParams(1.2, top_k=40, top_p=0.8, min_p=0.02)], ids=str)
def test_sampler_probs_and_excess_logprob(params: SamplerParams) -> None:
    from quality_sidecar.detectors.conformance_scoring import excess_logprob, sampler_probs

    rng = np.random.default_rng(12)
    logits = rng.standard_normal((4000, V)) * 2.5
    lp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    q = sampler_probs(lp, params)
    np.testing.assert_allclose(q[:50], np.array([_vllm_probs(row, params) for row in lp[:50]]), atol=1e-12)
    exact = np.array([rng.choice(V, p=row) for row in q])
    sharper = np.array([rng.choice(V, p=_vllm_probs(row, params, 0.8)) for row in lp])
    e0, e1 = excess_logprob(lp, exact, params), excess_logprob(lp, sharper, params)
    assert abs(e0.mean()) < 4 * e0.std() / math.sqrt(len(e0))  # 0 under exact sampling
    assert e1.mean() > 8 * e1.std() / math.sqrt(len(e1))  # a sharper sampler draws likelier tokens


def _stream(p: SamplerParams, n: int, seed: int, fault_t: float = 1.0):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((n, V)) * 2.5
    lp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    toks = np.array([_vllm_sample(row, p, rng, fault_t) for row in lp])
    return lp, toks


def _topk(lp: np.ndarray, k: int):
    order = np.argsort(-lp, axis=1)[:, :k]
    return order, np.take_along_axis(lp, order, axis=1)


PARAMS = [SamplerParams(1.0), SamplerParams(0.8), SamplerParams(1.3), SamplerParams(0.7, top_p=0.9),
          SamplerParams(1.0, top_k=10), SamplerParams(0.9, top_p=0.95, min_p=0.05),
          SamplerParams(1.2, top_k=40, top_p=0.8)]


@pytest.mark.parametrize("params", PARAMS, ids=str)
def test_pit_uniform_under_exact_sampling_full_and_topk(params: SamplerParams) -> None:
    lp, toks = _stream(params, 3000, seed=1)
    rng = np.random.default_rng(2)
    full = score_full(lp, toks, params, rng)
    assert full.out_of_support == 0 and full.skipped == 0 and len(full.pit) == 3000
    assert pit_test(full.pit).pvalue > 1e-3
    ids, tlp = _topk(lp, 20)
    top = score_topk(ids, tlp, toks, lp[np.arange(len(toks)), toks], params, rng, vocab_size=V)
    assert top.out_of_support == 0
    assert len(top.pit) + top.skipped == 3000 and len(top.pit) > 1000
    assert pit_test(top.pit).pvalue > 1e-3
    if params.temperature == 1.0 and params.plain:  # the tail bucket keeps every token
        assert top.skipped == 0


@pytest.mark.parametrize("params", [SamplerParams(1.0), SamplerParams(0.8, top_p=0.9)], ids=str)
@pytest.mark.parametrize("fault_t", [0.9, 1.1])
def test_pit_rejects_a_sampler_at_the_wrong_temperature(params: SamplerParams, fault_t: float) -> None:
    lp, toks = _stream(params, 3000, seed=3, fault_t=fault_t)
    rng = np.random.default_rng(4)
    full = score_full(lp, toks, params, rng)
    ids, tlp = _topk(lp, 20)
    top = score_topk(ids, tlp, toks, lp[np.arange(len(toks)), toks], params, rng, vocab_size=V)
    for s, bound in ((full, 1e-6), (top, 1e-3)):  # top-K conditioning loses some power (documented)
        r = pit_test(s.pit)
        assert r.pvalue < bound, r
        assert ("sharper" in r.detail) == (fault_t < 1)


def test_impossible_tokens_are_counted_not_scored() -> None:
    params = SamplerParams(1.0, top_k=5)
    lp, _ = _stream(SamplerParams(1.0), 200, seed=5)
    order = np.argsort(-lp, axis=1)
    sixth = order[:, 5]  # always outside the top-5 support
    s = score_full(lp, sixth, params, np.random.default_rng(0))
    # provably impossible only beyond the numeric tolerance: a sixth token within 2 x tol of the
    # fifth could be inside the support of an engine whose log-probs differ by tol
    rows = np.arange(200)
    gap = lp[rows, order[:, 4]] - lp[rows, sixth]
    clear = int((gap > 2 * OOS_TOLERANCE_NATS).sum())
    assert 0 < clear < 200
    assert s.out_of_support == clear and s.oos_reasons == {"top_k": clear} and len(s.pit) == 0
    assert s.skipped == 200 - clear
    exact = score_full(lp, sixth, params, np.random.default_rng(0), tolerance=0.0)
    assert exact.out_of_support == 200


def test_min_p_violations_are_counted_and_named_min_p() -> None:
    """A decoder that ignores min-p (vLLM 0.32 refuses min-p requests with speculation, so no in-process
    fault exists): tokens below min_p x the top token's probability are impossible, named min_p."""
    params = SamplerParams(1.0, min_p=0.1)
    lp, _ = _stream(SamplerParams(1.0), 200, seed=6)
    rows = np.arange(200)
    last = np.argmin(lp, axis=1)  # the least likely token of each row
    s = score_full(lp, last, params, np.random.default_rng(0))
    below = (lp[rows, last] - lp.max(axis=1)) < math.log(params.min_p) - 2 * OOS_TOLERANCE_NATS
    clear = int(below.sum())
    assert clear > 0 and s.out_of_support == clear and s.oos_reasons == {"min_p": clear}
    first = np.argmax(lp, axis=1)  # the most likely token is never below min-p
    assert score_full(lp, first, params, np.random.default_rng(0)).out_of_support == 0


def test_anderson_darling_pvalues_hold_at_small_alpha() -> None:
    """The gate uses alpha ~1e-3 after adjustment: simulate 200k null statistics at n = 50 (the
    1e-4 level is in the asymptotic-tail branch, z > 8)."""
    rng = np.random.default_rng(7)
    ps = np.array([anderson_darling_uniform(rng.random(50))[1] for _ in range(200_000)])
    for alpha, lo, hi in ((0.01, 0.0088, 0.0112), (1e-3, 0.0007, 0.0013), (1e-4, 0.00004, 0.00018)):
        assert lo <= (ps < alpha).mean() <= hi, (alpha, (ps < alpha).mean())


def test_anderson_darling_tail_is_continuous_monotone_and_never_absurd() -> None:
    """Marsaglia's fit has an absolute error of ~1e-6 and diverges far out (z = 18 gave 1e-60 for a
    true ~4e-9); the tail branch must join it continuously and follow sqrt(3) erfc(sqrt(z))."""
    from quality_sidecar.detectors import conformance_stats as c

    zs = np.linspace(0.3, 40, 4000)
    ps = np.array([c._adinf_sf(z) for z in zs])
    assert np.all(np.diff(ps) <= 0)
    assert c._adinf_sf(c.AD_TAIL_FROM - 1e-9) == pytest.approx(c._adinf_sf(c.AD_TAIL_FROM), rel=1e-6)
    assert c._adinf_sf(18.0) == pytest.approx(math.sqrt(3) * math.erfc(math.sqrt(18.0)), rel=0.02)


def test_pit_cusum_keeps_its_ert_in_tokens_whatever_the_lengths() -> None:
    """Uniform PIT values are lighter-tailed than N(0,1) and sample boundaries only delay crossings:
    the Gaussian (Siegmund) calibration holds for 1-token and 48-token samples alike."""
    rng = np.random.default_rng(8)
    for m in (1, 48):
        c = PitCusum(ert_tokens=2_000, shift=0.5, restart_after_alarm=True)
        n_tokens = 480_000
        u = rng.random(n_tokens)
        c.update(list(u.reshape(-1, m)))
        measured = n_tokens / max(1, c.alarms_)
        assert measured > 2_000 * 0.85, (m, measured)
    assert siegmund_arl(0.02, PitCusum(ert_tokens=1e9, shift=0.04).threshold_) == pytest.approx(2e9, rel=1e-6)


def test_pit_cusum_is_unbiased_when_lengths_depend_on_the_tokens() -> None:
    """A sample stops early when it draws a likely token (like EOS): per-sample length-normalised z
    would drift; the token-level chart must not."""
    rng = np.random.default_rng(11)
    samples = []
    for u in rng.random((60_000, 48)):
        stop = np.flatnonzero(u < 0.05)
        samples.append(u[: stop[0] + 1] if len(stop) else u)
    c = PitCusum(ert_tokens=10_000, shift=0.2, restart_after_alarm=True)
    c.update(samples)
    tokens = sum(map(len, samples))
    assert abs(c.mean_u - 0.5) < 4 * 0.2887 / math.sqrt(tokens)
    assert tokens / max(1, c.alarms_) > 10_000 * 0.8


def test_pit_cusum_alarms_fast_on_a_shift_and_latches_until_reset() -> None:
    rng = np.random.default_rng(9)
    c = PitCusum(ert_tokens=1e9, shift=0.04)
    sharper = [rng.random(40) ** 1.1 for _ in range(2000)]  # mean u 0.476: a sampler too sharp
    r = c.update(sharper)
    assert r.alarm and r.alarm_index is not None and r.alarm_index < 300
    assert "sharper" in r.extra["direction"]
    assert c.update([rng.random(40) for _ in range(100)]).alarm  # latched
    c2 = PitCusum(ert_tokens=1e9, shift=0.04)
    c2.set_state(c.get_state())
    assert c2.alarm_ and c2.n_ == c.n_ and c2.tokens_ == c.tokens_
    c.reset()
    assert not c.update([rng.random(40) for _ in range(100)]).alarm


def test_likelihood_shift_is_calibrated_and_detects_small_shifts() -> None:
    rng = np.random.default_rng(10)
    false = 0
    for rep in range(200):
        mu = rng.normal(-3.5, 0.6, size=120)  # per-prompt mean log-prob
        base = {i: list(mu[i] + rng.normal(0, 0.4, 2)) for i in range(120)}
        cand = {i: list(mu[i] + rng.normal(0, 0.4, 2)) for i in range(120)}
        false += likelihood_shift(base, cand, n_flips=2000, seed=rep).pvalue < 0.01
    assert false <= 8  # 2 expected at alpha 0.01 (binomial 99.9% bound ~8)
    mu = rng.normal(-3.5, 0.6, size=120)
    base = {i: list(mu[i] + rng.normal(0, 0.4, 2)) for i in range(120)}
    cand = {i: list(mu[i] + 0.2 + rng.normal(0, 0.4, 2)) for i in range(120)}  # ~5 se
    r = likelihood_shift(base, cand)
    assert r.paired and r.pvalue < 1e-3 and r.ci_low < 0.2 < r.ci_high


@pytest.mark.parametrize("params", PARAMS, ids=str)
def test_full_row_pit_is_the_pit_of_sampler_probs(params: SamplerParams) -> None:
    """``score_topk`` (interval bounds for an unknown tail) and ``sampler_probs`` (full rows) both encode
    vLLM's sampler; with full rows they must give the very same PIT values, so neither can drift."""
    from quality_sidecar.detectors.conformance_scoring import sampler_probs

    lp, toks = _stream(params, 400, seed=5)
    full = score_full(lp, toks, params, np.random.default_rng(9))
    q = sampler_probs(lp, params)
    v = np.random.default_rng(9).random(len(toks))  # the same V draws score_topk made
    order = np.argsort(-lp, axis=1, kind="stable")  # descending, ties in vocab order, as the scorer ranks
    qs = np.take_along_axis(q, order, axis=1)
    pos = np.argmax(order == toks[:, None], axis=1)
    rows = np.arange(len(toks))
    above = (np.cumsum(qs, axis=1) - qs)[rows, pos]
    u = above + v * qs[rows, pos]
    np.testing.assert_allclose(full.pit, u, atol=1e-9)


@pytest.mark.parametrize("sampling, reason", [
    ({"temperature": 0.0, "presence_penalty": 1.0}, None),
    ({"temperature": 0.8, "presence_penalty": 0.5}, "penalties"),
    ({"temperature": 0.8, "repetition_penalty": 1.2}, "penalties"),
    ({"temperature": 0.8, "logit_bias": {"5": 3}}, "logits_modified"),
    ({"temperature": 0.8, "logits_modified": True}, "logits_modified"),
    ({"temperature": 0.8, "logits_modified": True, "allowed_token_ids": [3, 5]}, "allowed_token_ids"),
    ({"temperature": 0.8, "allowed_token_ids_count": 5000}, "allowed_token_ids"),
    ({"temperature": 0.8, "bad_words_token_ids": [[7, 8]]}, "bad_words"),
    ({"temperature": 0.8, "logits_modified": True, "bad_words": ["foo"]}, "bad_words"),
    ({"temperature": 0.8, "response_format": {"type": "json_object"}}, "structured_output"),
    ({"temperature": 0.8, "top_p": 0.9}, "plain"),
])
def test_every_unscorable_t_above_0_sample_has_a_reason(sampling: dict, reason: str | None) -> None:
    """T>0 samples the scorer cannot judge are counted by reason, never silently ineligible."""
    from quality_sidecar.baseline_scoring import scorable

    s = {"sampling": sampling, "prompt_token_ids": [1, 2], "output": {"token_ids": [3], "finish_reason": "stop"}}
    got = scorable(s)
    assert (got if not isinstance(got, SamplerParams) else "plain") == reason
