"""Per-(model, arm) stream monitors and baseline-vs-candidate comparisons (T=0 pairing: pair_table.py).

This is where the false-alarm budget is spent.  Per (model, arm) stream the total ERT
(``MonitorConfig.ert_total``, samples between false alarms, all detectors together) is split by the
union bound over ``N_DETECTORS`` slots (``MonitorConfig.ert_each``).

Reference: the first ``reference_size`` samples of each stream (or a reference loaded from a file)
are its frozen reference window, on which the charts are calibrated; ``rebaseline()`` drops it.
The baseline-vs-candidate tests need none: they compare the two arms' latest windows.  The monitors
follow the ``StatefulDetector`` protocol (detectors/base.py), so the service persists them.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .classifiers import CLASSIFIER_NAMES
from .detectors import (
    BernoulliCUSUM,
    GaussianCUSUM,
    Result,
    StatefulDetector,
    finish_reason_test,
    holm,
    length_test,
    linear_mmd,
    rate_test,
)
from .detectors.embedders import make_embedder
from .features import Features

RATE_CHARTS = (*CLASSIFIER_NAMES, "truncated")
# rates, length up/down + acceptance, exact match, two-sample, evidence loss
N_DETECTORS = len(RATE_CHARTS) + 3 + 1 + 1 + 1


@dataclass
class MonitorConfig:
    ert_total: float = 300_000.0
    reference_size: int = 2000
    window: int = 1000
    rate_delta: float = 0.02
    length_shift: float = 0.3
    acceptance_shift: float = 0.5
    exact_match_block: int = 400
    pair_cache: int = 50_000
    pair_state_entries: int = 1000
    text_test: bool = True
    text_embedder: str = "hashed"

    @property
    def ert_each(self) -> float:
        return self.ert_total * N_DETECTORS


@dataclass
class Alarm:
    """A newly fired alarm, with what the alert sink needs to make it actionable."""

    detector: str
    model: str
    arm: str
    result: Result
    trace_ids: list[str] = field(default_factory=list)
    request_ids: list[str] = field(default_factory=list)

    @classmethod
    def with_examples(cls, detector: str, model: str, arm: str, result: Result,
                      examples: Iterable[tuple[str | None, str]]) -> Alarm:
        """An alarm with its example (trace id, request id) pairs."""
        ex = list(examples)
        return cls(detector, model, arm, result, [t for t, _ in ex if t], [q for _, q in ex])


def flag_of(f: Features, name: str) -> bool:
    """A rate chart's 0/1 value of a sample (``truncated`` is a feature, the rest classifier flags)."""
    return f.truncated if name == "truncated" else f.flags.get(name, False)


# Per-sample flag set by the pipeline: a T>0 sample the conformance scorer cannot judge (aborted,
# penalties, structured output, ...).  Under a random traffic split its rate is equal in both arms, so
# a decoder that makes its own outputs unjudgeable (aborts, errors) shows as a difference.
UNSCORED = "unscored"


def arm_comparison_tests(cfg: MonitorConfig) -> list[str]:
    """Names of the tests in the baseline-vs-candidate Holm family (its size sets the per-test alpha)."""
    return ["length", "finish_reason", *RATE_CHARTS, UNSCORED, *(["text_mmd"] if cfg.text_test else [])]


_FEATURE_STATE = ("request_id", "model", "arm", "trace_id", "greedy", "pair_key", "length", "finish_reason",
                  "truncated", "acceptance", "text", "flags")


def _features_to_state(f: Features) -> dict[str, Any]:
    """What a two-sample window needs of a sample (no token ids, no vector: re-embedded on use)."""
    d = {k: getattr(f, k) for k in _FEATURE_STATE}
    if isinstance(d["acceptance"], float) and math.isnan(d["acceptance"]):
        d["acceptance"] = None  # strict JSON has no NaN
    return d


def _features_from_state(d: dict[str, Any]) -> Features:
    d = dict(d)
    d["acceptance"] = math.nan if d["acceptance"] is None else float(d["acceptance"])
    return Features(token_ids=None, **d)


