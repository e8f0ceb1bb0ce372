"""CUSUM charts: the cheap, per-sample early warning (acceptance rate, behaviour rates, length).

Both charts accumulate a log-likelihood-ratio-like increment and alarm when the sum exceeds ``h``.
The batch update is vectorised with the Lindley identity S_t = C_t - min(-S_0, min_{j<=t} C_j)
(C = cumulative increments), so a whole poll of samples costs a few numpy calls.

Thresholds: ``h`` is calibrated by simulation for a stated ERT (expected run time between false
alarms).  Streams are drawn from the null (Bernoulli(p0), or a bootstrap of the reference values),
the probability that a path of T samples crosses h is measured for a grid of h, turned into run
lengths with the geometric law (ARL = -T / ln(1 - P)), and ln ARL is fitted as linear in h (the
classical exponential law of CUSUM run lengths, Siegmund 1985).  The ERT a budget asks for (10^6 to
10^7) is then read off the fit: extrapolation, validated by the benchmark's clean-stream runs.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from .base import Result, StatefulDetector


def lindley(increments: np.ndarray, s0: float = 0.0) -> np.ndarray:
    """Path of S_t = max(0, S_{t-1} + x_t) for a 1-D array of increments, starting from s0."""
    c = np.cumsum(increments)
    return c - np.minimum(-s0, np.minimum.accumulate(c))


def _path_maxima(draw, n_paths: int, horizon: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.empty(n_paths)
    chunk = max(1, 4_000_000 // horizon)
    for i in range(0, n_paths, chunk):
        m = min(chunk, n_paths - i)
        x = draw(rng, (m, horizon))
        c = np.cumsum(x, axis=1, dtype=np.float64)
        s = c - np.minimum(0.0, np.minimum.accumulate(c, axis=1))
        out[i:i + m] = s.max(axis=1)
    return out


def calibrate_threshold(draw, ert: float, *, n_paths: int = 240, horizon: int = 12_000,
                        seed: int = 0) -> float:
    """Threshold h whose expected run time under the null ``draw`` is ``ert`` samples.

    ``draw(rng, shape)`` returns null increments.  Fits ln ARL(h) = a + b h on simulated run-length
    data and solves for ``ert`` (see the module docstring).
    """
    maxima = np.sort(_path_maxima(draw, n_paths, horizon, seed))
    # Thresholds where 5%..80% of paths cross: well-estimated crossing probabilities.
    hs = np.quantile(maxima, np.linspace(0.20, 0.95, 12))
    probs = np.array([(maxima > h).mean() for h in hs])
    ok = (probs > 0) & (probs < 1)
    hs, probs = hs[ok], probs[ok]
    arl = -horizon / np.log1p(-probs)
    if len(np.unique(hs)) < 3:
        # Degenerate (e.g. one huge increment per event): fall back to the top simulated maximum scaled.
        return float(maxima[-1] * max(1.0, np.log(ert) / np.log(horizon * n_paths)))
    b, a = np.polyfit(hs, np.log(arl), 1)
    if b <= 0:
        return float(maxima[-1])
    return float(max(0.0, (np.log(ert) - a) / b))


@lru_cache(maxsize=512)
def _bernoulli_threshold(p0: float, p1: float, ert: float) -> float:
    up, down = np.log(p1 / p0), np.log((1 - p1) / (1 - p0))

    def draw(rng, shape):
        return np.where(rng.random(shape) < p0, up, down)

    return calibrate_threshold(draw, ert)


class BernoulliCUSUM(StatefulDetector):
    """Upward CUSUM on a 0/1 stream (refusal flag, truncation, T=0 mismatch...).

    ``fit(reference)`` estimates p0 with a Laplace estimate floored at ``p_floor`` (a rate of 0 in
    the reference must not turn one event into an alarm); the chart is tuned to detect
    p1 = p0 + ``delta`` (absolute), which sets the increments ln(p1/p0) and ln((1-p1)/(1-p0)).
    After an alarm the chart stays in alarm until ``reset()``; ``restart_after_alarm=True`` (used by
    the benchmark to count false alarms) instead restarts from 0 and keeps counting.
    """

    STATE = ("p0_", "s_", "n_", "alarm_", "alarms_", "alarm_index_")

    def __init__(self, name: str, ert: float, delta: float = 0.02, p_floor: float = 0.002,
                 p0: float | None = None, restart_after_alarm: bool = False):
        self.name, self.ert, self.delta, self.p_floor = name, ert, delta, p_floor
        self.restart_after_alarm = restart_after_alarm
        if p0 is not None:
            self._set_p0(p0)

    def _set_p0(self, p0: float, keep_statistic: bool = False) -> None:
        """Tune the chart to in-control rate ``p0``; ``keep_statistic`` keeps the running sum and the
        alarm (a re-fit of p0 from more A/A data must not erase the evidence gathered so far)."""
        self.p0_ = float(min(max(p0, self.p_floor), 0.5))
        self._derive()
        if not keep_statistic or not hasattr(self, "s_"):
            self.reset()

    def _derive(self) -> None:
        self.p1_ = min(0.99, self.p0_ + self.delta)
        self.up_ = float(np.log(self.p1_ / self.p0_))
        self.down_ = float(np.log((1 - self.p1_) / (1 - self.p0_)))
        self.threshold_ = _bernoulli_threshold(round(self.p0_, 5), round(self.p1_, 5), float(self.ert))

    def _after_set_state(self) -> None:
        self._derive()  # the threshold follows from p0 and the configured ERT: not stored

    def _upgrade_state(self, st: dict[str, Any], version: int) -> dict[str, Any]:
        """Version 0 (before the state protocol): {s, n, alarm, alarms}, p0 re-fitted by the caller."""
        if version == 0 and "s" in st:
            return {"version": 1, "state": {"p0_": getattr(self, "p0_", self.p_floor), "s_": st["s"],
                                             "n_": st["n"], "alarm_": st["alarm"], "alarms_": st["alarms"],
                                             "alarm_index_": None}}
        return super()._upgrade_state(st, version)

    def fit(self, reference) -> BernoulliCUSUM:
        """p0 = one-sided 90% upper (Jeffreys) bound of the reference rate, not the point estimate:
        a chart tuned to an underestimated p0 fires on a stream that did not change (measured:
        ~2 false alarms per 100k with the point estimate from 2,000 reference samples)."""
        from scipy.stats import beta

        x = np.asarray(reference, dtype=bool)
        k, n = int(x.sum()), len(x)
        self._set_p0(float(beta.ppf(0.9, k + 0.5, n - k + 0.5)) if n else self.p_floor)
        return self

    def reset(self) -> None:
        self.s_, self.n_, self.alarm_, self.alarms_, self.alarm_index_ = 0.0, 0, False, 0, None

    def update(self, batch) -> Result:
        x = np.asarray(batch, dtype=bool)
        return _update(self, np.where(x, self.up_, self.down_))

    def acknowledge(self) -> None:
        """Clear the latched alarm and restart the sum from 0; samples and alarm counts are kept."""
        self.s_, self.alarm_, self.alarm_index_ = 0.0, False, None


class GaussianCUSUM(StatefulDetector):
    """CUSUM on a continuous stream standardised by the reference (acceptance rate, log length).

    ``direction`` is "up" or "down"; ``shift`` is the change to detect in reference standard
    deviations (reference value k = shift/2).  Increments are clipped to +-``clip`` sd so a single
    outlier cannot fire the chart alone.  The null for calibration is a bootstrap of the
    standardised reference, so skewed or discrete features (lengths) are handled honestly.
    """

    STATE = ("mean_", "sd_", "threshold_", "s_", "n_", "alarm_", "alarms_", "alarm_index_")

    def __init__(self, name: str, ert: float, direction: str = "up", shift: float = 0.5, clip: float = 4.0,
                 restart_after_alarm: bool = False, seed: int = 0, ref_z: float = 1.645,
                 ert_margin: float = 5.0):
        if direction not in ("up", "down"):
            raise ValueError("direction must be 'up' or 'down'")
        self.name, self.ert, self.direction, self.shift, self.clip = name, ert, direction, shift, clip
        self.restart_after_alarm, self.seed, self.ref_z = restart_after_alarm, seed, ref_z
        # The run length is very sensitive to the upper tail of the increments, which a 2,000-value
        # bootstrap pins down poorly: thresholds from different references of one population gave
        # ERTs 0.35-2x the target.  Calibrating for 5x the ERT keeps the worst references in budget
        # (measured in benchmarks/sidecar_detection_power.py, chart-level clean run).
        self.ert_margin = ert_margin

    def _inc(self, x: np.ndarray) -> np.ndarray:
        z = np.clip((x - self.mean_) / self.sd_, -self.clip, self.clip)
        return (z if self.direction == "up" else -z) - self.shift / 2

    def fit(self, reference) -> GaussianCUSUM:
        x = np.asarray(reference, dtype=float)
        x = x[np.isfinite(x)]
        if len(x) < 20:
            raise ValueError(f"{self.name}: need >= 20 reference values, got {len(x)}")
        self.sd_ = float(max(x.std(), 1e-6))
        # Guard against reference noise (the analogue of the rate charts' upper bound): move the
        # in-control mean by a one-sided 95% margin towards the alarm side.  Without it, the
        # +-sd/sqrt(n) error of a 2,000-sample reference mean cut the measured ERT ~6x.
        margin = self.ref_z * self.sd_ / np.sqrt(len(x))
        self.mean_ = float(x.mean() + (margin if self.direction == "up" else -margin))
        pool = self._inc(x)

        def draw(rng, shape):
            return pool[rng.integers(0, len(pool), size=shape)]

        self.threshold_ = calibrate_threshold(draw, self.ert * self.ert_margin, seed=self.seed)
        self.reset()
        return self

    reset = BernoulliCUSUM.reset
    acknowledge = BernoulliCUSUM.acknowledge

    def _upgrade_state(self, st: dict[str, Any], version: int) -> dict[str, Any]:
        """Version 0: {s, n, alarm, alarms}; the fitted mean/sd/threshold come from a re-fit."""
        if version == 0 and "s" in st and hasattr(self, "threshold_"):
            return {"version": 1, "state": {"mean_": self.mean_, "sd_": self.sd_, "threshold_": self.threshold_,
                                             "s_": st["s"], "n_": st["n"], "alarm_": st["alarm"],
                                             "alarms_": st["alarms"], "alarm_index_": None}}
        return super()._upgrade_state(st, version)

    def update(self, batch) -> Result:
        x = np.asarray(batch, dtype=float)
        x = x[np.isfinite(x)]
        return _update(self, self._inc(x))


def _update(chart, inc: np.ndarray) -> Result:
    """Advance a chart by a batch of increments; handles alarms inside the batch."""
    was = chart.alarm_
    new = False
    while len(inc):
        path = lindley(inc, chart.s_)
        cross = np.flatnonzero(path > chart.threshold_)
        if len(cross) == 0 or chart.alarm_:
            chart.s_ = float(path[-1])
            chart.n_ += len(inc)
            break
        i = int(cross[0])
        chart.n_ += i + 1
        chart.alarms_ += 1
        new = True
        if chart.alarm_index_ is None:
            chart.alarm_index_ = chart.n_
        if chart.restart_after_alarm:
            chart.s_ = 0.0
            inc = inc[i + 1:]
        else:
            chart.alarm_ = True
            chart.s_ = float(path[i])
            rest = inc[i + 1:]
            if len(rest):
                chart.s_ = float(lindley(rest, chart.s_)[-1])
                chart.n_ += len(rest)
            break
    return Result(chart.name, chart.s_, chart.threshold_, chart.alarm_ or (new and chart.restart_after_alarm),
                  alarm_new=new and not was, n=chart.n_, alarm_index=chart.alarm_index_,
                  extra={"alarms": chart.alarms_})
