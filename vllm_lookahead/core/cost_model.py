"""Online model of what a draft token costs, so the adaptive policy can tell when speculation pays.

One engine step takes about ``beta + alpha * tokens`` seconds, where ``tokens`` counts every query row
of the step (one per decoding request plus its draft rows).  On a memory-bound GPU ``alpha`` is close
to zero and drafts are nearly free; on a compute-bound CPU at batch 32 it is not.  The model is an
exponentially weighted least-squares fit of step wall time on step tokens, refreshed every step from
the proposer's own clock (time between ``propose()`` calls), so it follows the hardware and the load
without configuration.

The decision rule: a request whose drafts are accepted at rate ``r`` (accepted per drafted token) adds
``r`` expected tokens per draft row at ``alpha`` seconds per row; drafting it pays while
``r / alpha`` exceeds the step's current yield ``tokens committed / step seconds``.
"""

from __future__ import annotations


class StepCostModel:
    def __init__(self, decay: float = 0.97, min_steps: int = 32):
        self.decay = decay
        self.min_steps = min_steps
        self.steps = 0
        self._w = self._x = self._y = self._xx = self._xy = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or not (0.0 < seconds < 60.0):
            return
        if self.steps >= self.min_steps and seconds > 10.0 * self._y / self._w:
            return  # an idle gap between requests, not a step
        d = self.decay
        self._w = d * self._w + 1.0
        self._x = d * self._x + tokens
        self._y = d * self._y + seconds
        self._xx = d * self._xx + tokens * tokens
        self._xy = d * self._xy + tokens * seconds
        self.steps += 1

    def fit(self) -> tuple[float, float] | None:
        """(beta seconds, alpha seconds per token), or None until the data can say."""
        if self.steps < self.min_steps or self._w <= 0:
            return None
        mx, my = self._x / self._w, self._y / self._w
        var = self._xx / self._w - mx * mx
        if var < 0.25:  # token counts barely varied: the slope is not identified
            return None
        alpha = max(0.0, (self._xy / self._w - mx * my) / var)
        beta = max(0.0, my - alpha * mx)
        return beta, alpha

    def draft_allocation(self, rates: list[float], want: list[int], base_tokens: int) -> list[int]:
        """Draft lengths (0 or the wanted length) that raise expected tokens per second, best rates
        first; ``want`` unchanged while the model is not fitted."""
        fitted = self.fit()
        if fitted is None:
            return want
        beta, alpha = fitted
        if alpha <= 0.0:
            return want
        seconds = beta + alpha * base_tokens
        yield_tokens = float(base_tokens)
        out = [0] * len(want)
        for i in sorted(range(len(want)), key=lambda i: -rates[i]):
            if want[i] <= 0:
                continue
            gain = rates[i] * want[i]
            cost = alpha * want[i]
            if seconds > 0 and gain / cost > yield_tokens / seconds:
                out[i] = want[i]
                yield_tokens += gain
                seconds += cost
        return out
