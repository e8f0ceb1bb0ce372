"""Kafka consumer-group source: manual commits, bounded polls, lag per partition.

Offsets are committed by the service after a batch is processed and its outputs flushed;
``max_poll_records`` bounds memory (unread messages stay in Kafka, the lag gauges show them).  The
10 s session timeout moves a killed member's partitions within ~10 s; shorter ones got healthy
members evicted on a loaded machine (missed heartbeats while calibrating): rebalance loops.

Scale-out: before this member gives up partitions, ``on_revoke`` (set by the service) checkpoints and
commits what it processed, so the next owner starts exactly after it; records fetched for a revoked
partition are dropped unprocessed (``rebalances`` tells the service).

Lag follows kafka-lag-exporter (``LagReport``): offsets between the partition end and the group's
committed offset, and in seconds how long ago the partition end was first seen beyond the committed
offset (a lower bound of the oldest uncommitted record's age; no message timestamps needed).
"""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable

from ..sinks.kafka_common import kafka_auth, parse_kafka_url
from .base import GroupMember, LagReport, Partition
from .record import Record

HW_HISTORY = 10_000  # (end offset, time) observations kept per partition: ~2.8 h of lag at 1 s checkpoints


class KafkaSource:
    def __init__(self, url: str, group: str, max_poll_records: int = 500, session_timeout_ms: int = 10000):
        from kafka import KafkaConsumer
        from kafka.consumer.subscription_state import AsyncConsumerRebalanceListener

        bootstrap, self.topic = parse_kafka_url(url)
        self.bootstrap, self.group = bootstrap, group
        self.member_host = os.environ.get("HOSTNAME") or socket.gethostname()
        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap.split(","), group_id=group, enable_auto_commit=False,
            auto_offset_reset="earliest", max_poll_records=max_poll_records,
            session_timeout_ms=session_timeout_ms, heartbeat_interval_ms=1000,
            max_partition_fetch_bytes=8 * 1024 * 1024, **kafka_auth())
        self.client_id = str(self.consumer.config.get("client_id", ""))
        self.eof = False
        self.rebalances = 0  # bumped on every revocation: records fetched before it may be stale
        # Partitions this member owns between an assignment and the next revocation.  Between the two
        # (the group is rebalancing) it is empty: records polled then belong to no one yet and are
        # dropped unprocessed - their owner after the rebalance gets them from the committed offset.
        self.owned: set[tuple[str, int]] = set()
        self.on_revoke: Callable[[list[tuple[str, int]]], Awaitable[None]] | None = None
        self._last: dict[tuple[str, int], int] = {}  # next offset after the last polled record
        self._committed: dict[tuple[str, int], int] = {}
        self._ends: dict[tuple[str, int], deque[tuple[int, float]]] = {}
        outer = self

        # Async: kafka-python 3 runs rebalance listeners on the consumer's IO loop, where a blocking
        # commit is refused; the commit before revocation is awaited there instead.
        class Listener(AsyncConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked) -> None:
                outer.rebalances += 1
                tps = [(tp.topic, tp.partition) for tp in revoked]
                if outer.on_revoke is not None and tps:
                    await outer.on_revoke(tps)  # checkpoint + commit while this member still owns them
                outer.owned -= set(tps)
                for tp in tps:
                    outer._last.pop(tp, None)
                    outer._committed.pop(tp, None)
                    outer._ends.pop(tp, None)

            async def on_partitions_assigned(self, assigned) -> None:
                # (committed offsets for the lag gauges are fetched lazily by lag_report)
                outer.owned |= {(tp.topic, tp.partition) for tp in assigned}

        self.consumer.subscribe([self.topic], listener=Listener())

    @property
    def consumer_id(self) -> str:
        """The group member id the coordinator gave this consumer ("" before the first join)."""
        try:
            return str(self.consumer._coordinator._generation.member_id or "")
        except AttributeError:
            return ""

    def assigned(self) -> set[tuple[str, int]]:
        return {(tp.topic, tp.partition) for tp in self.consumer.assignment()}

    def owns(self, partition: Partition) -> bool:
        return partition in self.owned

    def restore(self, offsets: dict[Partition, int]) -> None:
        pass  # the group's committed offsets are at or past the checkpoint's (committed after it is written)

    def member(self) -> GroupMember | None:
        return GroupMember(self.bootstrap, self.group, self.member_host, self.consumer_id, self.client_id)

    def progress(self) -> tuple[int, int] | None:
        return None

    def poll(self, timeout_s: float = 0.5, max_records: int | None = None) -> list[Record]:
        batches = self.consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        out = []
        for tp, msgs in batches.items():
            for m in msgs:
                out.append(Record(m.value or b"", m.key, tp.topic, tp.partition, m.offset))
            if msgs:
                self._last[(tp.topic, tp.partition)] = msgs[-1].offset + 1
        return out

    def pause(self) -> None:
        """Stop fetching from every assigned partition (backpressure); ``poll`` keeps the membership."""
        parts = self.consumer.assignment() - self.consumer.paused()
        if parts:
            self.consumer.pause(*parts)

    def resume(self) -> None:
        parts = self.consumer.paused()
        if parts:
            self.consumer.resume(*parts)

    def rewind(self, records: list[Record]) -> None:
        """Seek back to the first of these (dropped, unprocessed) records in each partition still
        assigned here, so they are read again; a partition that moved is read by its new owner from
        the committed offset, which is at or before them."""
        from kafka.structs import TopicPartition

        first: dict[tuple[str, int], int] = {}
        for r in records:
            key = (r.topic, r.partition)
            first[key] = min(first.get(key, r.offset), r.offset)
        assigned = self.assigned()
        for (t, p), offset in first.items():
            if (t, p) in assigned:
                self.consumer.seek(TopicPartition(t, p), offset)

    def commit(self, offsets: dict[tuple[str, int], int], metadata: str = "") -> None:
        from kafka.structs import OffsetAndMetadata, TopicPartition

        if offsets:
            self.consumer.commit({TopicPartition(t, p): OffsetAndMetadata(o, metadata, -1)
                                  for (t, p), o in offsets.items()})
            self._committed.update(offsets)

    async def commit_async(self, offsets: dict[tuple[str, int], int], metadata: str = "") -> None:
        """Commit from inside a rebalance listener (on the consumer's IO loop).

        Uses the coroutine behind ``KafkaConsumer.commit`` (a private API of the pinned
        kafka-python; the library's own pre-rebalance auto-commit awaits the same one).
        """
        from kafka.structs import OffsetAndMetadata, TopicPartition

        if offsets:
            await self.consumer._coordinator._commit_offsets_sync_async(
                {TopicPartition(t, p): OffsetAndMetadata(o, metadata, -1) for (t, p), o in offsets.items()})
            self._committed.update(offsets)

    def committed_metadata(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], str]:
        """The group's committed metadata string per partition (for reconciling a state checkpoint)."""
        from kafka.structs import TopicPartition

        out = {}
        for t, p in partitions:
            om = self.consumer.committed(TopicPartition(t, p), metadata=True)
            if om is not None:
                out[(t, p)] = om.metadata or ""
        return out

    def lag(self) -> dict[tuple[str, int], int]:
        """Records not yet polled, per partition (``quality_sidecar_consumer_lag``)."""
        from kafka.structs import TopicPartition

        out = {}
        for (t, p), pos in self._last.items():
            hw = self.consumer.highwater(TopicPartition(t, p))
            if hw is not None:
                out[(t, p)] = max(0, hw - pos)
        return out

    def lag_report(self, now: float | None = None) -> list[LagReport]:
        """Committed-offset lag of every assigned partition whose end offset is known."""
        from kafka.structs import TopicPartition

        now = time.time() if now is None else now
        out = []
        for t, p in sorted(self.assigned()):
            end = self.consumer.highwater(TopicPartition(t, p))
            committed = self._committed.get((t, p))
            if committed is None:  # newly assigned: the group's offset, as the previous owner left it
                try:
                    committed = self.consumer.committed(TopicPartition(t, p), timeout_ms=2000)
                except Exception:  # noqa: BLE001 (lag reporting must never break consumption)
                    committed = None
                if committed is not None:
                    self._committed[(t, p)] = committed
                else:  # the group never committed here: consumption starts at the beginning (earliest)
                    try:
                        committed = self.consumer.beginning_offsets([TopicPartition(t, p)])[TopicPartition(t, p)]
                    except Exception:  # noqa: BLE001
                        committed = None
            if end is None or committed is None:
                continue
            hist = self._ends.setdefault((t, p), deque(maxlen=HW_HISTORY))
            if not hist or hist[-1][0] != end:
                hist.append((end, now))
            while hist and hist[0][0] <= committed:  # ends already consumed say nothing about the lag
                hist.popleft()
            lag = max(0, end - committed)
            seconds = max(0.0, now - hist[0][1]) if lag and hist else 0.0
            out.append(LagReport(t, p, committed, lag, seconds, end))
        return out

    @property
    def ready(self) -> bool:
        return bool(self.consumer.assignment())

    def close(self) -> None:
        self.consumer.close(autocommit=False)
