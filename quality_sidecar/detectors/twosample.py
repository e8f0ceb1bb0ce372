"""Two-sample tests for T>0 outputs (baseline vs candidate, or frozen reference vs current window).

Plain functions, each returning ``TestResult(name, statistic, pvalue, detail)``, so the release gate
can import them directly (documented in docs/sidecar.md): ``length_test``, ``finish_reason_test``,
``rate_test`` (a behavioural flag), ``text_mmd_test`` (permutation null: offline / gate),
``linear_mmd_test`` (normal null: cheap, and valid at the tiny per-window alpha of the stream), and
``holm`` across them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .embedders import Embedder, make_embedder


@dataclass(frozen=True)
class TestResult:
    name: str
    statistic: float
    pvalue: float
    detail: str = ""


LENGTH_METHODS = ("mannwhitney", "permutation")


def length_test(a: Sequence[float], b: Sequence[float], method: str = "mannwhitney",
                n_permutations: int = 4999, seed: int = 0) -> TestResult:
    """Did the output-length distribution move between ``a`` and ``b`` (token counts)?

    Real lengths are discrete and heavily tied (at a small ``max_tokens`` most outputs stop at the
    cap), which makes tests that assume continuous data invalid (Cramer-von Mises calls two exact
    decoders different).  Both methods here stay valid with ties and with the cap:

    * ``"mannwhitney"`` (default; streaming, ``ArmComparison``): Mann-Whitney U on midranks with the
      tie-corrected variance, which under the null (exchangeable windows) is the exact variance of
      U's permutation distribution given the ties; U is a sum drawn without replacement from fixed
      scores, so Hajek's CLT holds with any tie pattern.  Chosen over Welch on log1p(length): nothing
      is estimated and the cap is one tie block, not an outlier; O(n log n) per window.  False-alarm
      rate on real exact-decoder streams: benchmarks/twosample_false_alarms.py, docs/sidecar.md.
    * ``"permutation"`` (offline ``score``, alpha 0.05-0.01): Monte-Carlo permutation test of the
      difference of mean length ("did the cost change"), p = (1 + #{|perm| >= |obs|}) / (1 +
      n_permutations): exact at every alpha for any data, but never below 1 / (1 + n_permutations),
      so not for tiny streaming alphas.
    """
    if method not in LENGTH_METHODS:
        raise ValueError(f"length_test method must be one of {LENGTH_METHODS}, got {method!r}")
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 2 or len(b) < 2:
        return TestResult("length", 0.0, 1.0, "too few samples")
    detail = f"mean {a.mean():.1f} -> {b.mean():.1f} tokens"
    if method == "permutation":
        diff, p = _permutation_mean_diff(a, b, n_permutations, seed)
        return TestResult("length", diff, p, f"{detail}; permutation test of the mean, {n_permutations} draws")
    z, p = _mannwhitney_ties(a, b)
    return TestResult("length", z, p, f"{detail}; Mann-Whitney z={z:.2f} (tie-corrected)")


def _mannwhitney_ties(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Two-sided tie-corrected Mann-Whitney: (z, p), normal approximation without continuity term.

    Written out, not scipy's ``mannwhitneyu``, so that the benchmark can vectorise the same formula
    (checked against scipy in tests/sidecar/test_detectors.py)."""
    from scipy.stats import norm, rankdata

    n, m = len(a), len(b)
    ranks = rankdata(np.concatenate([a, b]))
    u = float(ranks[:n].sum() - n * (n + 1) / 2)
    _, t = np.unique(np.concatenate([a, b]), return_counts=True)
    big = n + m
    var = n * m / 12.0 * ((big + 1) - float((t.astype(float) ** 3 - t).sum()) / (big * (big - 1)))
    if var <= 0:  # every value tied: no evidence of any difference
        return 0.0, 1.0
    z = (u - n * m / 2.0) / np.sqrt(var)
    return float(z), float(min(1.0, 2 * norm.sf(abs(z))))


