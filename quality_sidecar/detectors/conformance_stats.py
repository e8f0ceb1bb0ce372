"""Sampling conformance, statistics: batch tests on the per-token scores of ``conformance_scoring``.

* ``pit_test``: Anderson-Darling on the PIT values u of a batch against U(0,1), chosen over a binned
  chi-square because the faults of this class move mass into the tails of u (a sharper sampler
  empties the top end u -> 1, where the low-probability tokens live) and AD weights the tails by
  1/(F(1-F)); its asymptotic null (Marsaglia & Marsaglia 2004, with their finite-n correction) is
  accurate far into the tail, so p-values stay valid at the tiny alphas of the gate and the sidecar
  (validated by simulation in tests/sidecar/test_conformance.py).  ``pit_z``: the standardized sum.
* ``excess_test`` / ``excess_totals``: the excess log-prob score summed over a stream (z test).
* ``likelihood_shift`` / ``likelihood_shift_test``: per-sample mean token log-prob (raw model, T=1)
  of candidate outputs vs baseline-arm outputs, paired by prompt; effect in nats/token with a CI.

The streaming counterparts (``PitCusum``/``ExcessCusum`` in ``cusum.py``) are run by
``conformance_charts.ConformanceChart``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .twosample import TestResult


def pit_z(u: np.ndarray) -> float:
    """Standardized sum of PIT values: exactly mean 0, variance 1 under the null; nan when empty."""
    u = np.asarray(u, float)
    if len(u) == 0:
        return math.nan
    return float((u - 0.5).sum() * math.sqrt(12.0 / len(u)))


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

    Takes the stream's sums of ``SequenceScore.excess``/``excess_var`` and its token count.
    s = log p(y) - E_q[log p] is the score of the temperature family at the sampler's distribution q
    (d/d beta of log q_beta(y), q_beta ~ q^beta, at beta = 1, up to T): the locally most powerful
    statistic against a sampler sharper or flatter than specified, and its mean *is* the fault size in
    nats/token.  Under exact sampling s has conditional mean 0 and known conditional variance v, so
    sum(s) is a martingale and z -> N(0, 1).  s is skewed (very unlikely tokens give large negative
    values), so the normal tail is used only from ``EXCESS_MIN_TOKENS`` tokens on (simulated: at 100
    tokens the lower tail is 1.6x too heavy at 1e-3, from 300 on within Monte-Carlo error;
    tests/sidecar/test_conformance_excess.py).  ``statistic`` is the effect in nats/token (mean s)."""
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
