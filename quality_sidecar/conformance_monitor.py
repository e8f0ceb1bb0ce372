"""``ConformanceMonitor``: one model's T>0 conformance charts -- per arm the PIT/excess charts
(``ConformanceChart``), the impossible-token chart and the token log-prob accumulators -- fed by
the scorer (baseline_scoring.py) through the pipeline.  The service persists it with the other charts
(charts.py).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .baseline_scoring import IMPOSSIBLE_ALPHA, ConformanceConfig
from .detectors.conformance_charts import ConformanceChart, ImpossibleTokenChart
from .detectors.conformance_scoring import SequenceScore


class ConformanceMonitor:
    """Per-(model, arm) PIT/excess charts, the impossible-token chart and log-prob accumulators."""

    def __init__(self, model: str, cfg: ConformanceConfig):
        self.model, self.cfg = model, cfg
        self.charts: dict[str, ConformanceChart] = {}
        self.impossible = ImpossibleTokenChart(IMPOSSIBLE_ALPHA, cfg.impossible_floor_per_token)
        self.stats: dict[str, dict[str, float]] = {}
        self.examples: dict[str, list[tuple[str | None, str]]] = {}
        self.impossible_examples: dict[str, list[tuple[str | None, str]]] = {}

    def _chart(self, arm: str) -> ConformanceChart:
        c = self.charts.get(arm)
        if c is None:
            c = self.charts[arm] = ConformanceChart("sampling_conformance", self.cfg.ert_tokens, self.cfg.shift,
                                                    late_shift=self.cfg.late_shift)
            self.stats[arm] = {"samples": 0, "tokens": 0, "pit_tokens": 0, "skipped": 0, "out_of_support": 0,
                               "lp_sum": 0.0, "lp_sumsq": 0.0}
        return c

    def add_impossible(self, arm: str, n_tokens: int, reasons: dict[str, int], trace_id: str | None,
                       request_id: str):
        """Count a sample's impossible tokens (also for samples the server refused); the chart's Result."""
        if any(reasons.values()):
            ex = self.impossible_examples.setdefault(arm, [])
            ex.append((trace_id, request_id))
            del ex[:-5]
        return self.impossible.update(arm, n_tokens, reasons)

    def add(self, arm: str, score: SequenceScore, trace_id: str | None, request_id: str,
            positions: np.ndarray | None = None):
        """Feed one scored sample (with its per-token draft positions, ``draft_positions``, if known);
        returns (the PIT/excess chart's Result, the impossible-token Result)."""
        ri = self.add_impossible(arm, score.n_tokens, score.oos_reasons, trace_id, request_id)
        chart = self._chart(arm)
        st = self.stats[arm]
        st["samples"] += 1
        st["tokens"] += score.n_tokens
        st["pit_tokens"] += len(score.pit)
        st["skipped"] += score.skipped
        st["out_of_support"] += score.out_of_support
        m = score.mean_logprob
        if math.isfinite(m):
            st["lp_sum"] += m
            st["lp_sumsq"] += m * m
        ex = self.examples.setdefault(arm, [])
        ex.append((trace_id, request_id))
        del ex[:-5]
        r = chart.update([score], [positions])
        r.extra.update(self.summary(arm))
        return r, ri

    def mean_logprob(self, arm: str) -> tuple[float, float, int]:
        """(mean of per-sample mean token log-probs, its variance, n) for an arm."""
        st = self.stats.get(arm)
        if not st or st["samples"] == 0:
            return math.nan, math.nan, 0
        n = st["samples"]
        mean = st["lp_sum"] / n
        var = max(0.0, (st["lp_sumsq"] - n * mean * mean) / (n - 1)) if n > 1 else math.nan
        return mean, var, n

    def shift(self) -> tuple[float, float, float]:
        """Candidate - baseline mean token log-prob (nats/token) with a 95% Welch CI."""
        mb, vb, nb = self.mean_logprob("baseline")
        mc, vc, nc = self.mean_logprob("candidate")
        if nb < 2 or nc < 2:
            return math.nan, math.nan, math.nan
        d = mc - mb
        se = math.sqrt(vb / nb + vc / nc)
        return d, d - 1.96 * se, d + 1.96 * se

    def summary(self, arm: str) -> dict[str, Any]:
        st = self.stats.get(arm, {})
        mean, _, n = self.mean_logprob(arm)
        d, lo, hi = self.shift()
        return {"scored_samples": n, "mean_token_logprob_nats": mean,
                "skipped_token_fraction": st.get("skipped", 0) / max(1, st.get("tokens", 0)),
                "out_of_support_tokens": st.get("out_of_support", 0),
                "logprob_shift_nats_per_token": d, "logprob_shift_ci95": [lo, hi]}

    def get_state(self) -> dict[str, Any]:
        return {"stats": self.stats, "charts": {a: c.get_state() for a, c in self.charts.items()},
                "impossible": self.impossible.get_state()}

    def set_state(self, st: dict[str, Any]) -> None:
        for arm, cs in st["charts"].items():
            self._chart(arm).set_state(cs)
        self.stats.update(st["stats"])
        self.impossible.set_state(st["impossible"])

    def reset(self, arm: str | None = None, detector: str | None = None) -> None:
        """Acknowledge: restart the chart(s) so they can fire again (accumulators are kept)."""
        if detector in (None, "sampling_conformance"):
            for a, c in self.charts.items():
                if arm is None or a == arm:
                    c.reset()
        if detector in (None, "impossible_tokens"):
            self.impossible.reset(arm)