def _permutation_mean_diff(a: np.ndarray, b: np.ndarray, n_permutations: int,
                           seed: int) -> tuple[float, float]:
    """(mean(b) - mean(a), two-sided add-one Monte-Carlo permutation p-value)."""
    rng = np.random.default_rng(seed)
    z = np.concatenate([a, b])
    n, total = len(a), float(z.sum())
    obs = b.mean() - a.mean()

    def diffs(sum_a: np.ndarray) -> np.ndarray:
        return (total - sum_a) / len(b) - sum_a / n

    hits, done = 0, 0
    chunk = max(1, 2_000_000 // len(z))
    while done < n_permutations:
        r = min(chunk, n_permutations - done)
        idx = np.argsort(rng.random((r, len(z))), axis=1)[:, :n]
        d = diffs(z[idx].sum(axis=1))
        hits += int((np.abs(d) >= abs(obs) - 1e-12 * max(1.0, abs(obs))).sum())
        done += r
    return float(obs), (1 + hits) / (1 + n_permutations)


def finish_reason_test(a: Sequence[str | None], b: Sequence[str | None]) -> TestResult:
    """Did the finish-reason mix change between ``a`` and ``b``?

    Real tables have rare reasons (abort, error) next to a dominant one, where the chi-square
    approximation is poor: categories whose expected count is below 5 in either row are merged into
    one ``other`` column, two columns (the usual stop vs length) get Fisher's exact test (conditional,
    never anti-conservative), and chi-square only tables of three or more well-filled columns.
    """
    from scipy.stats import chi2_contingency, fisher_exact

    cats = sorted({str(x) for x in a} | {str(x) for x in b})
    table = np.array([[sum(1 for x in s if str(x) == c) for c in cats] for s in (a, b)], dtype=np.int64)
    keep = table.sum(axis=0) > 0
    table, cats = table[:, keep], [c for c, k in zip(cats, keep) if k]
    if table.shape[1] < 2 or min(len(a), len(b)) == 0:
        return TestResult("finish_reason", 0.0, 1.0, "one category only")
    share = {c: round(float(v), 4) for c, v in zip(cats, table[1] / max(1, table[1].sum()))}
    expected = np.outer(table.sum(1), table.sum(0)) / table.sum()
    sparse = (expected < 5).any(axis=0)
    if table.shape[1] > 2 and sparse.all():
        # Everything sparse: the largest category against the rest, still an exact 2x2 test.
        top = int(np.argmax(table.sum(axis=0)))
        table = np.column_stack([table[:, top], table.sum(axis=1) - table[:, top]])
    elif table.shape[1] > 2 and sparse.any():
        table = np.column_stack([table[:, ~sparse], table[:, sparse].sum(axis=1)])
    if table.shape[1] == 2:
        _, p = fisher_exact(table)
        return TestResult("finish_reason", float(table[1, 0] / max(1, table[1].sum())
                                                 - table[0, 0] / max(1, table[0].sum())),
                          float(p), f"Fisher exact; candidate shares {share}")
    r = chi2_contingency(table)
    return TestResult("finish_reason", float(r.statistic), float(r.pvalue), f"chi-square; candidate shares {share}")


def rate_test(a: Sequence[bool], b: Sequence[bool], name: str = "rate",
              alternative: str = "two-sided") -> TestResult:
    """Fisher exact test of the flag rate in ``b`` vs ``a``; ``alternative='greater'`` = b higher."""
    from scipy.stats import fisher_exact

    a, b = np.asarray(a, bool), np.asarray(b, bool)
    ka, kb = int(a.sum()), int(b.sum())
    if len(a) == 0 or len(b) == 0:
        return TestResult(name, 0.0, 1.0, "too few samples")
    alt = {"greater": "less", "less": "greater"}.get(alternative, alternative)  # table rows are (a, b)
    odds, p = fisher_exact([[ka, len(a) - ka], [kb, len(b) - kb]], alternative=alt)
    return TestResult(name, float(kb / len(b) - ka / len(a)), float(p),
                      f"{ka / len(a):.4f} -> {kb / len(b):.4f}")


def _rbf_gamma(z: np.ndarray, rng: np.random.Generator) -> float:
    idx = rng.choice(len(z), size=min(len(z), 300), replace=False)
    s = z[idx]
    d2 = np.maximum(0, (s * s).sum(1)[:, None] + (s * s).sum(1)[None, :] - 2 * s @ s.T)
    med = np.median(d2[np.triu_indices(len(s), 1)])
    return 1.0 / max(med, 1e-6)


def text_mmd_test(a: Sequence[str | None], b: Sequence[str | None], n_permutations: int = 200,
                  seed: int = 0, max_n: int = 1000, embed: Embedder | None = None) -> TestResult:
    """Unbiased MMD^2 with an RBF kernel on text embeddings (default: hashed n-grams);
    permutation p-value (add-one)."""
    a, b = list(a)[-max_n:], list(b)[-max_n:]
    if len(a) < 5 or len(b) < 5:
        return TestResult("text_mmd", 0.0, 1.0, "too few samples")
    z = (embed or make_embedder())(a + b)
    return mmd_permutation_test(z[:len(a)], z[len(a):], n_permutations, seed)


def mmd_permutation_test(x: np.ndarray, y: np.ndarray, n_permutations: int = 200, seed: int = 0,
                         name: str = "text_mmd") -> TestResult:
    """Unbiased MMD^2 between two sets of vectors, RBF kernel (median heuristic), permutation null."""
    rng = np.random.default_rng(seed)
    z = np.vstack([x, y]).astype(np.float64)
    gamma = _rbf_gamma(z, rng)
    sq = (z * z).sum(1)
    k = np.exp(-gamma * np.maximum(0, sq[:, None] + sq[None, :] - 2 * z @ z.T))
    np.fill_diagonal(k, 0.0)
    n, m = len(x), len(y)

    def mmd(ix: np.ndarray) -> float:
        xi, yi = ix[:n], ix[n:]
        kxx = k[np.ix_(xi, xi)].sum() / (n * (n - 1))
        kyy = k[np.ix_(yi, yi)].sum() / (m * (m - 1))
        kxy = k[np.ix_(xi, yi)].mean()
        return kxx + kyy - 2 * kxy

    ix = np.arange(n + m)
    obs = mmd(ix)
    null = np.array([mmd(rng.permutation(ix)) for _ in range(n_permutations)])
    p = (1 + (null >= obs).sum()) / (n_permutations + 1)
    return TestResult(name, float(obs), float(p), f"gamma={gamma:.3g}")


def linear_mmd_test(a: Sequence[str | None], b: Sequence[str | None],
                    embed: Embedder | None = None) -> TestResult:
    """Gretton's linear-time MMD^2 on text embeddings (default: hashed n-grams), normal null."""
    m = min(len(a), len(b)) // 2 * 2
    if m < 20:
        return TestResult("text_mmd", 0.0, 1.0, "too few samples")
    emb = embed or make_embedder()
    return linear_mmd(emb(list(a)[:m]), emb(list(b)[:m]))


def linear_mmd(x: np.ndarray, y: np.ndarray, name: str = "text_mmd") -> TestResult:
    """Linear-time MMD^2 (RBF, median heuristic) between two sets of vectors; one-sided normal null.

    O(n) and streaming-friendly; its power is below the quadratic test's at the same n, which is
    the price of testing every window on the consumer's budget."""
    from scipy.stats import norm

    m = min(len(x), len(y)) // 2 * 2
    if m < 20:
        return TestResult(name, 0.0, 1.0, "too few samples")
    x, y = np.asarray(x[:m], np.float64), np.asarray(y[:m], np.float64)
    gamma = _rbf_gamma(np.vstack([x, y]), np.random.default_rng(0))

    def kern(u, v):
        return np.exp(-gamma * ((u - v) ** 2).sum(1))

    x1, x2, y1, y2 = x[0::2], x[1::2], y[0::2], y[1::2]
    h = kern(x1, x2) + kern(y1, y2) - kern(x1, y2) - kern(x2, y1)
    se = h.std(ddof=1) / np.sqrt(len(h))
    z = float(h.mean() / se) if se > 0 else 0.0
    return TestResult(name, float(h.mean()), float(norm.sf(z)), f"z={z:.2f}")


def holm(pvalues: Sequence[float]) -> np.ndarray:
    """Holm-adjusted p-values (family-wise error control under any dependence)."""
    p = np.asarray(pvalues, float)
    order = np.argsort(p)
    adj = np.empty_like(p)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, (len(p) - rank) * p[i])
        adj[i] = min(1.0, running)
    return adj

