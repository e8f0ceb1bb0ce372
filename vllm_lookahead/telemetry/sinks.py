"""Sample sinks: Kafka (a lossy, low-latency side channel) and a JSONL file (the embedded default).

Sinks run only on the sampler's thread.  ``send`` never raises for delivery problems: it reports them
through the stats (sent / failed / dropped{backpressure,too_large}).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import KafkaAuth, SinkSpec
from .stats import SamplerStats

logger = logging.getLogger("vllm_lookahead.telemetry")


class Sink:
    def send(self, key: str, value: bytes) -> None:
        raise NotImplementedError

    def idle(self) -> bool:
        """Called when the queue has been empty for a while (flush buffered data, retry).  True:
        work is still pending, call again after the idle interval."""
        return False

    def close(self, timeout_s: float) -> None:
        raise NotImplementedError


class FileSink(Sink):
    """Append one JSON document per line, one unbuffered ``write()`` per sample on an ``O_APPEND``
    file: nothing sits in a user-space buffer (a crash or a fork cannot lose or duplicate lines) and
    several processes (API-server replicas) can share one file.  Opened lazily on the sampler thread."""

    def __init__(self, path: str, stats: SamplerStats):
        self.path = Path(path)
        self.stats = stats
        self._fh: Any = None

    def _open(self) -> Any:
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "ab", buffering=0)  # noqa: SIM115 (kept open for the process)
        return self._fh

    def send(self, key: str, value: bytes) -> None:
        try:
            self._open().write(value + b"\n")
            self.stats.sent += 1
        except OSError:
            self.stats.failed += 1
            logger.warning("sample file %s not writable", self.path, exc_info=True)

    def close(self, timeout_s: float) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


# Producer settings for a lossy, low-latency side channel (see docs/telemetry.md, "Kafka settings").
KAFKA_PRODUCER_SETTINGS: dict[str, Any] = {
    # Leader-only acknowledgement: one round trip, no ISR wait.  A sample lost in a leader failover is
    # acceptable; a slower, stronger ack buys nothing for a 1 % sample.  acks != all turns off
    # idempotence, so say so explicitly (kafka-python 3 would warn otherwise).
    "acks": 1,
    "enable_idempotence": False,
    # Batch for up to 50 ms: fewer, larger requests.  Only the sampler thread waits, never a request.
    "linger_ms": 50,
    "batch_size": 64 * 1024,
    # send() may block for metadata (first send to a topic, broker down): bound it; it blocks only the
    # sampler thread, whose queue then fills and drops (counted) instead of growing.
    "max_block_ms": 500,
    # Fail fast: a sample not delivered within 15 s is counted as failed, never retried forever.
    "request_timeout_ms": 5000,
    "delivery_timeout_ms": 15000,
    "retries": 3,
    "retry_backoff_ms": 200,
    "reconnect_backoff_ms": 200,
    "reconnect_backoff_max_ms": 5000,
    # Bounded start-up: the constructor gives up after 5 s when no broker answers.
    "bootstrap_timeout_ms": 5000,
    # Ordering between samples does not matter (each is keyed by its own request id).
    "max_in_flight_requests_per_connection": 5,
    "max_request_size": 1024 * 1024,
}


@dataclass(slots=True)
class _Pending:
    """A sample waiting for its topic's metadata (or a leader): retried until ``deadline``."""

    key: bytes
    value: bytes
    deadline: float  # time.monotonic(): first attempt + the delivery timeout


def _retriable(exc: BaseException) -> bool:
    """kafka-python marks transient errors ``retriable``: metadata not ready (KafkaTimeoutError from
    send()), UNKNOWN_TOPIC_OR_PARTITION and LEADER_NOT_AVAILABLE while a topic is being created,
    NOT_LEADER during a fail-over."""
    return bool(getattr(exc, "retriable", False))


