"""Sampling conformance, charts: the sidecar's streaming T>0 charts on ``conformance_scoring``'s scores.

* ``ConformanceChart``: one (model, arm)'s PIT chart, excess chart and late-draft-position excess chart
  (``PitCusum`` / ``ExcessCusum`` of ``cusum.py``), alarm ``sampling_conformance`` if any fires;
* ``ImpossibleTokenChart``: tokens the sampler could not have drawn, per arm of one model against the
  baseline (control) arm, alarm ``impossible_tokens`` (an ``ArmControlChart``, like ``RepeatChart``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .base import ArmControlChart, Result, StatefulDetector
from .conformance_scoring import SequenceScore
from .cusum import ExcessCusum, PitCusum


class ConformanceChart(StatefulDetector):
    """The sidecar's T>0 chart for one (model, arm): the PIT chart and the excess chart, alarm if either,
    plus the excess chart of late draft positions.

    The four one-sided charts of the pair get a quarter of the false-alarm budget each (union
    bound), so the pair keeps ``ert_tokens`` between false alarms at a ~5% higher threshold than one
    chart alone.  The attributes the service reads (``s_up_``/``s_down_``/``threshold_``/``alarm_``/
    ``alarm_index_``/``n_``) are the charts' combined.

    ``late``: an ``ExcessCusum`` of the tokens at draft position >= 2 only (samples with the
    producer's ``spec.draft_mask``): a verifier that goes wrong only deep in a draft dilutes its excess
    over every token, here it is undiluted.  Valid under the null because a token's draft position is
    fixed before the token is drawn, so the selected scores keep conditional mean 0.  Its own
    ``ert_tokens`` budget in its own (fewer) tokens: the three stay under 2 false alarms per
    ``ert_tokens`` tokens.  Its own ``late_shift`` (0.2 against 0.04): late tokens are a few percent of
    the stream, so a late-only fault worth an alarm is large per token, and a chart tuned to it is
    faster on such faults and blind to small numeric drift there (docs/sidecar.md, "Late draft
    positions").  State: the three charts' (``pit``, ``excess``, ``late``).
    """

    STATE = ("pit", "excess", "late")

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

    def _decode_state(self, name: str, value: Any) -> Any:
        chart = getattr(self, name)
        chart.set_state(value)
        return chart

    def update(self, scores: Sequence[SequenceScore],
               positions: Sequence[np.ndarray | None] | None = None) -> Result:
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


class ImpossibleTokenChart(ArmControlChart):
    """Provably impossible tokens (``SequenceScore.oos_reasons``) per arm of one model: alarm at once.

    Why a chart of its own: the PIT and excess statistics condition on the tokens the sampler could
    have drawn, so they have *no* power against a decoder that ignores top-p / top-k / min-p (its
    extra tokens are exactly the ones they leave out).  Under exact sampling the count is 0 (the
    tolerance of ``impossible_reasons`` absorbs float noise and boundary ties), so any count is
    evidence; two guards, which must both reject, keep a scorer/engine disagreement (another dtype, a
    bf16 boundary flip) from alarming:

    * a **numeric floor**: the count must exceed Poisson(``floor_per_token`` x tokens) at ``alpha``;
    * the **control arm**: a non-baseline arm must also exceed the baseline arm's count by the exact
      conditional binomial test (given the sum, the candidate's share is Binomial(sum, n_c / (n_c +
      n_b)) at equal rates).

    A baseline-arm alarm means the serving engine itself produced tokens the scorer calls impossible.
    ``alpha`` is per update; ``reset(arm)`` forgets the arm's counts.
    """

    STATE = ("arms",)

    def __init__(self, alpha: float = 1e-6, floor_per_token: float = 1e-5, restart_after_alarm: bool = False):
        if not 0 < alpha < 1 or floor_per_token < 0:
            raise ValueError("impossible tokens: alpha in (0, 1) and floor_per_token >= 0")
        super().__init__(alpha, restart_after_alarm)
        self.floor = floor_per_token

    def _fresh_arm(self) -> dict[str, Any]:
        return {"samples": 0, "tokens": 0, "impossible": 0, "reasons": {}}

    def pvalue(self, arm: str) -> float:
        """p-value of the arm's count under the null (max of the floor's and the control arm's)."""
        from scipy import stats

        st = self.arms.get(arm)
        if not st or st["impossible"] == 0:
            return 1.0
        c, n = st["impossible"], st["tokens"]
        p = float(stats.poisson.sf(c - 1, self.floor * n)) if self.floor > 0 else 0.0
        base = self.control()
        if arm != self.CONTROL and base and base["tokens"] > 0:
            cb = base["impossible"]
            p = max(p, float(stats.binom.sf(c - 1, c + cb, n / (n + base["tokens"]))))
        return p

    def update(self, arm: str, n_tokens: int, reasons: Mapping[str, int]) -> Result:
        """Count one scored sample (its tokens and its impossible tokens by reason); returns a Result."""
        st = self._arm(arm)
        st["samples"] += 1
        st["tokens"] += int(n_tokens)
        for k, v in reasons.items():
            if v:
                st["impossible"] += int(v)
                st["reasons"][k] = st["reasons"].get(k, 0) + int(v)
        p = self.pvalue(arm)
        new = self._judge(st, p, st["samples"])
        base = self.control()
        return Result("impossible_tokens", float(st["impossible"]), self.alpha, st["alarm"] or new,
                      alarm_new=new, pvalue=p, n=st["samples"], alarm_index=st["alarm_index"],
                      extra={"impossible_tokens": st["impossible"], "tokens": st["tokens"],
                             "impossible_per_token": st["impossible"] / max(1, st["tokens"]),
                             "reasons": ", ".join(f"{k} {v}" for k, v in sorted(st["reasons"].items())),
                             "baseline_impossible_tokens": base.get("impossible", 0),
                             "baseline_tokens": base.get("tokens", 0)})
