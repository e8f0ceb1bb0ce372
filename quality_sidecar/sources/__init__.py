"""Where samples come from: ``file://samples.jsonl`` or ``kafka://HOST:PORT/TOPIC``.

A source (the ``Source`` protocol, base.py) yields ``Record`` batches from ``poll()`` and makes
progress durable with ``commit()``, which the service calls only after the batch's results (metrics
state, DLQ records, alerts) are flushed: at-least-once delivery, with duplicates removed by the
state's offsets and request-id window (see service.py).  ``open_source`` maps a URL's scheme to its
implementation; the service never looks at the URL.
"""

from __future__ import annotations

from collections.abc import Callable

from .base import Source
from .record import Record


def _file(url: str, group: str, max_poll_records: int) -> Source:
    from .file import FileSource

    return FileSource(url[len("file://"):], batch=max_poll_records)


def _kafka(url: str, group: str, max_poll_records: int) -> Source:
    from .kafka import KafkaSource

    return KafkaSource(url, group, max_poll_records=max_poll_records)


# URL scheme -> (url, consumer group, max records per poll) -> source; the modules load on use
# (kafka-python only for a Kafka source)
OPENERS: dict[str, Callable[[str, str, int], Source]] = {"file": _file, "kafka": _kafka}


def open_source(url: str, group: str = "quality-sidecar", max_poll_records: int = 500) -> Source:
    scheme, sep, _rest = url.partition("://")
    opener = OPENERS.get(scheme) if sep else None
    if opener is None:
        raise ValueError(f"bad --source {url!r}: expected kafka://HOST:PORT/TOPIC or file://PATH.jsonl")
    return opener(url, group, max_poll_records)


__all__ = ["OPENERS", "Record", "Source", "open_source"]
