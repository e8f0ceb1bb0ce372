"""``Charts``: every chart of the sidecar, created on first use per model (and arm), and what is done
to all of them at once: gauges, the alarm life cycle (list, acknowledge, re-baseline) and state.

Per (model, arm): a ``StreamMonitor``; per model: an ``ArmComparison`` (the two-sample family and
the evidence-loss test), a ``PairTable`` (T=0 exact match), a ``ConformanceMonitor`` (T>0 sampling
conformance and impossible tokens) and a ``RepeatChart``.  Not thread-safe: the pipeline holds its
lock around every call (the workers' callbacks run on their own threads).
"""

from __future__ import annotations

import math
from typing import Any

from .config import ServiceConfig
from .conformance_monitor import ConformanceMonitor
from .detectors.base import to_jsonable
from .detectors.repeats import RepeatChart
from .features import Features
from .monitor import ArmComparison, StreamMonitor
from .pair_table import PairTable
from .sinks import Metrics


class Charts:
    def __init__(self, cfg: ServiceConfig):
        self.cfg = cfg
        self.streams: dict[tuple[str, str], StreamMonitor] = {}
        self.compare: dict[str, ArmComparison] = {}
        self.pairs: dict[str, PairTable] = {}
        self.conformance: dict[str, ConformanceMonitor] = {}
        self.repeats: dict[str, RepeatChart] = {}
        # (model, arm) -> the --reference samples' features; arm "*": every arm of the model
        self.reference: dict[tuple[str, str], list[Features]] = {}

    # --- one chart, created on first use ----------------------------------------------------------
    def stream(self, model: str, arm: str) -> StreamMonitor:
        mon = self.streams.get((model, arm))
        if mon is None:
            mon = self.streams[(model, arm)] = StreamMonitor(model, arm, self.cfg.monitor)
            ref = self.reference.get((model, arm)) or self.reference.get((model, "*"))
            if ref:
                mon.add_reference(ref)
        return mon

    def comparison(self, model: str) -> ArmComparison:
        if model not in self.compare:
            self.compare[model] = ArmComparison(model, self.cfg.monitor)
        return self.compare[model]

    def pair_table(self, model: str) -> PairTable:
        if model not in self.pairs:
            self.pairs[model] = PairTable(model, self.cfg.monitor)
        return self.pairs[model]

    def conformance_monitor(self, model: str) -> ConformanceMonitor:
        if model not in self.conformance:
            self.conformance[model] = ConformanceMonitor(model, self.cfg.conformance)
        return self.conformance[model]

    def repeat_chart(self, model: str) -> RepeatChart:
        if model not in self.repeats:
            self.repeats[model] = RepeatChart()
        return self.repeats[model]

    # --- all of them ------------------------------------------------------------------------------
    def refresh_gauges(self, m: Metrics) -> None:
        for (model, arm), mon in self.streams.items():
            for k, v in mon.behaviour_rates().items():
                m.rate.labels(k, model, arm).set(v)
            acc = mon.acceptance_rate()
            if not math.isnan(acc):
                m.acceptance.labels(model, arm).set(acc)
            for name, r in mon.last.items():
                m.statistic.labels(name, model, arm).set(r.statistic)
                m.alarm.labels(name, model, arm).set(1 if r.alarm else 0)
        for model, cmp in self.compare.items():
            for r in cmp.last.values():
                m.statistic.labels(r.detector, model, "candidate").set(r.statistic)
                m.pvalue.labels(r.detector, model, "candidate").set(r.pvalue if r.pvalue is not None else 1.0)
                m.alarm.labels(r.detector, model, "candidate").set(1 if r.alarm else 0)
        for model, cm in self.conformance.items():
            for arm, chart in cm.charts.items():
                m.statistic.labels("sampling_conformance", model, arm).set(max(chart.s_up_, chart.s_down_))
                m.alarm.labels("sampling_conformance", model, arm).set(1 if chart.alarm_ else 0)
                mean, _, n = cm.mean_logprob(arm)
                if n:
                    m.conformance_logprob.labels(model, arm).set(mean)
            for arm, st in cm.impossible.arms.items():
                m.alarm.labels("impossible_tokens", model, arm).set(1 if st["alarm"] else 0)
                m.statistic.labels("impossible_tokens", model, arm).set(st["impossible"])
                m.pvalue.labels("impossible_tokens", model, arm).set(cm.impossible.pvalue(arm))
            d, _, _ = cm.shift()
            if not math.isnan(d):
                m.conformance_shift.labels(model).set(d)
        for model, rc in self.repeats.items():
            for arm, st in rc.arms.items():
                m.alarm.labels("repeated_samples", model, arm).set(1 if st["alarm"] else 0)
                m.statistic.labels("repeated_samples", model, arm).set(
                    st["repeats"] / st["comparisons"] if st["comparisons"] else 0.0)
        for model, pt in self.pairs.items():
            if pt.detector.pairs_:
                m.exact.labels(model).set(pt.detector.exact_match_rate)
            if pt.last is not None:
                m.statistic.labels("exact_match", model, "candidate").set(pt.last.statistic)
                m.alarm.labels("exact_match", model, "candidate").set(1 if pt.last.alarm else 0)

    def active_alarms(self) -> list[dict[str, Any]]:
        """Every latched alarm (all detector kinds), as JSON-safe dicts (``GET /alarms``)."""
        out: list[dict[str, Any]] = []
        for mon in self.streams.values():
            out += mon.active_alarms()
        for cmp in self.compare.values():
            out += cmp.active_alarms()
        for pt in self.pairs.values():
            out += pt.active_alarms()
        for model, cm in self.conformance.items():
            out += [{"detector": "sampling_conformance", "model": model, "arm": arm,
                     "statistic": max(c.s_up_, c.s_down_), "threshold": c.threshold_,
                     "alarm_index": c.alarm_index_, "samples_since_fit": c.n_}
                    for arm, c in cm.charts.items() if c.alarm_]
            out += [{"detector": "impossible_tokens", "model": model, "arm": arm, "statistic": st["impossible"],
                     "threshold": cm.impossible.alpha, "alarm_index": st["alarm_index"],
                     "samples_since_fit": st["samples"], "reasons": st["reasons"]}
                    for arm, st in cm.impossible.arms.items() if st["alarm"]]
        for model, rc in self.repeats.items():
            out += [{"detector": "repeated_samples", "model": model, "arm": arm, "statistic": st["repeats"],
                     "threshold": rc.alpha, "alarm_index": st["alarm_index"],
                     "samples_since_fit": st["comparisons"]} for arm, st in rc.arms.items() if st["alarm"]]
        return [to_jsonable(a) for a in out]

    def acknowledge(self, detector: str | None = None, model: str | None = None,
                    arm: str | None = None) -> list[dict[str, str]]:
        """Acknowledge latched alarms matching (detector, model, arm); ``None`` matches all.  The
        statistic of each acknowledged detector restarts (``Pipeline.acknowledge`` says why)."""
        done: list[dict[str, str]] = []

        def latched(d: str, m: str, a: str, alarm: bool) -> bool:
            """A per-arm alarm that matches: recorded as acknowledged (the caller restarts it)."""
            hit = alarm and detector in (None, d) and model in (None, m) and arm in (None, a)
            if hit:
                done.append({"detector": d, "model": m, "arm": a})
            return hit

        for (m, a), mon in self.streams.items():
            if model in (None, m) and arm in (None, a):
                done += [{"detector": d, "model": m, "arm": a} for d in mon.acknowledge(detector)]
        for m, chart in [*self.compare.items(), *self.pairs.items()]:
            if model in (None, m) and arm in (None, "candidate"):
                done += [{"detector": d, "model": m, "arm": "candidate"} for d in chart.acknowledge(detector)]
        for m, cm in self.conformance.items():
            for a, c in cm.charts.items():
                if latched("sampling_conformance", m, a, c.alarm_):
                    cm.reset(a, "sampling_conformance")
            for a, st in list(cm.impossible.arms.items()):
                if latched("impossible_tokens", m, a, st["alarm"]):
                    cm.reset(a, "impossible_tokens")
        for m, rc in self.repeats.items():
            for a, st in rc.arms.items():
                if latched("repeated_samples", m, a, st["alarm"]):
                    rc.reset(a)
        return done

    def rebaseline(self, model: str | None = None, arm: str | None = None) -> list[str]:
        """Drop the frozen references (and A/A estimates) of the matching stream charts, arm
        comparisons and pair tables (``Pipeline.rebaseline`` says what follows)."""
        done: list[str] = []
        for (m, a), mon in self.streams.items():
            if model in (None, m) and arm in (None, a):
                mon.rebaseline()
                done.append(f"stream {m}/{a}")
        for kind, charts in (("twosample", self.compare), ("exact_match", self.pairs)):
            for m, chart in charts.items():
                if model in (None, m):
                    chart.rebaseline()
                    done.append(f"{kind} {m}")
        return done

    # --- state (the pipeline's state file holds it under these keys) ------------------------------
    def get_state(self) -> dict[str, Any]:
        return {"streams": {f"{m}\x1f{a}": s.get_state() for (m, a), s in self.streams.items()},
                "compare": {m: c.get_state() for m, c in self.compare.items()},
                "pairs": {m: p.get_state() for m, p in self.pairs.items()},
                "conformance": {m: c.get_state() for m, c in self.conformance.items()},
                "repeats": {m: c.get_state() for m, c in self.repeats.items()}}

    def set_state(self, st: dict[str, Any]) -> None:
        for model, cs in st["conformance"].items():
            self.conformance_monitor(model).set_state(cs)
        for model, cs in st["repeats"].items():
            self.repeat_chart(model).set_state(cs)
        for key, ss in st["streams"].items():
            model, arm = key.split("\x1f")
            self.streams[(model, arm)] = StreamMonitor(model, arm, self.cfg.monitor)
            self.streams[(model, arm)].set_state(ss)
        for model, cs in st["compare"].items():
            self.comparison(model).set_state(cs)
        for model, ps in st["pairs"].items():
            self.pair_table(model).set_state(ps)
