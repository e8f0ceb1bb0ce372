"""The pipeline: everything between a source's records and the sinks, usable offline (``process``)
and inside the service's loop (service.py: ``decode`` each record, ``featurize`` and ``monitor`` the batch).

decode (bad -> DLQ) -> dedupe -> featurize: extract features and run every classifier (a record
they fail on -> DLQ) -> monitor: the charts (charts.py; a record a chart fails on -> DLQ) -> alarms:
metrics and the alert sink, each with its catalogue text (alarms.py).  The baseline-server workers
call back into it (``add_replay_pair``, ``add_conformance``, ``worker_failed``) from their threads,
hence the lock; ``pending`` holds what they have not finished (service.py's delivery notes).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .alarms import describe
from .baseline_scoring import draft_positions, scorable
from .charts import Charts
from .classifiers import classify_batch, default_classifiers
from .classifiers.format import FormatClassifier
from .config import ServiceConfig
from .conformance_monitor import ConformanceMonitor
from .detectors.embedders import make_embedder
from .detectors.exact_checks import exact_checks, exposure
from .detectors.repeats import repeat_keys
from .features import Features, extract
from .monitor import UNSCORED, Alarm
from .sinks import AlertSink, JsonWriter, Metrics, dlq_record
from .validate import sample_errors

log = logging.getLogger("quality_sidecar")

Origin = tuple[bytes, dict[str, Any]]  # a record's raw bytes and where it came from (the DLQ keeps both)


class Pipeline:
    """Everything except the source: usable offline (``process``) and inside the loop."""

    def __init__(self, cfg: ServiceConfig, metrics: Metrics | None = None, alerts: AlertSink | None = None):
        self.cfg = cfg
        self.metrics = metrics or Metrics()
        self.alerts = alerts
        clfs = default_classifiers(cfg.safety_backend)
        self.classifiers = [FormatClassifier(code_fraction=cfg.format_code_fraction)
                            if c.name == "format_invalid" else c for c in clfs]
        if cfg.monitor.text_test:  # load (and check) the text embedder now, not at the first window
            make_embedder(cfg.monitor.text_embedder)
        self.charts = Charts(cfg)  # stream charts, arm comparisons, pair tables, conformance, repeats
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
            self.charts.reference.setdefault((f.model, f.arm), []).append(f)
            self.charts.reference.setdefault((f.model, "*"), []).append(f)

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
                alarms += guarded("impossible_tokens", [i], self._check_exact, smp)
            groups: dict[tuple[str, str], list[int]] = {}
            for i, f in enumerate(feats):
                if i not in dead:
                    groups.setdefault((f.model, f.arm), []).append(i)
            for (model, arm), idx in groups.items():
                fs = [feats[i] for i in idx]
                alarms += guarded("stream", idx, self.charts.stream(model, arm).update, fs)
                alarms += guarded("arm_comparison", idx, self.charts.comparison(model).update, arm, fs)
                alarms += guarded("exact_match", idx, self.charts.pair_table(model).add, fs)
                n = sum(i not in dead for i in idx)
                if n:
                    self.metrics.samples.labels(model, arm).inc(n)
            self.counts["samples"] += len(samples) - len(dead)
            self._emit(alarms)
        return alarms

    def _add_repeat(self, smp: dict[str, Any]) -> list[Alarm]:
        keys = repeat_keys(smp)
        if keys is None:
            return []
        model, arm = smp["model"], smp["deployment"]["arm"]
        chart = self.charts.repeat_chart(model)
        r = chart.update(arm, *keys)
        if not r.alarm_new:
            return []
        # The match that fired may complete on a baseline sample: the alarm is the candidate's.
        return [Alarm("repeated_samples", model, r.extra["arm"], r, [smp["trace_id"]] if smp.get("trace_id") else [],
                      [smp["request_id"]])]

    def _check_exact(self, smp: dict[str, Any]) -> list[Alarm]:
        """The exact checks (``exact_checks``), at any temperature: an EOS / stop token inside
        ``min_tokens``, a token outside ``allowed_token_ids`` or one that completes a bad word is an
        impossible token, counted on the model's impossible-token chart under the check's name, the
        sample's output positions as its exposure (once, whatever the number of checks).  A check the
        sample's record cannot support is counted per (model, arm, check, reason)."""
        done, skipped = exact_checks(smp)
        model, arm = smp["model"], smp["deployment"]["arm"]
        for check, why in skipped.items():
            self.metrics.exact_check_skipped.labels(model, arm, check, why).inc()
        if not done:
            return []
        mon = self.charts.conformance_monitor(model)
        checked, reasons = exposure(done)
        r = mon.add_impossible(arm, checked, reasons, smp.get("trace_id"), smp["request_id"])
        for check, bad in reasons.items():
            if bad:
                self.metrics.impossible.labels(model, arm, check).inc(bad)
        return self._impossible_alarms(mon, model, arm, r)

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
                self._emit(self.charts.comparison(sample["model"]).scorer_finished(sample["deployment"]["arm"], True))
            if reason == "rejected_token_ids" and sampled:
                mon = self.charts.conformance_monitor(sample["model"])
                n = len((sample.get("output") or {}).get("token_ids") or [])
                arm = sample["deployment"]["arm"]
                r = mon.add_impossible(arm, n, {"vocab": 1}, sample.get("trace_id"), sample["request_id"])
                self.metrics.impossible.labels(sample["model"], arm, "vocab").inc()
                self._emit(self._impossible_alarms(mon, sample["model"], arm, r))

    @staticmethod
    def _impossible_alarms(mon: ConformanceMonitor, model: str, arm: str, r: Any) -> list[Alarm]:
        """The impossible-token chart's new alarm (with its example traces), if this update raised one."""
        if not r.alarm_new:
            return []
        return [Alarm.with_examples("impossible_tokens", model, arm, r, mon.impossible_examples.get(arm, []))]

    def add_replay_pair(self, sample: dict[str, Any], baseline: dict[str, Any]) -> None:
        """Callback of the replay worker: pair a greedy or seeded T>0 output with the baseline server's
        answer (pair source ``replay`` or ``seeded``).

        A candidate sample gives a test pair; a baseline-arm sample gives an A/A pair: the measured
        mismatch rate the candidate's is tested against (no A/A pairs, no verdict)."""
        cand = sample["output"].get("token_ids")
        base = baseline.get("token_ids")
        if cand is None or base is None:
            cand, base = sample["output"].get("text"), baseline.get("text")
        with self._lock:
            self.pending.pop(sample["request_id"], None)
            pt = self.charts.pair_table(sample["model"])
            source = "seeded" if (sample.get("sampling") or {}).get("temperature") else "replay"
            self._emit(pt.add_replay(sample["deployment"]["arm"], cand, base, sample.get("trace_id"),
                                     sample["request_id"], source))

    def add_conformance(self, sample: dict[str, Any], score: Any) -> None:
        """Callback of the conformance scorer: one T>0 sample scored under the baseline model."""
        model, arm = sample["model"], sample["deployment"]["arm"]
        with self._lock:
            self.pending.pop(sample["request_id"], None)
            self._emit(self.charts.comparison(model).scorer_finished(arm, False))
            mon = self.charts.conformance_monitor(model)
            r, ri = mon.add(arm, score, sample.get("trace_id"), sample["request_id"], draft_positions(sample))
            self.metrics.conformance_scored.labels(model, arm).inc()
            self.metrics.conformance_tokens.labels(model, arm).inc(score.n_tokens)
            for reason, n in score.oos_reasons.items():
                self.metrics.impossible.labels(model, arm, reason).inc(n)
            self._emit(self._impossible_alarms(mon, model, arm, ri))
            if r.alarm_new:
                self._emit([Alarm.with_examples("sampling_conformance", model, arm, r, mon.examples.get(arm, []))])

    def _emit(self, alarms: list[Alarm]) -> None:
        for a in alarms:
            r = a.result
            text = describe(a.detector)
            event = {"type": "quality_sidecar.alert", "detector": a.detector, "model": a.model, "arm": a.arm,
                     "statistic": r.statistic, "threshold": r.threshold, "pvalue": r.pvalue,
                     "samples_since_fit": r.n, "time_unix_s": time.time(), "meaning": text.meaning,
                     "action": text.action,
                     "ert_samples_per_detector": self.cfg.monitor.ert_each,
                     "example_trace_ids": a.trace_ids, "example_request_ids": a.request_ids,
                     "detail": {k: v for k, v in r.extra.items() if isinstance(v, (int, float, str, list))}}
            self.alarm_log.append(event)
            self.metrics.alarms.labels(a.detector, a.model, a.arm).inc()
            if self.alerts is not None:
                self.alerts.emit(event)

    def refresh_gauges(self) -> None:
        with self._lock:
            self.charts.refresh_gauges(self.metrics)

    # --- alarm life cycle: list, acknowledge, clear, re-baseline ------------------------------------
    def active_alarms(self) -> list[dict[str, Any]]:
        """Every latched alarm (all detector kinds), as JSON-safe dicts (``GET /alarms``)."""
        with self._lock:
            return self.charts.active_alarms()

    def acknowledge(self, detector: str | None = None, model: str | None = None, arm: str | None = None,
                    by: str | None = None) -> list[dict[str, str]]:
        """Acknowledge latched alarms matching (detector, model, arm); ``None`` matches all.

        The statistic of each acknowledged detector restarts, so a regression that persists fires
        again after the detector's normal delay. The result is in the detector state (persisted at
        the next checkpoint), and an ``quality_sidecar.ack`` event goes to the log and the alert sink.
        """
        with self._lock:
            done = self.charts.acknowledge(detector, model, arm)
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
        with self._lock:
            done = self.charts.rebaseline(model, arm)
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
                    **self.charts.get_state(),
                    "pending": {rid: w for rid, (w, *_where) in self.pending.items()},
                    "alarms": self.alarm_log[-100:], "control": self.control_log[-100:]}

    def set_state(self, st: dict[str, Any]) -> None:
        self.counts.update(st["counts"])
        self.dlq_reasons.update(st["dlq_reasons"])
        for r, n in self.dlq_reasons.items():
            self.metrics.dlq.labels(r).inc(n)
        self.seen = OrderedDict.fromkeys(st["seen"])
        self.rework = dict(st["pending"])
        self.alarm_log = st["alarms"]
        self.charts.set_state(st)
        for (model, arm), mon in self.charts.streams.items():
            self.metrics.samples.labels(model, arm).inc(mon.samples)
        self.control_log = st["control"]
        self.refresh_gauges()  # alarm gauges say 1 for a latched alarm right after the restart
