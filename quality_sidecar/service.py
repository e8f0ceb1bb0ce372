"""The sidecar loop: poll -> decode/validate (bad -> DLQ) -> dedupe -> classify -> detect -> export.

Delivery: at-least-once from the source, exactly-once in the counts when ``state_path`` is set.
Every checkpoint (each ``commit_interval_s``) flushes the DLQ and alert writers, atomically writes
the state (per-partition next offsets, the request-id dedupe window, counters, detector states) and
only then commits the offsets to Kafka.  After a crash the restarted sidecar loads the state, skips
redelivered records below the saved offsets and drops request ids it has already seen - so nothing
is lost (uncommitted records are redelivered) and nothing is counted twice.

Baseline-server workers (T>0 scorer, T=0 replay): a sample handed to one is *pending* until the
worker is done with it; offsets are committed only below the oldest pending sample, and the
checkpoint lists the pending request ids, so that after a crash those records come back and go to
their worker again (their other counts are already in the state).  While a worker is behind, the
source is paused (``_backpressure``): a consumer catching up on lag scores what a live one would.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .baseline_scoring import ConformanceConfig, ConformanceMonitor, draft_positions, scorable
from .classifiers import classify_batch, default_classifiers
from .classifiers.format import FormatClassifier
from .detectors.base import to_jsonable
from .detectors.embedders import make_embedder
from .detectors.repeats import RepeatChart, repeat_keys
from .features import Features, extract
from .monitor import (
    REMOVED_MONITOR_KEYS,
    UNSCORED,
    Alarm,
    ArmComparison,
    MonitorConfig,
    PairTable,
    StreamMonitor,
)
from .sinks import AlertSink, JsonWriter, Metrics, dlq_record
from .validate import sample_errors

log = logging.getLogger("quality_sidecar")

Origin = tuple[bytes, dict[str, Any]]  # a record's raw bytes and where it came from (the DLQ keeps both)

ALARM_HELP = {
    "refusal": ("refusal rate rose", "read the example traces; check the model/template version and the decoder"),
    "format_invalid": ("more outputs break their format", "check structured-output settings and the decoder"),
    "unsafe": ("safety patterns fire more often", "inspect examples; escalate to the safety owner"),
    "degenerate": ("more empty or looping outputs", "suspect the speculative decoder: compare with decoding off"),
    "truncated": ("more outputs cut short", "check max_tokens, aborts and the decoder's stop handling"),
    "length_up": ("outputs got longer", "compare prompts mix; if unchanged, suspect the decoder/model"),
    "length_down": ("outputs got shorter", "compare prompts mix; if unchanged, suspect the decoder/model"),
    "acceptance_down": ("draft acceptance fell (speed, not correctness)", "check lookahead params and traffic mix"),
    "exact_match": ("greedy outputs differ from the baseline more often than the baseline arm's own "
                    "(measured A/A mismatch rate, same pair source)",
                    "lossless decoding is broken: roll the candidate back, replay the example prompts"),
    "sampling_conformance": ("T>0 outputs are not distributed as the sampler specifies, judged by the "
                             "baseline model's own likelihood (PIT)",
                             "speculative sampling is not lossless: roll the candidate back; on the "
                             "baseline arm it means the scorer and the serving engine differ (model, dtype)"),
    "repeated_samples": ("T>0 samples of one prompt repeat each other more often than on the baseline arm "
                         "(every single sample can still look right)",
                         "the decoder reuses one random stream across requests: roll the candidate back; "
                         "compare the example requests' outputs"),
    "twosample_unscored": ("T>0 outputs the conformance scorer cannot judge (aborted, ...) are more frequent in "
                           "the candidate arm than in the baseline arm",
                           "a decoder that aborts or errors hides from the T>0 checks: read the example requests"),
    "twosample_evidence_loss": ("the baseline server gives up on more candidate T>0 samples than baseline ones "
                                "(e.g. outputs run to the context limit and the scorer's request is refused)",
                                "the decoder removes its own evidence: roll the candidate back, read the "
                                "scorer's failure reasons (quality_sidecar_baseline_failed_samples)"),
    "impossible_tokens": ("T>0 outputs hold tokens the request's sampler could not have drawn (outside its "
                          "top-p / top-k / min-p cut or the vocabulary)",
                          "the decoder ignores a sampling parameter: roll the candidate back; detail.reasons "
                          "names the parameter; on the baseline arm the scorer and the serving engine differ"),
}


@dataclass
class ServiceConfig:
    source: str = ""
    group: str = "quality-sidecar"
    dlq: str | None = None
    alerts: str | None = None
    webhook_url: str | None = None
    baseline_url: str | None = None
    baseline_dtype: str | None = None  # the baseline server's dtype: replays of samples served at another are refused
    replay_fraction: float = 0.1
    state_path: str | None = None
    reference_path: str | None = None
    dedupe_window: int = 100_000
    commit_interval_s: float = 1.0
    max_poll_records: int = 500
    batch_linger_s: float = 0.1
    max_message_bytes: int = 4 * 1024 * 1024
    format_code_fraction: float = 1.0
    safety_backend: str | None = None
    validation: str = "fast"
    max_samples: int | None = None
    progress: bool = True
    kafka_cluster_name: str = ""  # cluster_name label of the lag metrics (default: the bootstrap servers)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    conformance: ConformanceConfig = field(default_factory=ConformanceConfig)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ServiceConfig:
        d = dict(d)
        mon = d.pop("monitor", {}) or {}
        conf = d.pop("conformance", {}) or {}
        known = {f.name for f in fields(cls)}
        bad = set(d) - known
        mknown = {f.name for f in fields(MonitorConfig)}
        cknown = {f.name for f in fields(ConformanceConfig)}
        removed = sorted(set(mon) & set(REMOVED_MONITOR_KEYS))
        if removed:
            raise ValueError("; ".join(REMOVED_MONITOR_KEYS[k] for k in removed))
        if bad or set(mon) - mknown or set(conf) - cknown:
            raise ValueError(f"unknown config keys: "
                             f"{sorted(bad | (set(mon) - mknown) | {'conformance.' + k for k in set(conf) - cknown})}")
        return cls(**d, monitor=MonitorConfig(**mon), conformance=ConformanceConfig(**conf))


class Pipeline:
    """Everything except the source: usable offline (``score``) and inside the loop."""

    def __init__(self, cfg: ServiceConfig, metrics: Metrics | None = None, alerts: AlertSink | None = None):
        self.cfg = cfg
        self.metrics = metrics or Metrics()
        self.alerts = alerts
        clfs = default_classifiers(cfg.safety_backend)
        self.classifiers = [FormatClassifier(code_fraction=cfg.format_code_fraction)
                            if c.name == "format_invalid" else c for c in clfs]
        if cfg.monitor.text_test:  # load (and check) the text embedder now, not at the first window
            make_embedder(cfg.monitor.text_embedder)
        self.streams: dict[tuple[str, str], StreamMonitor] = {}
        self.compare: dict[str, ArmComparison] = {}
        self.pairs: dict[str, PairTable] = {}
        self.conformance: dict[str, ConformanceMonitor] = {}
        self.repeats: dict[str, RepeatChart] = {}
        self.seen: OrderedDict[str, None] = OrderedDict()
        # Samples handed to a worker (scorer / replay) and not finished: request id -> (worker, topic,
        # partition, offset).  Offsets are committed only below the oldest of them, and a checkpoint
        # saves them, so that after a crash their redelivered records are worked on again (``rework``).
        self.pending: dict[str, tuple[str, str, int, int]] = {}
        self.rework: dict[str, str] = {}  # request id -> worker, restored from a checkpoint
        self.redelivered: list[tuple[str, dict[str, Any]]] = []  # (worker, sample) found by decode
        self.counts = {"samples": 0, "duplicates": 0, "dlq": 0}
        self.dlq_reasons: dict[str, int] = {}
        self.alarm_log: list[dict[str, Any]] = []
        self.control_log: list[dict[str, Any]] = []  # ack / clear / rebaseline events
        self.control_dirty = False  # an ack or rebaseline not yet in the state file
        self.reference: dict[tuple[str, str], list[Features]] = {}
        self._lock = threading.Lock()
        if cfg.reference_path:
            self._load_reference(cfg.reference_path)

    def _load_reference(self, path: str) -> None:
        samples = []
        with open(path, "rb") as fh:
            for i, line in enumerate(fh):
                if line.strip():
                    s = json.loads(line)
                    errs = sample_errors(s)
                    if errs:
                        raise ValueError(f"reference {path}:{i + 1} is not a valid v1 sample: {errs[0]}")
                    samples.append(s)
        for f in self.classify(samples):
            self.reference.setdefault((f.model, f.arm), []).append(f)
            self.reference.setdefault((f.model, "*"), []).append(f)

    # --- per-sample work -------------------------------------------------------------------------
    def classify(self, samples: list[dict[str, Any]]) -> list[Features]:
        feats = [extract(s) for s in samples]
        texts = [f.text for f in feats]
        prompts = [(s.get("prompt") or {}).get("text") for s in samples]
        rfs = [(s.get("sampling") or {}).get("response_format") for s in samples]
        frs = [(s.get("output") or {}).get("finish_reason") for s in samples]
        for clf in self.classifiers:
            for f, v in zip(feats, classify_batch(clf, texts, prompts, rfs, frs)):
                f.flags[v.name] = v.flagged
                f.scores[v.name] = v.score
        for f, smp in zip(feats, samples):
            f.flags[UNSCORED] = isinstance(scorable(smp), str)
        return feats

    def reject(self, raw: bytes, reason_label: str, reason: str, where: dict, dlq: JsonWriter | None) -> None:
        self.counts["dlq"] += 1
        self.dlq_reasons[reason_label] = self.dlq_reasons.get(reason_label, 0) + 1
        self.metrics.dlq.labels(reason_label).inc()
        if dlq is not None:
            dlq.write(dlq_record(raw, reason, where), key=None)

    def decode(self, raw: bytes, where: dict, dlq: JsonWriter | None) -> dict[str, Any] | None:
        """Parsed, valid, not-yet-seen sample, or None (rejected to the DLQ or a duplicate)."""
        if len(raw) > self.cfg.max_message_bytes:
            self.reject(raw[:1024], "too_large", f"message of {len(raw)} bytes > {self.cfg.max_message_bytes}",
                        where, dlq)
            return None
        try:
            obj = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            self.reject(raw, "invalid_json", f"invalid JSON: {e}", where, dlq)
            return None
        if not isinstance(obj, dict):
            self.reject(raw, "not_an_object", f"top-level JSON {type(obj).__name__}, expected an object", where, dlq)
            return None
        errs = sample_errors(obj, full=self.cfg.validation == "full")
        if errs:
            self.reject(raw, "schema", "schema v1: " + "; ".join(errs[:3]), where, dlq)
            return None
        rid = obj["request_id"]
        if rid in self.seen:
            self.counts["duplicates"] += 1
            worker = self.rework.pop(rid, None)
            if worker is not None:  # counted before a crash, but its worker had not finished it
                self.redelivered.append((worker, obj))
            return None
        self.seen[rid] = None
        if len(self.seen) > self.cfg.dedupe_window:
            self.seen.popitem(last=False)
        return obj

    def reject_sample(self, sample: dict[str, Any], origin: Origin | None, reason_label: str, reason: str,
                      dlq: JsonWriter | None) -> None:
        """Dead-letter a valid sample that the sidecar failed on (``origin``: its raw bytes and source
        position; a sample handed over without them is re-serialised)."""
        log.warning("dead-lettering %s (%s): %s", sample.get("request_id"), reason_label, reason)
        raw, where = origin if origin is not None else (json.dumps(sample, default=str).encode(), {})
        self.reject(raw, reason_label, reason, where, dlq)

    def featurize(self, samples: list[dict[str, Any]], origins: list[Origin] | None = None,
                  dlq: JsonWriter | None = None) -> tuple[list[int], list[Features]]:
        """(indices kept, their features): the per-record work (feature extraction, every classifier).

        The batch goes through the classifiers' vectorised paths at once; if anything raises, each
        sample is redone alone, so a poison record -- say a degenerate output that breaks a parser --
        costs only itself: it goes to the DLQ (``classifier_error``) and the rest of the batch is kept.
        """
        try:
            return list(range(len(samples))), self.classify(samples)
        except Exception:  # noqa: BLE001 - find the record(s) below
            pass
        kept, feats = [], []
        for i, smp in enumerate(samples):
            try:
                feats += self.classify([smp])
                kept.append(i)
            except Exception as e:  # noqa: BLE001 - one record must not stop the stream
                self.reject_sample(smp, origins[i] if origins else None, "classifier_error",
                                   f"{type(e).__name__}: {str(e)[:300]}", dlq)
        return kept, feats

    def process(self, samples: list[dict[str, Any]], origins: list[Origin] | None = None,
                dlq: JsonWriter | None = None) -> list[Alarm]:
        """Classify and monitor a batch of valid samples; returns (and emits) new alarms."""
        kept, feats = self.featurize(samples, origins, dlq)
        return self.monitor([samples[i] for i in kept], feats, [origins[i] for i in kept] if origins else None, dlq)

    def monitor(self, samples: list[dict[str, Any]], feats: list[Features], origins: list[Origin] | None = None,
                dlq: JsonWriter | None = None) -> list[Alarm]:
        """Feed classified samples to the charts; returns (and emits) new alarms.

        A chart that raises is a sidecar bug, not the stream's: the records it raised on are
        dead-lettered (``detector_error``, replayable once fixed) and the other charts and records go
        on.  Only records not dead-lettered count as samples, so records = samples + duplicates + DLQ.
        """
        if not samples:
            return []
        dead: set[int] = set()

        def guarded(name: str, idx: list[int], call: Callable[..., list[Alarm]], *args: Any) -> list[Alarm]:
            try:
                return call(*args)
            except Exception as e:  # noqa: BLE001
                log.exception("chart %s failed on %d record(s)", name, len(idx))
                for i in idx:
                    if i not in dead:
                        dead.add(i)
                        self.reject_sample(samples[i], origins[i] if origins else None, "detector_error",
                                           f"{name}: {type(e).__name__}: {str(e)[:300]}", dlq)
                return []

        alarms: list[Alarm] = []
        with self._lock:
            for i, smp in enumerate(samples):
                alarms += guarded("repeated_samples", [i], self._add_repeat, smp)
            groups: dict[tuple[str, str], list[int]] = {}
            for i, f in enumerate(feats):
                if i not in dead:
                    groups.setdefault((f.model, f.arm), []).append(i)
            for (model, arm), idx in groups.items():
                fs = [feats[i] for i in idx]
                alarms += guarded("stream", idx, self._stream(model, arm).update, fs)
                alarms += guarded("arm_comparison", idx, self._compare(model).update, arm, fs)
                alarms += guarded("exact_match", idx, self.pairs.setdefault(
                    model, PairTable(model, self.cfg.monitor)).add, fs)
                n = sum(i not in dead for i in idx)
                if n:
                    self.metrics.samples.labels(model, arm).inc(n)
            self.counts["samples"] += len(samples) - len(dead)
            self._emit(alarms)
        return alarms

    def _compare(self, model: str) -> ArmComparison:
        return self.compare.setdefault(model, ArmComparison(model, self.cfg.monitor))

    def _add_repeat(self, smp: dict[str, Any]) -> list[Alarm]:
        keys = repeat_keys(smp)
        if keys is None:
            return []
        model, arm = smp["model"], smp["deployment"]["arm"]
        chart = self.repeats.setdefault(model, RepeatChart(restart_after_alarm=self.cfg.monitor.restart_after_alarm))
        r = chart.update(arm, *keys)
        if not r.alarm_new:
            return []
        # The match that fired may complete on a baseline sample: the alarm is the candidate's.
        return [Alarm("repeated_samples", model, r.extra["arm"], r, [smp["trace_id"]] if smp.get("trace_id") else [],
                      [smp["request_id"]])]

    def track(self, worker: str, sample: dict[str, Any], where: tuple[str, int, int]) -> None:
        with self._lock:
            self.pending[sample["request_id"]] = (worker, *where)

    def untrack(self, sample: dict[str, Any]) -> None:
        with self._lock:
            self.pending.pop(sample["request_id"], None)

    def pending_floor(self) -> dict[tuple[str, int], int]:
        """Per partition, the oldest offset a worker has not finished: commits stop there."""
        out: dict[tuple[str, int], int] = {}
        with self._lock:
            for _w, t, p, o in self.pending.values():
                out[(t, p)] = min(out.get((t, p), o), o)
        return out

    def worker_failed(self, sample: dict[str, Any], reason: str) -> None:
        """A worker gave a sample up (after its retries).  A server that refuses the token ids of a
        T>0 sample is evidence too: the sequence holds a token outside the model's vocabulary."""
        with self._lock:
            self.pending.pop(sample["request_id"], None)
            sampled = bool((sample.get("sampling") or {}).get("temperature"))  # the scorer's: the replay takes T=0
            if sampled:
                self._emit(self._compare(sample["model"]).scorer_finished(sample["deployment"]["arm"], True))
            if reason == "rejected_token_ids" and sampled:
                mon = self._conformance(sample["model"])
                n = len((sample.get("output") or {}).get("token_ids") or [])
                arm = sample["deployment"]["arm"]
                r = mon.add_impossible(arm, n, {"vocab": 1}, sample.get("trace_id"), sample["request_id"])
                self.metrics.impossible.labels(sample["model"], arm, "vocab").inc()
                self._alarm_impossible(mon, sample["model"], arm, r)

    def _conformance(self, model: str) -> ConformanceMonitor:
        mon = self.conformance.get(model)
        if mon is None:
            mon = self.conformance[model] = ConformanceMonitor(
                model, self.cfg.conformance, restart_after_alarm=self.cfg.monitor.restart_after_alarm)
        return mon

    def _alarm_impossible(self, mon: ConformanceMonitor, model: str, arm: str, r: Any) -> None:
        if r.alarm_new:
            ex = mon.impossible_examples.get(arm, [])
            self._emit([Alarm("impossible_tokens", model, arm, r, [t for t, _ in ex if t], [q for _, q in ex])])

    def add_replay_pair(self, sample: dict[str, Any], baseline: dict[str, Any]) -> None:
        """Callback of the replay worker: pair a greedy output with the baseline server's answer.

        A candidate sample gives a test pair; a baseline-arm sample gives an A/A pair: the measured
        mismatch rate the candidate's is tested against (no A/A pairs, no verdict)."""
        cand = sample["output"].get("token_ids")
        base = baseline.get("token_ids")
        if cand is None or base is None:
            cand, base = sample["output"].get("text"), baseline.get("text")
        with self._lock:
            self.pending.pop(sample["request_id"], None)
            pt = self.pairs.setdefault(sample["model"], PairTable(sample["model"], self.cfg.monitor))
            self._emit(pt.add_replay(sample["deployment"]["arm"], cand, base, sample.get("trace_id"),
                                     sample["request_id"]))

    def add_conformance(self, sample: dict[str, Any], score: Any) -> None:
        """Callback of the conformance scorer: one T>0 sample scored under the baseline model."""
        model, arm = sample["model"], sample["deployment"]["arm"]
        with self._lock:
            self.pending.pop(sample["request_id"], None)
            self._emit(self._compare(model).scorer_finished(arm, False))
            mon = self._conformance(model)
            r, ri = mon.add(arm, score, sample.get("trace_id"), sample["request_id"], draft_positions(sample))
            self.metrics.conformance_scored.labels(model, arm).inc()
            self.metrics.conformance_tokens.labels(model, arm).inc(score.n_tokens)
            for reason, n in score.oos_reasons.items():
                self.metrics.impossible.labels(model, arm, reason).inc(n)
            self._alarm_impossible(mon, model, arm, ri)
            if r.alarm_new:
                ex = mon.examples.get(arm, [])
                self._emit([Alarm("sampling_conformance", model, arm, r, [t for t, _ in ex if t],
                                  [q for _, q in ex])])

    def _stream(self, model: str, arm: str) -> StreamMonitor:
        mon = self.streams.get((model, arm))
        if mon is None:
            mon = self.streams[(model, arm)] = StreamMonitor(model, arm, self.cfg.monitor)
            ref = self.reference.get((model, arm)) or self.reference.get((model, "*"))
            if ref:
                mon.add_reference(ref)
        return mon

    def _emit(self, alarms: list[Alarm]) -> None:
        for a in alarms:
            r = a.result
            meaning, action = ALARM_HELP.get(a.detector, ("baseline and candidate distributions differ",
                                                          "compare the arms on the example requests"))
            event = {"type": "quality_sidecar.alert", "detector": a.detector, "model": a.model, "arm": a.arm,
                     "statistic": r.statistic, "threshold": r.threshold, "pvalue": r.pvalue,
                     "samples_since_fit": r.n, "time_unix_s": time.time(), "meaning": meaning, "action": action,
                     "ert_samples_per_detector": self.cfg.monitor.ert_each,
                     "example_trace_ids": a.trace_ids, "example_request_ids": a.request_ids,
                     "detail": {k: v for k, v in r.extra.items() if isinstance(v, (int, float, str, list))}}
            self.alarm_log.append(event)
            self.metrics.alarms.labels(a.detector, a.model, a.arm).inc()
            if self.alerts is not None:
                self.alerts.emit(event)

    def refresh_gauges(self) -> None:
        m = self.metrics
        with self._lock:
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

    # --- state -----------------------------------------------------------------------------------
    # --- alarm life cycle: list, acknowledge, clear, re-baseline ------------------------------------
    def active_alarms(self) -> list[dict[str, Any]]:
        """Every latched alarm (all detector kinds), as JSON-safe dicts (``GET /alarms``)."""
        out: list[dict[str, Any]] = []
        with self._lock:
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

    def acknowledge(self, detector: str | None = None, model: str | None = None, arm: str | None = None,
                    by: str | None = None) -> list[dict[str, str]]:
        """Acknowledge latched alarms matching (detector, model, arm); ``None`` matches all.

        The statistic of each acknowledged detector restarts, so a regression that persists fires
        again after the detector's normal delay. The result is in the detector state (persisted at
        the next checkpoint), and an ``quality_sidecar.ack`` event goes to the log and the alert sink.
        """
        done: list[dict[str, str]] = []
        with self._lock:
            for (m, a), mon in self.streams.items():
                if model in (None, m) and arm in (None, a):
                    done += [{"detector": d, "model": m, "arm": a} for d in mon.acknowledge(detector)]
            for m, cmp in self.compare.items():
                if model in (None, m) and arm in (None, "candidate"):
                    done += [{"detector": d, "model": m, "arm": "candidate"} for d in cmp.acknowledge(detector)]
            for m, pt in self.pairs.items():
                if model in (None, m) and arm in (None, "candidate"):
                    done += [{"detector": d, "model": m, "arm": "candidate"} for d in pt.acknowledge(detector)]
            for m, cm in self.conformance.items():
                for a, c in cm.charts.items():
                    if c.alarm_ and detector in (None, "sampling_conformance") and model in (None, m) \
                            and arm in (None, a):
                        cm.reset(a, "sampling_conformance")
                        done.append({"detector": "sampling_conformance", "model": m, "arm": a})
                for a, st in list(cm.impossible.arms.items()):
                    if st["alarm"] and detector in (None, "impossible_tokens") and model in (None, m) \
                            and arm in (None, a):
                        cm.reset(a, "impossible_tokens")
                        done.append({"detector": "impossible_tokens", "model": m, "arm": a})
            for m, rc in self.repeats.items():
                for a, st in rc.arms.items():
                    if st["alarm"] and detector in (None, "repeated_samples") and model in (None, m) \
                            and arm in (None, a):
                        rc.reset(a)
                        done.append({"detector": "repeated_samples", "model": m, "arm": a})
            if done:
                self._control_event("quality_sidecar.ack", {"acknowledged": done, "by": by})
        return done

    def rebaseline(self, model: str | None = None, arm: str | None = None, by: str | None = None) -> list[str]:
        """Drop the frozen references (and A/A estimates) so the next samples become the new baseline.

        For use after an intended change (new model, new template): the stream charts re-collect
        ``reference_size`` samples and re-fit, the arm windows start empty, and the exact-match test
        forgets its pairs and gives no verdict until ``exact_match_block`` new A/A pairs exist. A reference
        loaded with ``--reference`` is not re-applied. Latched alarms of these detectors are cleared.
        """
        done: list[str] = []
        with self._lock:
            for (m, a), mon in self.streams.items():
                if model in (None, m) and arm in (None, a):
                    mon.rebaseline()
                    done.append(f"stream {m}/{a}")
            for m, cmp in self.compare.items():
                if model in (None, m):
                    cmp.rebaseline()
                    done.append(f"twosample {m}")
            for m, pt in self.pairs.items():
                if model in (None, m):
                    pt.rebaseline()
                    done.append(f"exact_match {m}")
            if done:
                self._control_event("quality_sidecar.rebaseline", {"rebaselined": done, "model": model, "arm": arm,
                                                                   "by": by})
        return done

    def _control_event(self, kind: str, body: dict[str, Any]) -> None:
        event = {"type": kind, "time_unix_s": time.time(), **body}
        self.control_log.append(event)
        del self.control_log[:-100]
        self.control_dirty = True
        log.warning("%s: %s", kind, json.dumps(body))
        if self.alerts is not None:
            self.alerts.emit(event)

    def get_state(self) -> dict[str, Any]:
        """Everything a restart needs: counters, dedupe window and the state of every detector."""
        with self._lock:
            return {"counts": dict(self.counts), "dlq_reasons": dict(self.dlq_reasons), "seen": list(self.seen),
                    "streams": {f"{m}\x1f{a}": s.get_state() for (m, a), s in self.streams.items()},
                    "compare": {m: c.get_state() for m, c in self.compare.items()},
                    "pairs": {m: p.get_state() for m, p in self.pairs.items()},
                    "conformance": {m: c.get_state() for m, c in self.conformance.items()},
                    "repeats": {m: c.get_state() for m, c in self.repeats.items()},
                    "pending": {rid: w for rid, (w, *_where) in self.pending.items()},
                    "alarms": self.alarm_log[-100:], "control": self.control_log[-100:]}

    def set_state(self, st: dict[str, Any]) -> None:
        self.counts.update(st["counts"])
        self.dlq_reasons.update(st["dlq_reasons"])
        for r, n in self.dlq_reasons.items():
            self.metrics.dlq.labels(r).inc(n)
        self.seen = OrderedDict.fromkeys(st["seen"])
        self.rework = dict(st.get("pending") or {})
        self.alarm_log = st.get("alarms", [])
        for model, cs in (st.get("conformance") or {}).items():
            self._conformance(model).set_state(cs)
        for model, cs in (st.get("repeats") or {}).items():
            self.repeats[model] = RepeatChart(restart_after_alarm=self.cfg.monitor.restart_after_alarm)
            self.repeats[model].set_state(cs)
        for key, ss in st["streams"].items():
            model, arm = key.split("\x1f")
            mon = self.streams[(model, arm)] = StreamMonitor(model, arm, self.cfg.monitor)
            mon.set_state(ss)
            self.metrics.samples.labels(model, arm).inc(mon.samples)
        for model, cs in (st.get("compare") or {}).items():
            self.compare[model] = ArmComparison(model, self.cfg.monitor)
            self.compare[model].set_state(cs)
        for model, ps in (st.get("pairs") or {}).items():
            self.pairs[model] = PairTable(model, self.cfg.monitor)
            self.pairs[model].set_state(ps)
        self.control_log = st.get("control", [])
        self.refresh_gauges()  # alarm gauges say 1 for a latched alarm right after the restart


