"""The multi-candidate sampling rule (``lade2d.lade.verify_sampled``) leaves the target distribution unchanged.

A hand-made target: P(x1) and, for every prefix, a context-dependent P(next | prefix).  Candidates with a
shared prefix, a duplicate, different lengths and a token of probability 0.  Monte Carlo: the first
emitted token must follow P(x1), and the token after each accepted prefix must follow P(. | prefix)
(chi-square, Bonferroni).  Positive control: a rule without the residual (sampling from the full P
after a rejection) must be rejected by the same test, so it has power.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from scipy import stats

from vllm_lookahead.lade2d.lade import verify_sampled

pytestmark = pytest.mark.unit
V = 5
GUESSES = [(1, 2), (1, 3, 0), (3,), (1, 2), (4, 1)]


def cond(prefix: tuple[int, ...]) -> np.ndarray:
    """P(next | prefix): a fixed, prefix-dependent distribution (P(4 | ()) = 0)."""
    if not prefix:
        return np.array([0.1, 0.4, 0.2, 0.3, 0.0])
    w = np.random.default_rng(hash(prefix) % 2**32).dirichlet(np.ones(V))
    return w


def rows_and_probs() -> tuple[list[list[int]], np.ndarray]:
    rows, probs, r = [], [cond(())], 1
    for g in GUESSES:
        rows.append(list(range(r, r + len(g))))
        probs += [cond(tuple(g[: j + 1])) for j in range(len(g))]
        r += len(g)
    return rows, np.stack(probs)


def no_residual_rule(probs, guesses, guess_rows, rng):
    """Wrong on purpose: after rejecting a token it samples from the full P (no residual)."""
    p = probs[0]
    for i, g in enumerate(guesses):
        if rng.random() < p[g[0]]:
            return [g[0], int(rng.choice(V, p=probs[guess_rows[i][0]]))], 1, i
    return [int(rng.choice(V, p=p))], 0, -1


def sample_counts(rule, n: int = 20_000):
    rows, probs = rows_and_probs()
    rng = np.random.default_rng(0)
    firsts, after = Counter(), {}
    for _ in range(n):
        out, m, winner = rule(probs, GUESSES, rows, rng)
        assert len(out) == m + 1 and (m == 0 or tuple(GUESSES[winner][:m]) == tuple(out[:m]))
        firsts[out[0]] += 1
        for j in range(1, len(out)):
            after.setdefault(tuple(out[:j]), Counter())[out[j]] += 1
    return firsts, after


def pvalue(counts: Counter, p: np.ndarray) -> float:
    n = sum(counts.values())
    obs = np.array([counts[t] for t in range(V)], dtype=float)
    exp = p * n
    keep = exp > 0
    assert obs[~keep].sum() == 0, "a token of probability 0 was emitted"
    return float(stats.chisquare(obs[keep], exp[keep]).pvalue)


def test_output_distribution_is_the_target():
    firsts, after = sample_counts(verify_sampled)
    checks = [pvalue(firsts, cond(()))]
    for prefix in [(1,), (3,), (1, 2), (1, 3)]:  # prefixes reached through accepted candidate tokens
        assert sum(after[prefix].values()) > 500, prefix
        checks.append(pvalue(after[prefix], cond(prefix)))
    assert min(checks) > 0.001 / len(checks), checks


def test_positive_control_no_residual_is_rejected():
    firsts, _ = sample_counts(no_residual_rule)
    assert pvalue(firsts, cond(())) < 1e-6
