"""Paired statistics for baseline-vs-candidate on the same prompts (see anchors/quality.md §4).

* pass/fail per item -> McNemar exact test (binomial on the discordant pairs) and a paired bootstrap
  CI of the pass-rate delta (items resampled together, so the pairing is kept);
* many tasks -> Holm (default), Benjamini-Hochberg or Bonferroni adjusted p-values;
* T=0 token streams -> exact-match rate and first-divergence position, judged against the A/A rate;
* T>0 samples -> two-sample tests on sequence features (rates: Fisher exact; length: the sidecar's
  tie-corrected Mann-Whitney, called from analysis) next to the likelihood tests (gate.inprocess_scoring);
* minimum detectable effect of a McNemar test (Connor 1987) for a given size and discordance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class PairedRates:
    n: int
    base_rate: float
    cand_rate: float
    delta: float  # candidate - baseline
    n10: int  # baseline pass, candidate fail (regressions)
    n01: int  # baseline fail, candidate pass (improvements)
    p_value: float  # two-sided exact McNemar
    ci_low: float
    ci_high: float


def mcnemar_p(n10: int, n01: int) -> float:
    """Exact two-sided McNemar p-value; 1.0 when there are no discordant pairs."""
    if n10 + n01 == 0:
        return 1.0
    return float(stats.binomtest(n10, n10 + n01, 0.5).pvalue)


def bootstrap_delta_ci(base: np.ndarray, cand: np.ndarray, *, resamples: int = 2000,
                       confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile CI of mean(cand - base) from resampling items (pairs stay together)."""
    diff = cand.astype(float) - base.astype(float)
    if len(diff) == 0:
        return (0.0, 0.0)
    if np.all(diff == diff[0]):
        return (float(diff[0]), float(diff[0]))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(diff), size=(resamples, len(diff)))
    means = diff[idx].mean(axis=1)
    a = (1 - confidence) / 2
    return (float(np.quantile(means, a)), float(np.quantile(means, 1 - a)))


def paired_rates(base: Sequence[bool], cand: Sequence[bool], *, resamples: int = 2000,
                 confidence: float = 0.95, seed: int = 0) -> PairedRates:
    b = np.asarray(base, dtype=bool)
    c = np.asarray(cand, dtype=bool)
    if b.shape != c.shape:
        raise ValueError("paired samples must have the same length")
    n = len(b)
    n10 = int(np.sum(b & ~c))
    n01 = int(np.sum(~b & c))
    lo, hi = bootstrap_delta_ci(b, c, resamples=resamples, confidence=confidence, seed=seed)
    br = float(b.mean()) if n else 0.0
    cr = float(c.mean()) if n else 0.0
    return PairedRates(n, br, cr, cr - br, n10, n01, mcnemar_p(n10, n01), lo, hi)


def adjust_pvalues(pvals: Sequence[float], method: str = "holm") -> list[float]:
    """Multiple-testing adjusted p-values: holm | bh | bonferroni | none."""
    p = np.asarray(pvals, dtype=float)
    m = len(p)
    if m == 0:
        return []
    if method == "none":
        return p.tolist()
    if method == "bonferroni":
        return np.minimum(1.0, p * m).tolist()
    order = np.argsort(p)
    adj = np.empty(m)
    if method == "holm":
        running = 0.0
        for rank, i in enumerate(order):
            running = max(running, min(1.0, (m - rank) * p[i]))
            adj[i] = running
        return adj.tolist()
    if method == "bh":
        running = 1.0
        for rank in range(m - 1, -1, -1):
            i = order[rank]
            running = min(running, p[i] * m / (rank + 1))
            adj[i] = min(1.0, running)
        return adj.tolist()
    raise ValueError(f"unknown multiple-testing method {method!r}: use holm, bh, bonferroni or none")


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token, None when the sequences are identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def fisher_greater_p(k1: int, n1: int, k2: int, n2: int) -> float:
    """One-sided Fisher exact p that rate 1 (k1/n1) exceeds rate 2 (k2/n2)."""
    if n1 == 0 or n2 == 0:
        return 1.0
    return float(stats.fisher_exact([[k1, n1 - k1], [k2, n2 - k2]], alternative="greater").pvalue)


# Impossible tokens (outside the request's top-p / top-k / min-p cut or the vocabulary) an exact decoder
# may still show per scored token: boundary flips between the serving engine and the scorer.  fp32: 0 in
# ~200k tokens measured (benchmarks/results/impossible_tokens.json); bf16 rounds top-p boundaries
# differently per batch shape, so its floor is 50x higher.  Unknown dtype (endpoint mode): the larger.
IMPOSSIBLE_FLOOR_PER_TOKEN = {"float32": 1e-6, "bfloat16": 5e-5, "float16": 5e-5}


