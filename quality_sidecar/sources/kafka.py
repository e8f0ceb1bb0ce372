"""Kafka consumer-group source: manual commits, bounded polls, lag per partition.

``enable_auto_commit=False``: offsets are committed by the service after a batch is processed and
its outputs flushed.  ``max_poll_records`` bounds memory (backpressure: unread messages stay in
Kafka, and the lag gauge shows it).  The 10 s session timeout moves a killed member's partitions
to its replacement within ~10 s; shorter timeouts got healthy members evicted on a loaded machine
(missed heartbeats while calibrating), which stalls consumption in rebalance loops.
"""

from __future__ import annotations

from ..sinks.kafka_common import kafka_auth, parse_kafka_url
from . import Record


class KafkaSource:
    def __init__(self, url: str, group: str, max_poll_records: int = 500, session_timeout_ms: int = 10000):
        from kafka import KafkaConsumer

        bootstrap, self.topic = parse_kafka_url(url)
        self.consumer = KafkaConsumer(
            self.topic, bootstrap_servers=bootstrap.split(","), group_id=group, enable_auto_commit=False,
            auto_offset_reset="earliest", max_poll_records=max_poll_records,
            session_timeout_ms=session_timeout_ms, heartbeat_interval_ms=1000,
            max_partition_fetch_bytes=8 * 1024 * 1024, **kafka_auth())
        self.eof = False
        self._last: dict[tuple[str, int], int] = {}

    def poll(self, timeout_s: float = 0.5, max_records: int | None = None) -> list[Record]:
        batches = self.consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        out = []
        for tp, msgs in batches.items():
            for m in msgs:
                out.append(Record(m.value or b"", m.key, tp.topic, tp.partition, m.offset))
            if msgs:
                self._last[(tp.topic, tp.partition)] = msgs[-1].offset + 1
        return out

    def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        from kafka.structs import OffsetAndMetadata, TopicPartition

        if offsets:
            self.consumer.commit({TopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()})

    def lag(self) -> dict[tuple[str, int], int]:
        from kafka.structs import TopicPartition

        out = {}
        for (t, p), pos in self._last.items():
            hw = self.consumer.highwater(TopicPartition(t, p))
            if hw is not None:
                out[(t, p)] = max(0, hw - pos)
        return out

    @property
    def ready(self) -> bool:
        return bool(self.consumer.assignment())

    def close(self) -> None:
        self.consumer.close(autocommit=False)