class KafkaSink(Sink):
    """kafka-python 3.x producer owned by the sampler thread (created there: not fork-safe).

    kafka-python 3 has no ``buffer_memory``: the records buffered inside the client are bounded here
    (``max_in_flight`` unacknowledged or pending samples; beyond it new samples are dropped as
    backpressure).

    A retriable failure (the first send to a topic that is being auto-created or not created yet:
    metadata not ready, UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE) is logged and the sample is
    kept and retried every ``retry_backoff_s`` on the sampler thread until ``delivery_timeout_s`` after
    its first attempt; only then is it counted ``failed``.  While samples wait, new ones queue behind
    them instead of each blocking ``max_block_ms`` on metadata.  The request path is never involved.
    """

    def __init__(self, spec: SinkSpec, auth: KafkaAuth, stats: SamplerStats,
                 compression: str | None = "gzip", max_in_flight: int = 2048,
                 retry_after_s: float = 5.0, retry_backoff_s: float = 0.5,
                 delivery_timeout_s: float | None = None):
        self.spec = spec
        self.auth = auth
        self.stats = stats
        self.compression = compression
        self.max_in_flight = max_in_flight
        self.retry_after_s = retry_after_s
        self.retry_backoff_s = retry_backoff_s
        self.delivery_timeout_s = (KAFKA_PRODUCER_SETTINGS["delivery_timeout_ms"] / 1000.0
                                   if delivery_timeout_s is None else delivery_timeout_s)
        self._producer: Any = None
        self._next_attempt = 0.0
        self._in_flight = 0
        self._lock = threading.Lock()  # callbacks run on kafka-python's IO thread
        self._pending: deque[_Pending] = deque()  # appended by both threads, drained by the sampler
        self._next_retry = 0.0
        self._last_log: dict[str, float] = {}
        self._closed = False

    def _make_producer(self) -> Any:
        from kafka import KafkaProducer

        return KafkaProducer(
            bootstrap_servers=list(self.spec.bootstrap),
            client_id=f"vllm-lookahead-sampler-{os.getpid()}",
            compression_type=self.compression,
            **KAFKA_PRODUCER_SETTINGS,
            **self.auth.producer_kwargs(),
        )

    def _producer_or_none(self) -> Any:
        if self._producer is None and time.monotonic() >= self._next_attempt:
            try:
                self._producer = self._make_producer()
            except Exception:  # noqa: BLE001 (no broker yet: retry later, count the samples as failed)
                self._next_attempt = time.monotonic() + self.retry_after_s
                logger.warning("Kafka %s unreachable; samples fail until it answers (retry in %.0f s)",
                               ",".join(self.spec.bootstrap), self.retry_after_s)
        return self._producer

    def _log(self, what: str, msg: str, *args: Any) -> None:
        """Warning, at most one per ``what`` every 30 s (a dead topic must not flood the log)."""
        now = time.monotonic()
        if now - self._last_log.get(what, -1e9) >= 30.0:
            self._last_log[what] = now
            logger.warning(msg, *args)

    def _delivered(self) -> None:
        # runs on kafka-python's IO thread; counters are also updated on the sampler thread: lock
        with self._lock:
            if self._closed:  # already counted as dropped{shutdown} by close()
                return
            self._in_flight -= 1
            self.stats.sent += 1

    def _delivery_failed(self, item: _Pending, exc: BaseException) -> None:
        # IO thread, or the sampler thread when send() returns an already-failed future
        with self._lock:
            if self._closed:
                return
            self._in_flight -= 1
        self._retry_or_fail(item, exc)

    def _failed(self) -> None:
        with self._lock:
            self.stats.failed += 1

    def _retry_or_fail(self, item: _Pending, exc: BaseException) -> bool:
        """Keep ``item`` for a retry when the error is transient and its deadline is not reached
        (True), else count it failed (False).  Both are logged."""
        topic = self.spec.topic
        now = time.monotonic()
        if _retriable(exc) and now < item.deadline and not self._closed:
            self._pending.append(item)
            self._next_retry = now + self.retry_backoff_s
            self._log("retry", "Kafka topic %s not ready (%s: %s; e.g. a topic still being created); "
                      "samples are kept and retried for up to %.0f s", topic, type(exc).__name__, exc,
                      self.delivery_timeout_s)
            return True
        self._failed()
        self._log("failed", "Kafka sample to topic %s failed (%s: %s); counted in "
                  "vllm_lookahead_sampler_failed_total", topic, type(exc).__name__, exc)
        return False

    def _send_now(self, item: _Pending) -> bool:
        """One attempt; False when send() raised a transient error and the sample went back to the
        retry queue.  (A failure reported through the future may also requeue it.)"""
        producer = self._producer_or_none()
        if producer is None:
            self._failed()
            return True
        try:
            future = producer.send(self.spec.topic, key=item.key, value=item.value)
        except Exception as exc:  # noqa: BLE001 (KafkaTimeoutError on metadata, closed producer, ...)
            return not self._retry_or_fail(item, exc)
        with self._lock:
            self._in_flight += 1
        future.add_callback(lambda _md: self._delivered())
        future.add_errback(lambda exc: self._delivery_failed(item, exc))
        return True

    def _retry_due(self, force: bool = False) -> None:
        """Retry waiting samples (oldest first) once their back-off has passed; sampler thread."""
        start = time.monotonic()
        if not self._pending or (not force and start < self._next_retry):
            return
        for _ in range(len(self._pending)):
            try:
                item = self._pending.popleft()
            except IndexError:
                return
            if not self._send_now(item) or self._next_retry > start:
                return  # still not ready: back off (the rest waits for the next round)

    def send(self, key: str, value: bytes) -> None:
        if len(value) > KAFKA_PRODUCER_SETTINGS["max_request_size"] - 512:
            self.stats.dropped["too_large"] += 1
            return
        if self._in_flight + len(self._pending) >= self.max_in_flight:
            self.stats.dropped["backpressure"] += 1
            return
        self._retry_due()
        item = _Pending(key.encode("utf-8"), value, time.monotonic() + self.delivery_timeout_s)
        if self._pending:  # the topic is not ready: wait behind the others, do not block on metadata
            self._pending.append(item)
            return
        self._send_now(item)

    def idle(self) -> bool:
        self._retry_due()
        # keep being called while deliveries are outstanding: a failed one may come back for a retry
        return bool(self._pending) or self._in_flight > 0

    @property
    def pending(self) -> int:
        """Samples waiting for a retry (topic metadata or leader not ready)."""
        return len(self._pending)

    def close(self, timeout_s: float) -> None:
        deadline = time.monotonic() + max(0.1, timeout_s)
        while self._pending and self._producer is not None and time.monotonic() < deadline:
            self._retry_due(force=True)
            if self._pending:
                time.sleep(min(self.retry_backoff_s, max(0.0, deadline - time.monotonic())))
        producer, self._producer = self._producer, None
        if producer is not None:
            # A flush timeout is not an error here: what is still in flight is lost and counted below.
            with contextlib.suppress(Exception):
                producer.flush(timeout=max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(Exception):
                producer.close(timeout=0.5)
        with self._lock:
            self._closed = True
            lost, self._in_flight = self._in_flight, 0
            lost += len(self._pending)
            self._pending.clear()
        if lost > 0:
            self.stats.dropped["shutdown"] += lost
            logger.warning("Kafka sink closed with %d sample(s) undelivered (counted as dropped, "
                           "reason shutdown)", lost)


def make_sink(spec: SinkSpec, auth: KafkaAuth, stats: SamplerStats, compression: str | None) -> Sink:
    if spec.kind == "kafka":
        return KafkaSink(spec, auth, stats, compression=compression)
    return FileSink(spec.path, stats)
