"""Batch-aware draft budget: how many draft tokens the whole batch gets this step (0 allowed).

Why a model of the engine's own step time: a draft row pays only if its expected accepted tokens are
worth the time it adds to the step, and that depends on the hardware and the batch -- nearly free on a
memory-bound GPU, ~4% of a step per row at batch 1 on a 2-core CPU and worse at batch 32.  The engine
times its own steps and fits

    T(rows, drafting) = a + b * rows + s * [any draft in the step]

(``rows`` = running requests + draft tokens; ``s`` = vLLM's fixed spec-decode overhead: rejection
sampler, metadata) by robust least squares over a sliding window, with a weak prior so the fit is
defined before it has data.  Given every candidate draft token's probability of being committed
(``p_cum``, the product of its own and its predecessors' acceptance estimates), the step's throughput
with the D best tokens is (B + sum of their p) / T(B + D, D > 0); the D that maximises it is found by
sorting once (numpy), and drafting nothing wins unless it is beaten by ``margin``.  So tokens/s is
never knowingly traded below `none`, at any batch size, without a per-batch-size table.
"""

from __future__ import annotations

from collections import deque

import numpy as np


def threshold_allocate(p_cum: np.ndarray, owner: np.ndarray, batch: int, threshold: float,
                       max_total: int | None = None) -> np.ndarray:
    """Draft tokens per row: every candidate token with ``p_cum >= threshold`` (a prefix of its row's
    draft, as ``p_cum`` does not increase along a draft), at most ``max_total`` in all (the most probable)."""
    if len(p_cum) == 0 or max_total == 0:
        return np.zeros(batch, dtype=np.int64)
    take = np.flatnonzero(p_cum >= threshold)
    if max_total is not None and len(take) > max_total:
        take = take[np.argsort(-p_cum[take], kind="stable")[:max_total]]
    return np.bincount(owner[take], minlength=batch)


class StepCostModel:
    def __init__(self, window: int = 512, refit_every: int = 16, min_samples: int = 24,
                 prior_fixed_rows: float = 16.0, prior_weight: float = 8.0, margin: float = 0.02) -> None:
        self.window = window
        self.refit_every = refit_every
        self.min_samples = min_samples
        self.prior_fixed_rows = prior_fixed_rows  # prior: the fixed cost a equals this many rows' cost b
        self.prior_weight = prior_weight  # the prior counts as this many samples
        self.margin = margin
        self._samples: deque[tuple[float, float, float]] = deque(maxlen=window)  # rows, drafting, seconds
        self._since_fit = 0
        self.a = self.b = self.s = 0.0
        self.fitted = False

    def observe(self, rows: int, drafted: int, seconds: float) -> None:
        """One engine step with ``rows`` query rows (``drafted`` of them drafts) took ``seconds``."""
        if rows <= 0 or seconds <= 0:
            return
        if self.fitted and seconds > 4.0 * self.predict(rows, drafted):
            return  # the engine sat idle between two calls (or the machine stalled): not a step time
        self._samples.append((float(rows), 1.0 if drafted > 0 else 0.0, float(seconds)))
        self._since_fit += 1
        if len(self._samples) >= self.min_samples and (not self.fitted or self._since_fit >= self.refit_every):
            self._fit()

    def predict(self, rows: float, drafted: float) -> float:
        return self.a + self.b * rows + (self.s if drafted > 0 else 0.0)

    def _fit(self) -> None:
        self._since_fit = 0
        data = np.asarray(self._samples)
        rows, ind, t = data[:, 0], data[:, 1], data[:, 2]
        x = np.stack([np.ones_like(rows), rows, ind], axis=1)
        # prior: b = mean step time / (mean rows + prior_fixed_rows), a = prior_fixed_rows * b, s = 0
        b0 = float(np.median(t)) / (float(np.mean(rows)) + self.prior_fixed_rows)
        prior = np.array([self.prior_fixed_rows * b0, b0, 0.0])
        keep = np.ones(len(t), dtype=bool)
        coef = prior
        for _ in range(2):  # least squares, then again without the outliers of the first fit
            xk, tk = x[keep], t[keep]
            lam = self.prior_weight * np.diag([1.0, float(np.mean(rows)) ** 2 + 1.0, 1.0])
            coef = np.linalg.solve(xk.T @ xk + lam, xk.T @ tk + lam @ prior)
            res = t - x @ coef
            mad = float(np.median(np.abs(res - np.median(res)))) + 1e-9
            keep = np.abs(res) <= 4.0 * 1.4826 * mad
            if keep.sum() < self.min_samples // 2:
                break
        a, b, s = (float(v) for v in coef)
        self.b = max(b, 1e-3 * b0)  # a row never costs nothing
        self.a = max(a, 0.0)
        self.s = max(s, 0.0)
        self.fitted = True

    def allocate(self, p_cum: np.ndarray, owner: np.ndarray, batch: int,
                 default_threshold: float = 0.3, max_total: int | None = None) -> np.ndarray:
        """Draft tokens per row (length ``batch``) for candidate tokens with commit probabilities
        ``p_cum`` belonging to rows ``owner``; within a row the tokens must come in draft order with
        non-increasing ``p_cum`` (then the chosen set is a prefix of every row's draft).  Before the
        model is fitted, tokens with ``p_cum >= default_threshold`` are taken.  At most ``max_total``
        tokens in all (the most probable)."""
        counts = np.zeros(batch, dtype=np.int64)
        if len(p_cum) == 0 or max_total == 0:
            return counts
        if not self.fitted:
            return threshold_allocate(p_cum, owner, batch, default_threshold, max_total)
        order = np.argsort(-p_cum, kind="stable")
        if max_total is not None:
            order = order[:max_total]
        gain = np.cumsum(p_cum[order])
        n = np.arange(1, len(order) + 1)
        tput = (batch + gain) / (self.a + self.b * (batch + n) + self.s)
        best = int(np.argmax(tput))
        if tput[best] <= (1.0 + self.margin) * batch / (self.a + self.b * batch):
            return counts  # no draft set beats decoding without drafts
        return np.bincount(owner[order[: best + 1]], minlength=batch)

    def summary(self) -> dict[str, float]:
        return {"a_ms": 1000 * self.a, "b_ms_per_row": 1000 * self.b, "s_ms": 1000 * self.s,
                "samples": len(self._samples), "fitted": float(self.fitted)}
