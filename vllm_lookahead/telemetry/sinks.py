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
from pathlib import Path
from typing import Any

from .config import KafkaAuth, SinkSpec
from .stats import SamplerStats

logger = logging.getLogger("vllm_lookahead.telemetry")


class Sink:
    def send(self, key: str, value: bytes) -> None:
        raise NotImplementedError

    def idle(self) -> None:
        """Called when the queue has been empty for a while (flush buffered data)."""

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


class KafkaSink(Sink):
    """kafka-python 3.x producer owned by the sampler thread (created there: not fork-safe).

    kafka-python 3 has no ``buffer_memory``: the records buffered inside the client are bounded here
    (``max_in_flight`` unacknowledged samples; beyond it new samples are dropped as backpressure).
    """

    def __init__(self, spec: SinkSpec, auth: KafkaAuth, stats: SamplerStats,
                 compression: str | None = "gzip", max_in_flight: int = 2048,
                 retry_after_s: float = 5.0):
        self.spec = spec
        self.auth = auth
        self.stats = stats
        self.compression = compression
        self.max_in_flight = max_in_flight
        self.retry_after_s = retry_after_s
        self._producer: Any = None
        self._next_attempt = 0.0
        self._in_flight = 0
        self._lock = threading.Lock()  # callbacks run on kafka-python's IO thread

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

    def _done(self, ok: bool) -> None:
        # runs on kafka-python's IO thread; `failed` is also counted on the sampler thread: lock
        with self._lock:
            self._in_flight -= 1
            if ok:
                self.stats.sent += 1
            else:
                self.stats.failed += 1

    def _failed(self) -> None:
        with self._lock:
            self.stats.failed += 1

    def send(self, key: str, value: bytes) -> None:
        if len(value) > KAFKA_PRODUCER_SETTINGS["max_request_size"] - 512:
            self.stats.dropped["too_large"] += 1
            return
        if self._in_flight >= self.max_in_flight:
            self.stats.dropped["backpressure"] += 1
            return
        producer = self._producer_or_none()
        if producer is None:
            self._failed()
            return
        try:
            future = producer.send(self.spec.topic, key=key.encode("utf-8"), value=value)
        except Exception:  # noqa: BLE001 (KafkaTimeoutError on metadata, closed producer, ...)
            self._failed()
            return
        with self._lock:
            self._in_flight += 1
        future.add_callback(lambda _md: self._done(True))
        future.add_errback(lambda _exc: self._done(False))

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def close(self, timeout_s: float) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        # A flush timeout is not an error here: what is still in flight is lost and counted below.
        with contextlib.suppress(Exception):
            producer.flush(timeout=max(0.1, timeout_s))
        with contextlib.suppress(Exception):
            producer.close(timeout=0.5)
        with self._lock:
            lost, self._in_flight = self._in_flight, 0
        if lost > 0:
            self.stats.dropped["shutdown"] += lost


def make_sink(spec: SinkSpec, auth: KafkaAuth, stats: SamplerStats, compression: str | None) -> Sink:
    if spec.kind == "kafka":
        return KafkaSink(spec, auth, stats, compression=compression)
    return FileSink(spec.path, stats)
