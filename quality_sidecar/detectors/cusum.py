"""CUSUM charts: the cheap, per-sample early warning (acceptance rate, behaviour rates, length), and the
per-token charts of T>0 sampling conformance (``PitCusum``, ``ExcessCusum``: Gaussian thresholds from
Siegmund's ARL, the null known exactly; fed by ``conformance_charts.ConformanceChart``).

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

import math
from collections.abc import Sequence
from functools import lru_cache

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

    # The run length is very sensitive to the upper tail of the increments, which a 2,000-value
    # bootstrap pins down poorly (ERTs 0.35-2x the target across references of one population):
    # calibrating for 5x the ERT keeps the worst references in budget
    # (benchmarks/sidecar_detection_power.py, chart-level clean run).
    ERT_MARGIN = 5.0
    REF_Z = 1.645  # one-sided 95% margin of the reference mean (see ``fit``)

    def __init__(self, name: str, ert: float, direction: str = "up", shift: float = 0.5, clip: float = 4.0,
                 restart_after_alarm: bool = False):
        if direction not in ("up", "down"):
            raise ValueError("direction must be 'up' or 'down'")
        self.name, self.ert, self.direction, self.shift, self.clip = name, ert, direction, shift, clip
        self.restart_after_alarm = restart_after_alarm

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
        # in-control mean towards the alarm side, else the +-sd/sqrt(n) error of a 2,000-sample
        # reference mean cuts the ERT ~6x.
        margin = self.REF_Z * self.sd_ / np.sqrt(len(x))
        self.mean_ = float(x.mean() + (margin if self.direction == "up" else -margin))
        pool = self._inc(x)

        def draw(rng, shape):
            return pool[rng.integers(0, len(pool), size=shape)]

        self.threshold_ = calibrate_threshold(draw, self.ert * self.ERT_MARGIN)
        self.reset()
        return self

    reset = BernoulliCUSUM.reset
    acknowledge = BernoulliCUSUM.acknowledge

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


def siegmund_arl(k: float, h: float) -> float:
    """Siegmund's (1985) ARL0 of a one-sided CUSUM with N(0,1) increments, reference k, threshold h
    (accurate to a few percent for Gaussian increments; checked by simulation in the tests)."""
    b = 2 * k * (h + 1.166)
    return (math.expm1(b) - b) / (2 * k * k)


def gauss_threshold(k: float, ert: float) -> float:
    """Threshold h whose Gaussian one-sided ARL0 is ``ert`` (bisection on ``siegmund_arl``)."""
    lo, hi = 0.0, 1.0
    while siegmund_arl(k, hi) < ert:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if siegmund_arl(k, mid) < ert else (lo, mid)
    return hi


# --- token-stream charts of T>0 sampling conformance (fed by conformance_charts.py) ----------------

class PitCusum(StatefulDetector):
    """Two-sided CUSUM on the PIT values of the token stream: the sidecar's T>0 chart.

    Why per token and not per sample: under exact sampling the PIT values of *all* tokens of *all*
    samples form one i.i.d. U(0,1) sequence, whatever the output lengths (each u is uniform given
    everything before it, stopping included).  A per-sample z normalised by its own length is not
    mean-zero (the length is a stopping time that depends on the u's: measured +0.08..+0.15 on real
    exact streams of the demo model), so the chart accumulates the token increments
    x = (u - 1/2) sqrt(12) (mean 0, variance 1, sub-Gaussian with variance proxy 1: the uniform's mgf
    is sinh(l/2)/(l/2) <= exp(l^2/24)) and is evaluated at sample boundaries, which can only delay a
    crossing.  Thresholds come from Siegmund's ARL for N(0,1) increments, hence conservative, for
    ``ert_tokens`` tokens per side x 2 (union bound).  ``shift`` is the per-token change of E[x] to
    detect fastest (reference value shift/2); a mean-u change d is a shift of d sqrt(12).
    ``alarm_`` latches until ``reset()`` (the acknowledge path) unless ``restart_after_alarm``.
    """

    STATE = ("s_up_", "s_down_", "n_", "tokens_", "alarm_", "alarms_", "alarm_index_", "sum_x_", "direction_")

    def __init__(self, name: str = "sampling_conformance", ert_tokens: float = 1e9, shift: float = 0.04,
                 restart_after_alarm: bool = False):
        if ert_tokens <= 1 or shift <= 0:
            raise ValueError("ert_tokens must be > 1 and shift > 0")
        self.name, self.ert_tokens, self.shift, self.restart_after_alarm = name, ert_tokens, shift, restart_after_alarm
        self.k_ = shift / 2
        self.threshold_ = gauss_threshold(self.k_, float(2 * ert_tokens))
        self.reset()

    def reset(self) -> None:
        self.s_up_ = self.s_down_ = 0.0
        self.n_, self.tokens_, self.alarm_, self.alarms_, self.alarm_index_ = 0, 0, False, 0, None
        self.sum_x_, self.direction_ = 0.0, ""

    @property
    def mean_u(self) -> float:
        """Mean PIT value of every token seen since the last reset (0.5 under exact sampling)."""
        return 0.5 + self.sum_x_ / math.sqrt(12) / self.tokens_ if self.tokens_ else 0.5

    # which side of the chart means what (PIT: a sharper sampler pushes u -> 0, i.e. down)
    UP, DOWN = "flatter than specified (u -> 1)", "sharper than specified (u -> 0)"

    def update(self, samples: Sequence[Sequence[float]]) -> Result:
        """Feed the PIT values of a batch of samples (one array per sample, in arrival order)."""
        sums = np.array([float(np.sum(np.asarray(u, float) - 0.5)) * math.sqrt(12) for u in samples])
        counts = np.array([len(u) for u in samples], float)
        return self.update_sums(sums, counts)

    def update_sums(self, sums: np.ndarray, counts: np.ndarray) -> Result:
        """Feed per-sample sums of the token increments (mean 0, variance ~1 per token under the null)
        and the samples' token counts."""
        sums, counts = np.asarray(sums, float), np.asarray(counts, float)
        keep = counts > 0
        sums, counts = sums[keep], counts[keep]
        new = False
        was = self.alarm_
        while len(sums):
            up = lindley(sums - self.k_ * counts, self.s_up_)
            down = lindley(-sums - self.k_ * counts, self.s_down_)
            cross = np.flatnonzero((up > self.threshold_) | (down > self.threshold_))
            if len(cross) == 0 or self.alarm_:
                self.s_up_, self.s_down_ = float(up[-1]), float(down[-1])
                self.n_ += len(sums)
                self.tokens_ += int(counts.sum())
                self.sum_x_ += float(sums.sum())
                break
            i = int(cross[0])
            self.n_ += i + 1
            self.tokens_ += int(counts[: i + 1].sum())
            self.sum_x_ += float(sums[: i + 1].sum())
            self.alarms_ += 1
            new = True
            self.direction_ = self.DOWN if down[i] > self.threshold_ else self.UP
            if self.alarm_index_ is None:
                self.alarm_index_ = self.n_
            if self.restart_after_alarm:
                self.s_up_ = self.s_down_ = 0.0
            else:
                self.alarm_ = True
                self.s_up_, self.s_down_ = float(up[i]), float(down[i])
            sums, counts = sums[i + 1:], counts[i + 1:]
        stat = max(self.s_up_, self.s_down_)
        return Result(self.name, stat, self.threshold_, self.alarm_ or (new and self.restart_after_alarm),
                      alarm_new=new and not was, n=self.n_, alarm_index=self.alarm_index_,
                      extra={"alarms": self.alarms_, "tokens": self.tokens_, "mean_u": self.mean_u,
                             "direction": self.direction_})


