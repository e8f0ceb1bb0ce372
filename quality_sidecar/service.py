"""The sidecar loop: poll -> decode/validate (bad -> DLQ) -> dedupe -> classify -> detect -> export.

Delivery: at-least-once from the source, exactly-once in the counts when ``state_path`` is set.
Every checkpoint (each ``commit_interval_s``) flushes the DLQ and alert writers, atomically writes
the state (per-partition next offsets, the request-id dedupe window, counters, detector states) and
only then commits the offsets to Kafka.  After a crash the restarted sidecar loads the state, skips
redelivered records below the saved offsets and drops request ids it has already seen - so nothing
is lost (uncommitted records are redelivered) and nothing is counted twice.

Baseline-server workers (T>0 scorer, T=0 replay): a sample handed to one is *pending* until the
worker is done with it; offsets are committed only below the oldest pending sample, and the
checkpoint lists the pending request ids, so after a crash those records go to their worker again
(their other counts are already in the state).  While a worker is behind, the source is paused
(``_backpressure``).  The per-record work is the pipeline's (pipeline.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .config import ServiceConfig
from .detectors.base import OLD_STATE_ADVICE
from .pipeline import Origin, Pipeline
from .sinks import AlertSink, JsonWriter, Metrics
from .sources import Source, open_source

log = logging.getLogger("quality_sidecar")

__all__ = ["Service", "ServiceConfig", "save_state"]


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
        self.source: Source = open_source(cfg.source, cfg.group, cfg.max_poll_records)
        self._instance = f"{os.getpid()}-{time.time_ns() % 10**12}"
        self._checkpoints = 0
        self._fatal = False  # a commit failed: no more checkpoints (they would count uncommitted records)
        self._lag_labels: set[tuple[str, ...]] = set()
        self.workers: dict = {}
        try:
            self._resume(cfg.state_path)
        except BaseException:  # a refused state file must not leave the port, the consumer or the exporter open
            self.close()
            raise
        self.source.on_revoke = self._on_revoke
        self.source.restore(self.offsets)
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

    def _resume(self, state_path: str | None) -> None:
        """Load the checkpoint (detector states and offsets), if there is one."""
        if not state_path:
            return
        self._reconcile_pending_state(state_path)
        if not Path(state_path).exists():
            return
        st = json.loads(Path(state_path).read_text())
        try:
            self.pipeline.set_state(st["pipeline"])
            self.offsets = {(t, int(p)): o for t, p, o in st["offsets"]}
        except KeyError as e:  # detector states say their own version (StatefulDetector.set_state)
            raise ValueError(f"state file {state_path} lacks {e} (written by an older sidecar); "
                             f"{OLD_STATE_ADVICE}") from None
        log.info("resumed from %s: %d samples, %d offsets", state_path, self.pipeline.counts["samples"],
                 len(self.offsets))

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
        metadata = self.source.committed_metadata(tps) if tps else {}
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
        who = self.source.member()
        current: set[tuple[str, ...]] = set()
        for r in self.source.lag_report() if who is not None else []:
            labels = (self.cfg.kafka_cluster_name or who.bootstrap, who.group, r.topic, str(r.partition), who.host,
                      who.consumer_id, who.client_id)
            current.add(labels)
            m.group_offset.labels(*labels).set(r.committed)
            m.group_lag.labels(*labels).set(r.lag)
            m.group_lag_seconds.labels(*labels).set(r.lag_seconds)
            m.partition_latest_offset.labels(labels[0], r.topic, str(r.partition)).set(r.end)
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
        if behind:
            self.source.pause()
        else:
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
        records = self.source.poll(timeout_s, self.cfg.max_poll_records)
        # Micro-batching: a live topic hands out a few records per poll, and each batch has a fixed
        # cost (vectoriser, chart updates) of a few ms; gather up to ``batch_linger_s`` more.
        deadline = time.monotonic() + self.cfg.batch_linger_s
        rebalances = self.source.rebalances
        dropped: list = []
        while records and len(records) < self.cfg.max_poll_records and time.monotonic() < deadline:
            more = self.source.poll(max(0.0, deadline - time.monotonic()), self.cfg.max_poll_records - len(records))
            if self.source.rebalances != rebalances:
                # A rebalance happened while this batch gathered: what was gathered belongs to the old
                # assignment and is left, unprocessed and uncommitted, to the partitions' owners now.
                dropped += records
                records = []
                rebalances = self.source.rebalances
            if not more:
                break
            records += more
        # only partitions this member owns now (Kafka: none mid-rebalance); a partition with a
        # dropped record is dropped from it on, so that it is read again in order
        dropped += [r for r in records if not self.source.owns((r.topic, r.partition))]
        gone = {(r.topic, r.partition) for r in dropped}
        dropped += [r for r in records if (r.topic, r.partition) in gone and self.source.owns((r.topic, r.partition))]
        records = [r for r in records if (r.topic, r.partition) not in gone]
        if dropped:  # read again from the first dropped record where this member still owns the partition
            self.source.rewind(dropped)
        if not records:  # (paused, idle or all dropped)
            if self.http is not None:
                self.http.heartbeat = time.monotonic()
            return 0
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

    def _export_counts(self, worker: str, counts: dict[Any, int], counter: Any,
                       labels: Callable[[Any], tuple[str, ...]] = lambda k: k) -> None:
        """Counters follow the workers' own counts (the workers never touch metrics)."""
        for key, n in list(counts.items()):
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
                self.source.commit(offsets, metadata=tag)
        except Exception:
            self._fatal = True  # see _on_revoke: the restart resumes from the last committed state
            raise
        self._finish_checkpoint()

    def _prepare_checkpoint(self, export_lag: bool) -> tuple[dict[tuple[str, int], int], str] | None:
        """Refresh gauges, flush the sinks and write the pending state; (offsets to commit, tag) or None."""
        if self._fatal:
            return None
        self.pipeline.refresh_gauges()
        if self.scorer is not None:
            self._export_counts("scorer-skips", self.scorer.skips, self.metrics.conformance_skipped)
        if self.replay is not None:
            outcomes = {k: n for k, n in list(self.replay.counts.items()) if k != "submitted"}
            self._export_counts("replay", outcomes, self.metrics.replay_samples, lambda k: (k,))
            self._export_counts("replay-skips", self.replay.skips, self.metrics.replay_skipped)
        for name, w in self.workers.items():
            self._export_counts(f"{name}-failures", w.failures, self.metrics.worker_failed,
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
        progress = self.source.progress() if self.cfg.progress else None
        if progress is not None:
            from tqdm import tqdm

            bar = tqdm(total=progress[1], unit="B", unit_scale=True, desc="scoring samples", dynamic_ncols=True)
        last = time.monotonic()
        try:
            while not self.stopping.is_set():
                self.step()
                if self.http is not None and not self.http.ready and self.source.ready:
                    self.http.ready = True
                if bar is not None and (progress := self.source.progress()) is not None:
                    bar.update(progress[0] - bar.n)
                    bar.set_postfix(samples=self.pipeline.counts["samples"], dlq=self.pipeline.counts["dlq"])
                if time.monotonic() - last >= self.cfg.commit_interval_s:
                    self.checkpoint()
                    last = time.monotonic()
                done = self.cfg.max_samples and self.pipeline.counts["samples"] >= self.cfg.max_samples
                if done or self.source.eof:
                    for w in self.workers.values():  # the read samples are worked through before the final checkpoint
                        w.drain(None, self.stopping)
                    break
        finally:
            self.checkpoint()
            if bar is not None:
                bar.close()
            self.close()
        return 0

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
