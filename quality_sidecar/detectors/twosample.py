"""Two-sample tests for T>0 outputs (baseline vs candidate, or frozen reference vs current window).

Plain functions, each returning ``TestResult(name, statistic, pvalue, detail)``, so the release gate
can import them directly (documented in docs/sidecar.md):

* ``length_test``      - Cramer-von Mises two-sample (lengths are discrete and tied: no KS);
* ``finish_reason_test`` - chi-square on the finish-reason contingency table;
* ``rate_test``        - Fisher exact test on a behavioural flag (refusal, format_invalid, ...);
* ``text_mmd_test``    - MMD^2 on text embeddings (hashed word n-grams by default, MiniLM sentence
                         embeddings as an option: ``embedders.py``), RBF kernel (median
                         heuristic), permutation null (offline / gate);
* ``linear_mmd_test``  - linear-time MMD with its asymptotic normal null (streaming: cheap, and
                         valid at the tiny per-window alpha an ERT budget asks for);
* ``holm`` / ``benjamini_hochberg`` - multiple-testing control across metrics.

``WindowedTwoSample`` wraps any of them in the estimator shape (``fit(reference)``,
``update(batch) -> Result``) with per-window alpha = window / ERT.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .base import Result
from .embedders import Embedder, HashedNgramEmbedder


@dataclass(frozen=True)
class TestResult:
    name: str
    statistic: float
    pvalue: float
    detail: str = ""


def length_test(a: Sequence[float], b: Sequence[float]) -> TestResult:
    from scipy.stats import cramervonmises_2samp

    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 2 or len(b) < 2:
        return TestResult("length", 0.0, 1.0, "too few samples")
    r = cramervonmises_2samp(a, b)
    return TestResult("length", float(r.statistic), float(r.pvalue),
                      f"mean {a.mean():.1f} -> {b.mean():.1f} tokens")


def finish_reason_test(a: Sequence[str | None], b: Sequence[str | None]) -> TestResult:
    from scipy.stats import chi2_contingency

    cats = sorted({str(x) for x in a} | {str(x) for x in b})
    table = np.array([[sum(1 for x in s if str(x) == c) for c in cats] for s in (a, b)])
    table = table[:, table.sum(axis=0) > 0]
    if table.shape[1] < 2 or min(len(a), len(b)) == 0:
        return TestResult("finish_reason", 0.0, 1.0, "one category only")
    r = chi2_contingency(table)
    share = {c: round(float(v), 4) for c, v in zip(cats, table[1] / max(1, table[1].sum()))}
    return TestResult("finish_reason", float(r.statistic), float(r.pvalue), f"candidate shares {share}")


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


def hashed_ngrams(texts: Sequence[str | None], n_features: int = 2 ** 12) -> np.ndarray:
    """L2-normalised hashed word 1-2 gram counts (the default text embedding)."""
    return HashedNgramEmbedder(n_features)(texts)


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
    z = (embed or hashed_ngrams)(a + b)
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
    emb = embed or hashed_ngrams
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


def benjamini_hochberg(pvalues: Sequence[float]) -> np.ndarray:
    from scipy.stats import false_discovery_control

    return false_discovery_control(np.asarray(pvalues, float), method="bh")


class WindowedTwoSample:
    """Estimator wrapper: reference window vs. a sliding current window, tested every ``window``.

    Alarm when p < alpha with alpha = window / ert, so that tests repeated every ``window`` samples
    on a drift-free stream fire on average once per ``ert`` samples (the windows do not overlap, so
    the rounds are independent given the reference).
    """

    def __init__(self, name: str, test: Callable[[Sequence, Sequence], TestResult], ert: float,
                 window: int = 1000):
        self.name, self.test, self.ert, self.window = name, test, ert, window
        self.alpha = window / ert

    def fit(self, reference) -> WindowedTwoSample:
        self.reference_ = list(reference)
        self.current_: deque = deque(maxlen=self.window)
        self.pending_, self.n_, self.alarm_ = 0, 0, False
        self.last_ = Result(self.name, 0.0, self.alpha, False, pvalue=1.0)
        return self

    def update(self, batch) -> Result:
        new = False
        for x in batch:
            self.current_.append(x)
            self.pending_ += 1
            self.n_ += 1
            if self.pending_ >= self.window:
                self.pending_ = 0
                r = self.test(self.reference_, list(self.current_))
                fire = r.pvalue < self.alpha
                new = new or (fire and not self.alarm_)
                self.alarm_ = self.alarm_ or fire
                self.last_ = Result(self.name, r.statistic, self.alpha, self.alarm_, pvalue=r.pvalue,
                                    n=self.n_, extra={"detail": r.detail})
        self.last_.alarm_new = new
        self.last_.alarm = self.alarm_
        return self.last_
