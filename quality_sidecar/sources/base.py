"""The ``Source`` protocol: what the service calls on a source, and nothing else.

A source is a sequence of records in partitions (a file: one partition, offsets = line numbers).
The service polls batches, commits the next offset per partition once a batch's results are
flushed (at-least-once delivery; its state file removes the duplicates), pauses the source while a
baseline-server worker is behind, and exports lag.  Sources without a consumer group (a file) answer
the group questions with nothing: no metadata, no lag, no member, every partition owned.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from .record import Record

Partition = tuple[str, int]  # (topic, partition)


@dataclass(frozen=True)
class LagReport:
    """One partition's lag, as exported with kafka-lag-exporter's metric names and labels."""

    topic: str
    partition: int
    committed: int  # kafka_consumergroup_group_offset: the group's next offset to process
    lag: int  # kafka_consumergroup_group_lag: end offset - committed
    lag_seconds: float  # kafka_consumergroup_group_lag_seconds
    end: int  # kafka_partition_latest_offset


@dataclass(frozen=True)
class GroupMember:
    """Who consumes, as kafka-lag-exporter labels it (the cluster label defaults to ``bootstrap``)."""

    bootstrap: str
    group: str
    host: str
    consumer_id: str
    client_id: str


class Source(Protocol):
    eof: bool  # a finite source read to its end
    rebalances: int  # bumped when partitions are taken away: records polled before may be stale
    # set by the service: checkpoint + commit before partitions are taken away (awaited on the source's loop)
    on_revoke: Callable[[list[Partition]], Awaitable[None]] | None

    def poll(self, timeout_s: float, max_records: int | None = None) -> list[Record]:
        """The next records, at most ``max_records``, waiting up to ``timeout_s``; none while paused."""
        ...

    def restore(self, offsets: dict[Partition, int]) -> None:
        """Start reading at a state checkpoint's next offsets (a group that commits them already does)."""
        ...

    def owns(self, partition: Partition) -> bool:
        """Whether this member owns the partition now (not while its group is rebalancing)."""
        ...

    def rewind(self, records: list[Record]) -> None:
        """Read these (polled, unprocessed) records again, where this member still owns them."""
        ...

    def pause(self) -> None:
        """Backpressure: ``poll`` returns nothing until ``resume`` (a group member stays in its group)."""
        ...

    def resume(self) -> None: ...

    def commit(self, offsets: dict[Partition, int], metadata: str = "") -> None:
        """Make progress durable: the next offset per partition, tagged with ``metadata``."""
        ...

    async def commit_async(self, offsets: dict[Partition, int], metadata: str = "") -> None:
        """``commit`` from inside ``on_revoke`` (on the source's own IO loop)."""
        ...

    def committed_metadata(self, partitions: list[Partition]) -> dict[Partition, str]:
        """The metadata committed with each partition's offset ({} without a group)."""
        ...

    def lag(self) -> dict[Partition, int]:
        """Records not yet polled, per partition."""
        ...

    def lag_report(self) -> list[LagReport]:
        """The group's committed-offset lag per owned partition."""
        ...

    def member(self) -> GroupMember | None:
        """This consumer's labels for the lag metrics; None without a group."""
        ...

    def progress(self) -> tuple[int, int] | None:
        """(bytes read, total bytes) of a finite source, for the progress bar; None if unbounded."""
        ...

    @property
    def ready(self) -> bool:
        """Reading: /readyz says ready (Kafka: partitions assigned)."""
        ...

    def close(self) -> None: ...