class StreamMonitor(StatefulDetector):
    """CUSUM charts for one (model, arm) stream, fitted on its frozen reference window."""

    STATE = ("ref", "samples", "flag_counts", "recent_flags", "recent_acc", "examples", "charts", "last")

    def __init__(self, model: str, arm: str, cfg: MonitorConfig):
        self.model, self.arm, self.cfg = model, arm, cfg
        self.rebaseline()
        self.samples = 0
        self.flag_counts = dict.fromkeys(RATE_CHARTS, 0)
        self.recent_flags = {k: deque(maxlen=cfg.window) for k in RATE_CHARTS}
        self.recent_acc: deque = deque(maxlen=cfg.window)
        self.examples = {k: deque(maxlen=5) for k in (*RATE_CHARTS, "recent")}

    @property
    def fitted(self) -> bool:
        return bool(self.charts)

    def _new_chart(self, name: str) -> BernoulliCUSUM | GaussianCUSUM:
        """An unfitted chart with this config: ``fit`` fits it, ``set_state`` restores it."""
        cfg, ert = self.cfg, self.cfg.ert_each
        if name in RATE_CHARTS:
            return BernoulliCUSUM(name, ert, delta=cfg.rate_delta)
        if name in ("length_up", "length_down"):
            return GaussianCUSUM(name, ert, name.split("_")[1], cfg.length_shift)
        if name == "acceptance_down":
            return GaussianCUSUM(name, ert, "down", cfg.acceptance_shift)
        raise ValueError(f"unknown chart {name!r}")

    def fit(self) -> None:
        charts: dict[str, Any] = {}
        for k in RATE_CHARTS:
            charts[k] = self._new_chart(k).fit(self.ref[k])
        loglen = np.asarray(self.ref["loglen"])
        for d in ("up", "down"):
            charts[f"length_{d}"] = self._new_chart(f"length_{d}").fit(loglen)
        acc = np.asarray([np.nan if a is None else a for a in self.ref["acceptance"]], float)
        acc = acc[np.isfinite(acc)]
        if len(acc) >= 50 and acc.std() > 0:
            charts["acceptance_down"] = self._new_chart("acceptance_down").fit(acc)
        self.charts = charts

    def rebaseline(self) -> None:
        """Drop the reference and the charts: the next ``reference_size`` samples are the new reference."""
        self.ref: dict[str, list] = {k: [] for k in (*RATE_CHARTS, "loglen", "acceptance")}
        self.charts: dict[str, Any] = {}
        self.last: dict[str, Result] = {}

    def active_alarms(self) -> list[dict[str, Any]]:
        return [{"detector": k, "model": self.model, "arm": self.arm, "statistic": c.s_, "threshold": c.threshold_,
                 "alarm_index": c.alarm_index_, "samples_since_fit": c.n_} for k, c in self.charts.items() if c.alarm_]

    def acknowledge(self, detector: str | None = None) -> list[str]:
        """Acknowledge latched alarms (one chart or all): restart them so they can fire again."""
        done = []
        for k, c in self.charts.items():
            if c.alarm_ and detector in (None, k):
                c.acknowledge()
                if k in self.last:
                    self.last[k].alarm = False
                done.append(k)
        return done

    def _encode_state(self, name: str, value: Any) -> Any:
        if name == "ref":  # strict JSON: NaN acceptance (no speculation) -> null
            return {k: [None if isinstance(x, float) and math.isnan(x) else x for x in v] for k, v in value.items()}
        return value

    def _decode_state(self, name: str, value: Any) -> Any:
        if name == "recent_flags":
            return {k: deque(v, maxlen=self.cfg.window) for k, v in value.items()}
        if name == "recent_acc":
            return deque(value, maxlen=self.cfg.window)
        if name == "examples":
            return {k: deque((tuple(x) for x in v), maxlen=5) for k, v in value.items()}
        if name == "charts":
            charts = {}
            for k, cs in value.items():
                charts[k] = self._new_chart(k)
                charts[k].set_state(cs)
            return charts
        if name == "last":
            return {k: Result.from_dict(v) for k, v in value.items()}
        return value

    def add_reference(self, feats: list[Features]) -> list[Features]:
        """Feed reference samples; returns those left over once the reference is full."""
        room = self.cfg.reference_size - len(self.ref["loglen"])
        take, rest = feats[:max(0, room)], feats[max(0, room):]
        for f in take:
            for k in RATE_CHARTS:
                self.ref[k].append(flag_of(f, k))
            self.ref["loglen"].append(math.log1p(f.length))
            self.ref["acceptance"].append(f.acceptance)
        if len(self.ref["loglen"]) >= self.cfg.reference_size and not self.fitted:
            self.fit()
        return rest

    def update(self, feats: list[Features]) -> list[Alarm]:
        """Count the batch, feed the reference or the charts; return newly fired alarms."""
        if not feats:
            return []
        self.samples += len(feats)
        for f in feats:
            for k in RATE_CHARTS:
                flag = flag_of(f, k)
                self.recent_flags[k].append(flag)
                if flag:
                    self.flag_counts[k] += 1
                    self.examples[k].append((f.trace_id, f.request_id))
            if not math.isnan(f.acceptance):
                self.recent_acc.append(f.acceptance)
            self.examples["recent"].append((f.trace_id, f.request_id))
        live = feats if self.fitted else self.add_reference(feats)
        if not live or not self.fitted:
            return []
        alarms = []
        for name, chart in self.charts.items():
            if name in RATE_CHARTS:
                r = chart.update([flag_of(f, name) for f in live])
            elif name.startswith("length"):
                r = chart.update([math.log1p(f.length) for f in live])
            else:
                r = chart.update([f.acceptance for f in live])
            self.last[name] = r
            if r.alarm_new:
                alarms.append(Alarm.with_examples(name, self.model, self.arm, r,
                                                  self.examples.get(name, self.examples["recent"])))
        return alarms

    def behaviour_rates(self) -> dict[str, float]:
        return {k: (sum(v) / len(v) if v else 0.0) for k, v in self.recent_flags.items()}

    def acceptance_rate(self) -> float:
        return float(np.mean(self.recent_acc)) if self.recent_acc else math.nan


