"""Where samples come from: ``file://samples.jsonl`` or ``kafka://HOST:PORT/TOPIC``.

A source yields ``Record`` batches from ``poll()`` and makes progress durable with ``commit()``,
which the service calls only after the batch's results (metrics state, DLQ records, alerts) are
flushed: at-least-once delivery, with duplicates removed by the state's offsets and request-id
window (see service.py).
"""

from __future__ import annotations

from .record import Record


def open_source(url: str, group: str = "quality-sidecar", **kw):
    if url.startswith("kafka://"):
        from .kafka import KafkaSource

        return KafkaSource(url, group, **kw)
    if url.startswith("file://"):
        from .file import FileSource

        return FileSource(url[len("file://"):])
    raise ValueError(f"bad --source {url!r}: expected kafka://HOST:PORT/TOPIC or file://PATH.jsonl")


__all__ = ["Record", "open_source"]