def impossible_tokens_p(k_cand: int, n_cand: int, k_base: int, n_base: int, floor_per_token: float) -> float:
    """One-sided Poisson p of the candidate's ``k_cand`` impossible tokens in ``n_cand`` scored tokens
    against a tolerated rate: the larger of ``floor_per_token`` (the dtype's boundary flips) and the
    baseline arm's own rate with one pseudo-count, (k_base + 1) / n_base -- a scorer that disagrees with
    the serving engine shows on the baseline arm too and raises the tolerance with it.

    Why not the conditional binomial against the baseline arm alone: with the baseline arm at 0 (fp32)
    it needs ~10 impossible tokens in a gate run to reject at the Holm level, and a top-p-ignored fault
    on a small eval subset draws fewer; the measured rate of exact decoders (0 in ~200k fp32 tokens) is
    what the floor encodes."""
    if k_cand == 0 or n_cand == 0:
        return 1.0
    rate = max(floor_per_token, (k_base + 1) / n_base if n_base else 0.0)
    return float(stats.poisson.sf(k_cand - 1, rate * n_cand))


def fisher_two_sided_p(k1: int, n1: int, k2: int, n2: int) -> float:
    if n1 == 0 or n2 == 0:
        return 1.0
    return float(stats.fisher_exact([[k1, n1 - k1], [k2, n2 - k2]]).pvalue)


def quantiles(xs: Sequence[float | None]) -> dict[str, float | None]:
    v = np.asarray([x for x in xs if x is not None], dtype=float)
    if len(v) == 0:
        return {"p50": None, "p95": None, "mean": None, "n": 0}
    return {"p50": float(np.percentile(v, 50)), "p95": float(np.percentile(v, 95)),
            "mean": float(v.mean()), "n": int(len(v))}


def mcnemar_mde(n: int, p_discordant: float, *, alpha: float = 0.05, power: float = 0.8) -> float | None:
    """Smallest |pass-rate delta| a two-sided McNemar test detects with ``power`` (Connor 1987):
    n = [z_{a/2} sqrt(p_d) + z_b sqrt(p_d - d^2)]^2 / d^2, solved for d.  None when even d = p_d
    (every discordant pair one way) is out of reach."""
    if n <= 0 or p_discordant <= 0:
        return None
    za = stats.norm.ppf(1 - alpha / 2)
    zb = stats.norm.ppf(power)

    def needed(d: float) -> float:
        return (za * math.sqrt(p_discordant) + zb * math.sqrt(max(p_discordant - d * d, 0.0))) ** 2 / (d * d)

    hi = min(p_discordant, math.sqrt(p_discordant))
    if needed(hi) > n:
        return None
    lo = 1e-9
    for _ in range(100):
        mid = (lo + hi) / 2
        if needed(mid) > n:
            lo = mid
        else:
            hi = mid
    return hi


def paired_noninferiority_p(n10: int, n01: int, n: int, margin: float) -> float:
    """One-sided p of H0: delta <= -margin against H1: delta > -margin, delta = p01 - p10 the paired
    difference of rates (candidate - baseline; n10 regressions, n01 improvements of n pairs).

    Tango's (1998) score test for matched pairs: the variance is taken under H0, from the multinomial
    MLE of (p10, p01) restricted to p01 - p10 = -margin (found numerically here), so the test keeps its
    level where the Wald test does not: with no discordant pair the Wald variance is 0 and it would
    "prove" anything; the score test needs n * margin / (1 - margin) > z^2 (n = 122 at margin 0.05
    gives p = 0.006, n = 12 gives p = 0.21).  A small p proves the drop is smaller than ``margin``.
    The one-sided half of a TOST equivalence test."""
    from scipy.optimize import brentq

    if n <= 0:
        return 1.0
    if not 0 < margin < 1:
        raise ValueError(f"margin must be in (0, 1), got {margin}")
    rest = n - n10 - n01
    m = margin
    lo, hi = m, (1 + m) / 2  # p10 in (m, (1+m)/2) keeps p01 = p10 - m and 1 - p10 - p01 in (0, 1)
    eps = 1e-12

    def dlog(p10: float) -> float:  # derivative of the restricted log-likelihood in p10
        return n10 / p10 + n01 / (p10 - m) - 2 * rest / (1 - 2 * p10 + m)

    a, b = lo + eps * (1 + lo), hi - eps
    if dlog(a) <= 0:
        p10 = lo
    elif dlog(b) >= 0:
        p10 = hi
    else:
        p10 = brentq(dlog, a, b, xtol=1e-14)
    p01 = max(p10 - m, 0.0)
    var = (p10 + p01 - m * m) / n
    d = (n01 - n10) / n
    if var <= 0:
        return 0.0 if d > -m else 1.0
    return float(stats.norm.sf((d + m) / math.sqrt(var)))