def _no_losses() -> dict[str, list[int]]:
    """T>0 samples the conformance scorer finished, per arm: [given up, finished].  A fault that makes
    outputs unscorable (token ids the baseline server rejects: a 400) removes its own evidence; the
    share given up per arm shows it."""
    return {"baseline": [0, 0], "candidate": [0, 0]}


class ArmComparison(StatefulDetector):
    """Baseline vs candidate windows of one model, tested every ``window`` candidate samples.

    Tests: length (tie-corrected Mann-Whitney: valid with the heavy ties and the max_tokens cap of
    real lengths, see ``length_test``), finish reason (Fisher exact, or chi-square with sparse
    categories merged), each behavioural rate (Fisher), text (linear
    MMD on ``cfg.text_embedder`` vectors: hashed n-grams by default, MiniLM as an option; each
    sample is embedded once, when it first enters a test).  Holm across them; alarm when the
    smallest adjusted p-value is below alpha = window / ert_each.  A test's alarm latches until
    ``acknowledge``; the windows and latches are its state.
    """

    STATE = ("win", "pending", "last", "lost")
    STATE_VERSION = 2

    def __init__(self, model: str, cfg: MonitorConfig):
        self.model, self.cfg = model, cfg
        self.win = {a: deque(maxlen=cfg.window) for a in ("baseline", "candidate")}
        self.alpha = cfg.window / cfg.ert_each
        self.rebaseline()

    def scorer_finished(self, arm: str, given_up: bool) -> list[Alarm]:
        """Count one scored (or given-up) T>0 sample.  At each candidate give-up, one-sided Fisher exact
        test of the candidate's give-up rate above the baseline arm's, at 1 / ``ert_each`` per look: at
        most one false alarm per ``ert_each`` candidate give-ups, under any traffic split."""
        if arm not in self.lost:
            return []
        self.lost[arm][0] += int(given_up)
        self.lost[arm][1] += 1
        (kc, nc), (kb, nb) = self.lost["candidate"], self.lost["baseline"]
        if arm != "candidate" or not given_up or not nb:
            return []
        from scipy.stats import fisher_exact

        p = float(fisher_exact([[kc, nc - kc], [kb, nb - kb]], alternative="greater")[1])
        r = self._latch("evidence_loss", kc / nc, 1.0 / self.cfg.ert_each, p, nc,
                        {"detail": f"given up: candidate {kc}/{nc}, baseline {kb}/{nb}"})
        return [Alarm(r.detector, self.model, "candidate", r)] if r.alarm_new else []

    def _latch(self, key: str, statistic: float, alpha: float, p: float, n: int, extra: dict[str, Any]) -> Result:
        """The test's Result (``twosample_<key>``); an alarm latches until ``acknowledge``."""
        latched = key in self.last and self.last[key].alarm
        fire = bool(p < alpha)
        r = self.last[key] = Result(f"twosample_{key}", statistic, alpha, fire or latched,
                                    alarm_new=fire and not latched, pvalue=p, n=n, extra=extra)
        return r

    def _embedded(self, feats: list[Features]) -> np.ndarray:
        todo = [f for f in feats if f.embedding is None]
        if todo:
            for f, v in zip(todo, make_embedder(self.cfg.text_embedder)([f.text for f in todo])):
                f.embedding = v
        return np.array([f.embedding for f in feats]) if feats else np.zeros((0, 1), np.float32)

    def update(self, arm: str, feats: list[Features]) -> list[Alarm]:
        if arm not in self.win:
            return []
        self.win[arm].extend(feats)
        if arm == "candidate":
            self.pending += len(feats)
        if self.pending < self.cfg.window or len(self.win["baseline"]) < self.cfg.window // 2:
            return []
        self.pending = 0
        b, c = list(self.win["baseline"]), list(self.win["candidate"])
        tests = [length_test([f.length for f in b], [f.length for f in c], method="mannwhitney"),
                 finish_reason_test([f.finish_reason for f in b], [f.finish_reason for f in c])]
        tests += [rate_test([flag_of(f, k) for f in b], [flag_of(f, k) for f in c], name=k)
                  for k in (*RATE_CHARTS, UNSCORED)]
        if self.cfg.text_test:
            m = min(len(b), len(c)) // 2 * 2
            tests.append(linear_mmd(self._embedded(b[:m]), self._embedded(c[:m])))
        adj = holm([t.pvalue for t in tests])
        alarms = []
        for t, p in zip(tests, adj):
            r = self._latch(t.name, t.statistic, self.alpha, float(p), len(c),
                            {"detail": t.detail, "raw_pvalue": t.pvalue})
            if r.alarm_new:
                alarms.append(Alarm.with_examples(r.detector, self.model, "candidate", r,
                                                  [(f.trace_id, f.request_id) for f in c[-5:]]))
        return alarms

    def active_alarms(self) -> list[dict[str, Any]]:
        return [{"detector": r.detector, "model": self.model, "arm": "candidate", "statistic": r.statistic,
                 "threshold": r.threshold, "pvalue": r.pvalue, "samples_since_fit": r.n}
                for r in self.last.values() if r.alarm]

    def acknowledge(self, detector: str | None = None) -> list[str]:
        done = []
        for r in self.last.values():
            if r.alarm and detector in (None, r.detector):
                r.alarm = False
                done.append(r.detector)
        if "twosample_evidence_loss" in done:  # counts restart: the acknowledged evidence is not re-fired
            self.lost = _no_losses()
        return done

    def rebaseline(self) -> None:
        """Start both windows afresh (e.g. after an intended change of the baseline)."""
        for w in self.win.values():
            w.clear()
        self.pending = 0
        self.last: dict[str, Result] = {}
        self.lost = _no_losses()

    def _encode_state(self, name: str, value: Any) -> Any:
        if name == "win":
            return {a: [_features_to_state(f) for f in w] for a, w in value.items()}
        return value

    def _decode_state(self, name: str, value: Any) -> Any:
        if name == "win":
            return {a: deque((_features_from_state(d) for d in value.get(a, [])), maxlen=self.cfg.window)
                    for a in ("baseline", "candidate")}
        if name == "last":
            return {k: Result.from_dict(v) for k, v in value.items()}
        return value
