"""Dead-letter queue and alert events: JSON records to a file, a Kafka topic, a log, a webhook.

Both writers are *flushed before the consumer commits*, so a message is never committed before its
DLQ record / alert is durable (at-least-once end to end).
"""

from __future__ import annotations

import base64
import json
import logging
import time
from pathlib import Path
from typing import Any

from .kafka_common import kafka_auth, parse_kafka_url

log = logging.getLogger("quality_sidecar.alerts")


class JsonWriter:
    """Append JSON records to ``file://PATH`` or produce them to ``kafka://HOST:PORT/TOPIC``."""

    def __init__(self, url: str):
        self.url = url
        self.producer = None
        self.fh = None
        if url.startswith("kafka://"):
            from kafka import KafkaProducer

            bootstrap, self.topic = parse_kafka_url(url)
            self.producer = KafkaProducer(bootstrap_servers=bootstrap.split(","), acks="all", linger_ms=50,
                                          batch_size=512 * 1024,
                                          **kafka_auth())
        elif url.startswith("file://"):
            path = Path(url[len("file://"):])
            path.parent.mkdir(parents=True, exist_ok=True)
            self.fh = path.open("a", encoding="utf-8")
        else:
            raise ValueError(f"bad sink URL {url!r}: expected kafka://HOST:PORT/TOPIC or file:///path.jsonl")

    def write(self, record: dict[str, Any], key: str | None = None) -> None:
        data = json.dumps(record, sort_keys=True, default=str)
        if self.producer is not None:
            self.producer.send(self.topic, key=key.encode() if key else None, value=data.encode())
        elif self.fh is not None:
            self.fh.write(data + "\n")

    def flush(self) -> None:
        if self.producer is not None:
            self.producer.flush(30)
        elif self.fh is not None:
            self.fh.flush()

    def close(self) -> None:
        self.flush()
        if self.producer is not None:
            self.producer.close(10)
        if self.fh is not None:
            self.fh.close()


def dlq_record(raw: bytes, reason: str, where: dict[str, Any]) -> dict[str, Any]:
    """The DLQ payload: why, where it came from, and the original bytes (text when decodable)."""
    try:
        text, b64 = raw.decode("utf-8"), None
    except UnicodeDecodeError:
        text, b64 = None, base64.b64encode(raw).decode()
    return {"reason": reason, "source": where, "dlq_unix_s": time.time(), "value": text, "value_b64": b64}


class AlertSink:
    """Alert events to the log, an optional Kafka/file topic and an optional webhook."""

    def __init__(self, url: str | None = None, webhook: str | None = None):
        self.writer = JsonWriter(url) if url else None
        self.webhook = webhook
        self.sent = 0

    def emit(self, event: dict[str, Any]) -> None:
        """Send an alert, or a control event (``quality_sidecar.ack`` / ``.rebaseline``, logged by the
        pipeline) so that consumers of the alert topic also see who acknowledged what."""
        self.sent += 1
        if event.get("type", "quality_sidecar.alert") == "quality_sidecar.alert":
            log.warning("ALERT %s model=%s arm=%s statistic=%.4g threshold=%.4g traces=%s", event["detector"],
                        event["model"], event["arm"], event["statistic"], event["threshold"],
                        ",".join(event.get("example_trace_ids", [])[:3]))
            key = f"{event['model']}/{event['detector']}"
        else:
            key = f"{event.get('model') or '*'}/{event['type']}"
        if self.writer:
            self.writer.write(event, key=key)
        if self.webhook:
            try:
                import requests

                requests.post(self.webhook, json=event, timeout=5)
            except Exception as e:  # noqa: BLE001 (a webhook outage must not stop monitoring)
                log.error("alert webhook failed: %s", e)

    def flush(self) -> None:
        if self.writer:
            self.writer.flush()

    def close(self) -> None:
        if self.writer:
            self.writer.close()