def save_state(path: str, state: dict[str, Any]) -> None:
    """Atomic write (tmp + fsync + rename): a crash leaves the old or the new state, never half."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(state, fh, separators=(",", ":"))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class Service:
    """Owns the source, the sinks, the HTTP server and the loop."""

    def __init__(self, cfg: ServiceConfig, http_port: int | None = None):
        from .sinks import HttpServer, start_otlp
        from .sources import open_source

        self.cfg = cfg
        self.metrics = Metrics()
        self.http = HttpServer(self.metrics, http_port) if http_port is not None else None
        self.otlp = start_otlp(self.metrics)
        self.alerts = AlertSink(cfg.alerts, cfg.webhook_url)
        self.dlq = JsonWriter(cfg.dlq) if cfg.dlq else None
        self.pipeline = Pipeline(cfg, self.metrics, self.alerts)
        if self.http is not None:
            self.http.control = self.pipeline  # /alarms, /alarms/{detector}/ack, /alarms/clear, /rebaseline
        self.offsets: dict[tuple[str, int], int] = {}
        self.source = open_source(cfg.source, cfg.group, **(
            {"max_poll_records": cfg.max_poll_records} if cfg.source.startswith("kafka://") else {}))
        self._instance = f"{os.getpid()}-{time.time_ns() % 10**12}"
        self._checkpoints = 0
        self._fatal = False  # a commit failed: no more checkpoints (they would count uncommitted records)
        self._lag_labels: set[tuple[str, ...]] = set()
        if cfg.state_path:
            self._reconcile_pending_state(cfg.state_path)
        if cfg.state_path and Path(cfg.state_path).exists():
            st = json.loads(Path(cfg.state_path).read_text())
            self.pipeline.set_state(st["pipeline"])
            self.offsets = {(t, int(p)): o for t, p, o in st["offsets"]}
            log.info("resumed from %s: %d samples, %d offsets", cfg.state_path, self.pipeline.counts["samples"],
                     len(self.offsets))
        if hasattr(self.source, "on_revoke"):
            self.source.on_revoke = self._on_revoke
        if cfg.source.startswith("file://") and self.offsets:
            self.source.seek_line(max(self.offsets.values()))
        self.replay = None
        self.scorer = None
        self._reported: dict[tuple[str, ...], int] = {}
        self.metrics.conformance_monitored.set(1 if cfg.baseline_url and cfg.conformance.fraction > 0 else 0)
        if cfg.baseline_url and cfg.conformance.fraction > 0:
            from .baseline_scoring import LogprobClient, ScoringWorker

            cc = cfg.conformance
            self.scorer = ScoringWorker(LogprobClient(cfg.baseline_url, top_logprobs=cc.top_logprobs,
                                                      timeout_s=cc.timeout_s, api=cc.api),
                                        self.pipeline.add_conformance, cc)
        elif not cfg.baseline_url:
            log.warning("no --baseline-url: T>0 sampling conformance is NOT monitored "
                        "(quality_sidecar_conformance_monitored 0)")
        if cfg.baseline_url and cfg.replay_fraction > 0:
            from .replay import BaselineReplayClient, ReplayWorker

            self.replay = ReplayWorker(BaselineReplayClient(cfg.baseline_url), self.pipeline.add_replay_pair,
                                       fraction=cfg.replay_fraction, server_dtype=cfg.baseline_dtype)
        self.workers = {name: w for name, w in (("conformance", self.scorer), ("replay", self.replay)) if w}
        for name, w in self.workers.items():
            w.on_failure = self.pipeline.worker_failed
            self.metrics.baseline_up.labels(name).set(1)
            if self.http is not None:
                self.http.checks[f"baseline server ({name})"] = (lambda w=w: w.up)
        self.stopping = threading.Event()
        # next offset after the last record processed, per partition (committed up to the oldest
        # sample a worker has not finished: ``Pipeline.pending_floor``)
        self.consumed: dict[tuple[str, int], int] = {}

    def request_stop(self, *_args) -> None:
        self.stopping.set()

    def _reconcile_pending_state(self, path: str) -> None:
        """Adopt or drop a checkpoint written but not yet renamed into place when the process died.

        A checkpoint is written to ``<state>.pending``, its offsets are committed with a unique tag
        as commit metadata, and only then renamed to ``<state>``: the state file never counts a
        record whose offset the group has not committed, so after a crash a record counted here
        is never counted again by the replica that takes over its partition.  If the process died
        between the commit and the rename, the tag tells: committed -> adopt, else -> drop.
        """
        pending = Path(f"{path}.pending")
        if not pending.exists():
            return
        try:
            st = json.loads(pending.read_text())
        except ValueError:
            pending.unlink()
            return
        tps = [(t, int(p)) for t, p, _o in st.get("offsets", [])]
        metadata = self.source.committed_metadata(tps) if tps and hasattr(self.source, "committed_metadata") else {}
        if st.get("tag") and st["tag"] in metadata.values():
            os.replace(pending, path)
            log.warning("adopted checkpoint %s: its offsets were committed before the crash", st["tag"])
        else:
            pending.unlink()
            log.warning("dropped an uncommitted checkpoint: its records are redelivered")

    async def _on_revoke(self, partitions: list[tuple[str, int]]) -> None:
        """Rebalance: checkpoint and commit before the partitions go, so their next owner starts after us.

        Runs on the consumer's IO loop (an async rebalance listener), so the commit is awaited there.
        If it fails (this member was evicted: its generation is lost), the in-memory counts hold
        records whose offsets stay uncommitted and that the next owner will count: the process
        stops instead (the error reaches ``poll``), and its restart resumes from the last committed
        state file - the pending one is dropped because its tag was never committed.
        """
        log.info("partitions revoked: %s; checkpointing", partitions)
        plan = self._prepare_checkpoint(export_lag=False)  # no gauge round trips inside the rebalance
        if plan is None:
            return
        offsets, tag = plan
        try:
            await self.source.commit_async(offsets, metadata=tag)
        except Exception:
            self._fatal = True
            log.error("commit before giving up partitions %s failed: stopping; the restart resumes from the "
                      "last committed checkpoint", partitions)
            raise
        self._finish_checkpoint()
        for tp in partitions:  # a worker may still finish one of their samples: its next owner redoes it
            self.consumed.pop(tp, None)

    def _export_lag(self) -> None:
        """kafka-lag-exporter's per-partition gauges for the partitions this member owns now."""
        m = self.metrics
        for (t, p), lag in self.source.lag().items():
            m.lag.labels(t, str(p)).set(lag)
        if not hasattr(self.source, "lag_report"):
            return
        src = self.source
        cluster = self.cfg.kafka_cluster_name or src.bootstrap
        current: set[tuple[str, ...]] = set()
        for r in src.lag_report():
            labels = (cluster, src.group, r.topic, str(r.partition), src.member_host, src.consumer_id, src.client_id)
            current.add(labels)
            m.group_offset.labels(*labels).set(r.committed)
            m.group_lag.labels(*labels).set(r.lag)
            m.group_lag_seconds.labels(*labels).set(r.lag_seconds)
            m.partition_latest_offset.labels(cluster, r.topic, str(r.partition)).set(r.end)
        for labels in self._lag_labels - current:  # revoked partitions: their new owner reports them
            for g in (m.group_offset, m.group_lag, m.group_lag_seconds):
                g.remove(*labels)
            if not any(c[2:4] == labels[2:4] for c in current):
                with contextlib.suppress(KeyError):  # already gone
                    m.partition_latest_offset.remove(labels[0], labels[2], labels[3])
        self._lag_labels = current

    def _backpressure(self) -> bool:
        """Pause the source while a worker is behind (Kafka: pause the partitions and keep polling, so
        the member stays in its group; a file: stop reading).  True while paused."""
        behind = False
        for name, w in self.workers.items():
            sat = w.saturated
            self.metrics.backpressure.labels(name).set(1 if sat else 0)
            self.metrics.worker_pending.labels(name).set(w.pending)
            behind |= sat
        if behind and hasattr(self.source, "pause"):
            self.source.pause()
        elif not behind and hasattr(self.source, "resume"):
            self.source.resume()
        return behind

    def _submit(self, sample: dict[str, Any], where: tuple[str, int, int], only: str | None = None) -> None:
        """Hand a sample to each worker that draws it (``only``: to that worker, no draw: redelivered
        work a crash interrupted), tracked until the worker is done with it."""
        for name, w in self.workers.items():
            if only not in (None, name):
                continue
            item = w.selected(sample) if only is None else w.prepare(sample)
            if item is None or isinstance(item, str):
                continue
            self.pipeline.track(name, sample, where)
            w.enqueue(item)
            if name == "conformance":
                self.metrics.conformance_selected.labels(sample["model"], sample["deployment"]["arm"]).inc()

    def step(self, timeout_s: float = 0.5) -> int:
        """One poll + process; returns the number of records handled."""
        if self._backpressure():  # check again soon: resume as soon as the workers have caught up
            timeout_s = min(timeout_s, 0.01)
            if not hasattr(self.source, "pause"):
                if self.http is not None:
                    self.http.heartbeat = time.monotonic()
                time.sleep(timeout_s)
                return 0
        records = self.source.poll(timeout_s, self.cfg.max_poll_records)
        # Micro-batching: a live topic hands out a few records per poll, and each process() call has
        # a fixed cost (vectoriser, chart updates) of a few ms; gather up to ``batch_linger_s`` more.
        deadline = time.monotonic() + self.cfg.batch_linger_s
        rebalances = getattr(self.source, "rebalances", 0)
        dropped: list = []
        while records and len(records) < self.cfg.max_poll_records and time.monotonic() < deadline:
            more = self.source.poll(max(0.0, deadline - time.monotonic()), self.cfg.max_poll_records - len(records))
            if getattr(self.source, "rebalances", 0) != rebalances:
                # A rebalance happened while this batch gathered: what was gathered belongs to the old
                # assignment and is left, unprocessed and uncommitted, to the partitions' owners now.
                dropped += records
                records = []
                rebalances = self.source.rebalances
            if not more:
                break
            records += more
        owned = getattr(self.source, "owned", None)
        if owned is not None:  # Kafka: only partitions this member owns now (none mid-rebalance)
            dropped += [r for r in records if (r.topic, r.partition) not in owned]
            gone = {(r.topic, r.partition) for r in dropped}
            dropped += [r for r in records if (r.topic, r.partition) in gone and (r.topic, r.partition) in owned]
            records = [r for r in records if (r.topic, r.partition) not in gone]
        if dropped:  # read again from the first dropped record where this member still owns the partition
            self.source.rewind(dropped)
        valid: list[dict[str, Any]] = []
        origins: list[Origin] = []
        wheres: list[tuple[str, int, int]] = []
        redelivered: list[tuple[str, dict[str, Any], tuple[str, int, int]]] = []
        for rec in records:
            tp = (rec.topic, rec.partition)
            if rec.offset < self.offsets.get(tp, -1):
                continue  # already in the state checkpoint (redelivered after a crash)
            sample = self.pipeline.decode(rec.value, rec.where, self.dlq)
            if sample is not None:
                valid.append(sample)
                origins.append((rec.value, rec.where))
                wheres.append((*tp, rec.offset))
            redelivered += [(w, again, (*tp, rec.offset)) for w, again in self.pipeline.redelivered]
            self.pipeline.redelivered.clear()
        kept, feats = self.pipeline.featurize(valid, origins, self.dlq)
        submitted = []
        for i, f in zip(kept, feats):
            try:
                self._submit(valid[i], wheres[i])
            except Exception as e:  # noqa: BLE001 - a worker that cannot take a record dead-letters it alone
                self.pipeline.untrack(valid[i])
                self.pipeline.reject_sample(valid[i], origins[i], "worker_error", f"{type(e).__name__}: {e}", self.dlq)
                continue
            submitted.append((i, f))
        for worker, again, where in redelivered:
            with contextlib.suppress(Exception):  # already counted; its worker failing again is logged there
                self._submit(again, where, only=worker)
        self.pipeline.monitor([valid[i] for i, _ in submitted], [f for _, f in submitted],
                              [origins[i] for i, _ in submitted], self.dlq)
        # Offsets advance only now, past records that were processed or dead-lettered: an exception
        # above leaves them uncommitted (the final checkpoint of ``run`` commits what was done).
        for rec in records:
            tp = (rec.topic, rec.partition)
            self.consumed[tp] = rec.offset + 1
        if self.http is not None:
            self.http.heartbeat = time.monotonic()
        return len(records)

    def _export_counts(self, worker: str, counts: dict[Any, int], counter: Any, wanted: Callable[[Any], bool],
                       labels: Callable[[Any], tuple[str, ...]] = lambda k: (k,)) -> None:
        for key, n in list(counts.items()):
            if wanted(key):
                seen = self._reported.get((worker, *labels(key)), 0)
                if n > seen:
                    counter.labels(*labels(key)).inc(n - seen)
                    self._reported[(worker, *labels(key))] = n

    def checkpoint(self, export_lag: bool = True) -> None:
        """Flush outputs, persist state, then commit: the order that makes crashes harmless."""
        plan = self._prepare_checkpoint(export_lag)
        if plan is None:
            return
        offsets, tag = plan
        try:
            if offsets:
                if hasattr(self.source, "committed_metadata"):
                    self.source.commit(offsets, metadata=tag)
                else:
                    self.source.commit(offsets)
        except Exception:
            self._fatal = True  # see _on_revoke: the restart resumes from the last committed state
            raise
        self._finish_checkpoint()

    def _prepare_checkpoint(self, export_lag: bool) -> tuple[dict[tuple[str, int], int], str] | None:
        """Refresh gauges, flush the sinks and write the pending state; (offsets to commit, tag) or None."""
        if self._fatal:
            return None
        self.pipeline.refresh_gauges()
        # Counters follow the workers' own counts (the workers never touch metrics).
        if self.scorer is not None:
            self._export_counts("scorer", self.scorer.counts, self.metrics.conformance_skipped,
                                lambda k: k.startswith("skipped_"), lambda k: (k.removeprefix("skipped_"),))
        if self.replay is not None:
            self._export_counts("replay", self.replay.counts, self.metrics.replay_samples, lambda k: k != "submitted")
            self._export_counts("replay-skips", self.replay.skips, self.metrics.replay_skipped, bool, lambda k: k)
        for name, w in self.workers.items():
            self._export_counts(f"{name}-failures", w.failures, self.metrics.worker_failed, lambda k: True,
                                lambda k, name=name: (name, *k))
            self.metrics.baseline_up.labels(name).set(1 if w.up else 0)
        if export_lag:
            self._export_lag()
        floor = self.pipeline.pending_floor()
        commit = {tp: min(o, floor.get(tp, o)) for tp, o in self.consumed.items()}
        commit = {tp: o for tp, o in commit.items() if o > self.offsets.get(tp, -1)}
        if not commit and not self.pipeline.control_dirty:
            return None  # an ack / rebaseline with no new records still has to reach the state file
        if self.dlq is not None:
            self.dlq.flush()
        self.alerts.flush()
        self.offsets.update(commit)
        self.pipeline.control_dirty = False
        self._checkpoints += 1
        tag = f"quality-sidecar:{self._instance}:{self._checkpoints}"
        if self.cfg.state_path:  # pending -> commit -> rename: see _reconcile_pending_state
            save_state(f"{self.cfg.state_path}.pending", {
                "pipeline": self.pipeline.get_state(), "tag": tag,
                "offsets": [[t, p, o] for (t, p), o in self.offsets.items()]})
        return commit, tag

    def _finish_checkpoint(self) -> None:
        if self.cfg.state_path:
            os.replace(f"{self.cfg.state_path}.pending", self.cfg.state_path)

    def run(self) -> int:
        """Loop until SIGTERM/SIGINT, end of a file source, or ``max_samples`` (both finish the workers' queues
        first); 0 on clean exit."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.request_stop)
            signal.signal(signal.SIGINT, self.request_stop)
        bar = None
        if self.cfg.progress and hasattr(self.source, "total_bytes"):
            from tqdm import tqdm

            bar = tqdm(total=self.source.total_bytes, unit="B", unit_scale=True, desc="scoring samples",
                       file=None, dynamic_ncols=True)
        last = time.monotonic()
        try:
            while not self.stopping.is_set():
                self.step()
                if self.http is not None and not self.http.ready and self.source.ready:
                    self.http.ready = True
                if bar is not None:
                    bar.update(self.source.bytes_read - bar.n)
                    bar.set_postfix(samples=self.pipeline.counts["samples"], dlq=self.pipeline.counts["dlq"])
                if time.monotonic() - last >= self.cfg.commit_interval_s:
                    self.checkpoint()
                    last = time.monotonic()
                done = self.cfg.max_samples and self.pipeline.counts["samples"] >= self.cfg.max_samples
                if done or getattr(self.source, "eof", False):
                    for w in self.workers.values():  # the read samples are worked through before the final checkpoint
                        w.drain(None, self.stopping)
                    break
        finally:
            self.checkpoint()
            if bar is not None:
                bar.close()
            self.close()
        return 0

    def summary(self) -> dict[str, Any]:
        p = self.pipeline
        return {"counts": p.counts, "dlq_reasons": p.dlq_reasons, "alarms": p.alarm_log,
                "streams": {f"{m}/{a}": {"samples": s.samples, "rates": s.behaviour_rates()}
                            for (m, a), s in p.streams.items()},
                "config": asdict(self.cfg)}

    def close(self) -> None:
        for w in self.workers.values():
            w.close()
        if self.dlq is not None:
            self.dlq.close()
        self.alerts.close()
        self.source.close()
        if self.otlp is not None:
            self.otlp.shutdown()
        if self.http is not None:
            self.http.close()