class ExcessCusum(PitCusum):
    """Two-sided CUSUM on the excess score of the token stream (``SequenceScore.excess``).

    Why next to the PIT chart: the excess score s = log p(y) - E_q[log p] is the temperature
    family's score, so against the faults of this class it is the more efficient statistic (z
    measured in docs/sidecar.md), while the PIT chart also sees faults that leave E[log p] alone.
    Increment per token: x = s / sqrt(vbar), vbar the mean null variance of s over every token seen
    so far *including the current one* (v of a token is known from its row before the token is
    drawn, so x has conditional mean exactly 0 and its variance averages 1: the PIT chart's
    Gaussian calibration in tokens applies; the heavier lower tail of s is checked by simulation in
    tests/sidecar/test_conformance_excess.py).  A sharper sampler drives s up.
    """

    STATE = PitCusum.STATE + ("v_sum_", "v_n_", "s_sum_")
    UP, DOWN = "sharper than specified (excess log-prob > 0)", "flatter than specified (excess log-prob < 0)"

    def reset(self) -> None:
        super().reset()
        self.v_sum_, self.v_n_, self.s_sum_ = 0.0, 0, 0.0

    @property
    def mean_excess(self) -> float:
        """Mean excess log-prob (nats/token) since the last reset (0 under exact sampling)."""
        return self.s_sum_ / self.v_n_ if self.v_n_ else 0.0

    def update(self, samples: Sequence[tuple[Sequence[float], Sequence[float]]]) -> Result:  # type: ignore[override]
        """Feed (excess, excess_var) arrays of a batch of samples, in arrival order."""
        sums, counts = [], []
        for ex, var in samples:
            ex, var = np.asarray(ex, float), np.asarray(var, float)
            vbar = (self.v_sum_ + np.cumsum(var)) / (self.v_n_ + np.arange(1, len(var) + 1))
            ok = vbar > 0
            sums.append(float(np.sum(ex[ok] / np.sqrt(vbar[ok]))))
            counts.append(int(ok.sum()))
            self.v_sum_ += float(var.sum())
            self.v_n_ += len(var)
            self.s_sum_ += float(ex.sum())
        r = self.update_sums(np.array(sums), np.array(counts, float))
        r.extra.pop("mean_u", None)
        r.extra["mean_excess_nats_per_token"] = self.mean_excess
        return r
