"""Per-(model, arm) stream monitors, baseline-vs-candidate comparisons and T=0 pairing.

This is where the false-alarm budget is spent.  Per (model, arm) stream the total ERT
(``MonitorConfig.ert_total``, samples between false alarms, all detectors together) is split by the
union bound over ``N_DETECTORS`` slots: eight CUSUM charts (refusal, format_invalid, unsafe,
degenerate, truncated, length up, length down, acceptance down), the T=0 exact-match chart and the
windowed two-sample family (Holm inside it).  Each chart therefore runs at ERT = 10 x ert_total.

Reference: the first ``reference_size`` samples of each stream are its frozen reference window
(or a reference loaded from a file), after which the charts are calibrated and start.  The
baseline-vs-candidate tests need no reference: they compare the two arms' latest windows.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from .classifiers import CLASSIFIER_NAMES
from .detectors import (
    BernoulliCUSUM,
    GaussianCUSUM,
    PairedExactMatch,
    Result,
    finish_reason_test,
    holm,
    length_test,
    linear_mmd,
    rate_test,
)
from .detectors.embedders import make_embedder
from .features import Features

RATE_CHARTS = (*CLASSIFIER_NAMES, "truncated")
N_DETECTORS = len(RATE_CHARTS) + 3 + 1 + 1  # rates, length up/down + acceptance, exact match, two-sample


@dataclass
class MonitorConfig:
    ert_total: float = 300_000.0
    reference_size: int = 2000
    window: int = 1000
    rate_delta: float = 0.02
    length_shift: float = 0.3
    acceptance_shift: float = 0.5
    aa_mismatch_rate: float = 0.002
    exact_match_delta: float = 0.015
    pair_cache: int = 50_000
    text_test: bool = True
    text_embedder: str = "hashed"
    restart_after_alarm: bool = False

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


def _flag_of(f: Features, name: str) -> bool:
    return f.truncated if name == "truncated" else f.flags.get(name, False)


class StreamMonitor:
    """CUSUM charts for one (model, arm) stream, fitted on its frozen reference window."""

    def __init__(self, model: str, arm: str, cfg: MonitorConfig):
        self.model, self.arm, self.cfg = model, arm, cfg
        self.ref: dict[str, list] = {k: [] for k in (*RATE_CHARTS, "loglen", "acceptance")}
        self.charts: dict[str, object] = {}
        self.samples = 0
        self.flag_counts = dict.fromkeys(RATE_CHARTS, 0)
        self.recent_flags = {k: deque(maxlen=cfg.window) for k in RATE_CHARTS}
        self.recent_acc: deque = deque(maxlen=cfg.window)
        self.examples = {k: deque(maxlen=5) for k in (*RATE_CHARTS, "recent")}
        self.last: dict[str, Result] = {}

    @property
    def fitted(self) -> bool:
        return bool(self.charts)

    def fit(self) -> None:
        cfg, ert = self.cfg, self.cfg.ert_each
        charts: dict[str, object] = {}
        for k in RATE_CHARTS:
            charts[k] = BernoulliCUSUM(k, ert, delta=cfg.rate_delta,
                                       restart_after_alarm=cfg.restart_after_alarm).fit(self.ref[k])
        loglen = np.asarray(self.ref["loglen"])
        for d in ("up", "down"):
            charts[f"length_{d}"] = GaussianCUSUM(f"length_{d}", ert, d, cfg.length_shift,
                                                  restart_after_alarm=cfg.restart_after_alarm).fit(loglen)
        acc = np.asarray(self.ref["acceptance"], float)
        acc = acc[np.isfinite(acc)]
        if len(acc) >= 50 and acc.std() > 0:
            charts["acceptance_down"] = GaussianCUSUM("acceptance_down", ert, "down", cfg.acceptance_shift,
                                                      restart_after_alarm=cfg.restart_after_alarm).fit(acc)
        self.charts = charts

    def add_reference(self, feats: list[Features]) -> list[Features]:
        """Feed reference samples; returns those left over once the reference is full."""
        room = self.cfg.reference_size - len(self.ref["loglen"])
        take, rest = feats[:max(0, room)], feats[max(0, room):]
        for f in take:
            for k in RATE_CHARTS:
                self.ref[k].append(_flag_of(f, k))
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
                flag = _flag_of(f, k)
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
                r = chart.update([_flag_of(f, name) for f in live])
            elif name.startswith("length"):
                r = chart.update([math.log1p(f.length) for f in live])
            else:
                r = chart.update([f.acceptance for f in live])
            self.last[name] = r
            if r.alarm_new:
                ex = self.examples.get(name, self.examples["recent"])
                alarms.append(Alarm(name, self.model, self.arm, r, [t for t, _ in ex if t], [q for _, q in ex]))
        return alarms

    def behaviour_rates(self) -> dict[str, float]:
        return {k: (sum(v) / len(v) if v else 0.0) for k, v in self.recent_flags.items()}

    def acceptance_rate(self) -> float:
        return float(np.mean(self.recent_acc)) if self.recent_acc else math.nan

    def get_state(self) -> dict:
        return {"ref": self.ref, "samples": self.samples, "flag_counts": self.flag_counts,
                "charts": {k: c.get_state() for k, c in self.charts.items()}}

    def set_state(self, st: dict) -> None:
        self.ref, self.samples, self.flag_counts = st["ref"], st["samples"], st["flag_counts"]
        if st["charts"]:
            self.fit()
            for k, cs in st["charts"].items():
                if k in self.charts:
                    self.charts[k].set_state(cs)


class ArmComparison:
    """Baseline vs candidate windows of one model, tested every ``window`` candidate samples.

    Tests: length (CvM), finish reason (chi-square), each behavioural rate (Fisher), text (linear
    MMD on ``cfg.text_embedder`` vectors: hashed n-grams by default, MiniLM as an option; each
    sample is embedded once, when it first enters a test).  Holm across them; alarm when the
    smallest adjusted p-value is below alpha = window / ert_each.
    """

    def __init__(self, model: str, cfg: MonitorConfig):
        self.model, self.cfg = model, cfg
        self.win = {a: deque(maxlen=cfg.window) for a in ("baseline", "candidate")}
        self.pending = 0
        self.alpha = cfg.window / cfg.ert_each
        self.alarm = False
        self.last: dict[str, Result] = {}

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
        tests = [length_test([f.length for f in b], [f.length for f in c]),
                 finish_reason_test([f.finish_reason for f in b], [f.finish_reason for f in c])]
        tests += [rate_test([_flag_of(f, k) for f in b], [_flag_of(f, k) for f in c], name=k)
                  for k in RATE_CHARTS]
        if self.cfg.text_test:
            m = min(len(b), len(c)) // 2 * 2
            tests.append(linear_mmd(self._embedded(b[:m]), self._embedded(c[:m])))
        adj = holm([t.pvalue for t in tests])
        alarms = []
        for t, p in zip(tests, adj):
            fire = bool(p < self.alpha)
            prev = self.last.get(t.name)
            r = Result(f"twosample_{t.name}", t.statistic, self.alpha, fire or bool(prev and prev.alarm),
                       alarm_new=fire and not (prev and prev.alarm), pvalue=float(p), n=len(c),
                       extra={"detail": t.detail, "raw_pvalue": t.pvalue})
            self.last[t.name] = r
            if r.alarm_new:
                alarms.append(Alarm(r.detector, self.model, "candidate", r,
                                    [f.trace_id for f in c[-5:] if f.trace_id], [f.request_id for f in c[-5:]]))
        return alarms


class PairTable:
    """Greedy outputs waiting for their counterpart in the other arm (bounded LRU by pair key)."""

    def __init__(self, model: str, cfg: MonitorConfig):
        self.model, self.cfg = model, cfg
        self.table: OrderedDict[str, tuple[str, list[int] | None, str | None, str]] = OrderedDict()
        self.detector = PairedExactMatch(cfg.ert_each, delta=cfg.exact_match_delta, aa_rate=cfg.aa_mismatch_rate,
                                         restart_after_alarm=cfg.restart_after_alarm).fit()
        self.aa_pairs = self.aa_mismatches = 0
        self.mismatch_examples: deque = deque(maxlen=5)
        self.last: Result | None = None

    def add(self, feats: Iterable[Features]) -> list[Alarm]:
        pairs, trace = [], []
        for f in feats:
            if not f.greedy or f.token_ids is None or f.arm not in ("baseline", "candidate"):
                continue
            other = self.table.pop(f.pair_key, None)
            if other is None or other[0] == f.arm:
                if other is not None and f.arm == "baseline":  # A/A pair: tracks batch non-invariance
                    self.aa_pairs += 1
                    self.aa_mismatches += other[1] != f.token_ids
                self.table[f.pair_key] = (f.arm, f.token_ids, f.trace_id, f.request_id)
                if len(self.table) > self.cfg.pair_cache:
                    self.table.popitem(last=False)
                continue
            cand, base = (f.token_ids, other[1]) if f.arm == "candidate" else (other[1], f.token_ids)
            pairs.append((cand, base))
            trace.append((f.trace_id, f.request_id) if f.arm == "candidate" else (other[2], other[3]))
        return self._score(pairs, trace)

    def add_pair(self, cand_ids, base_ids, trace_id: str | None, request_id: str) -> list[Alarm]:
        """A pair from the replay client (baseline answer fetched from ``--baseline-url``)."""
        return self._score([(cand_ids, base_ids)], [(trace_id, request_id)])

    def _score(self, pairs, trace) -> list[Alarm]:
        if not pairs:
            return []
        for (c, b), t in zip(pairs, trace):
            if c != b:
                self.mismatch_examples.append(t)
        r = self.detector.update(pairs)
        self.last = r
        if r.alarm_new:
            ex = list(self.mismatch_examples)
            return [Alarm("exact_match", self.model, "candidate", r, [t for t, _ in ex if t], [q for _, q in ex])]
        return []
