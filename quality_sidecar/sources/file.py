"""JSONL file source: one sample per line; one partition, "offset" = line number (0-based).

No consumer group: ``commit`` is a no-op (the state checkpoint, if any, records the line and
``restore`` skips to it), there is no lag and every record is owned.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from .base import GroupMember, LagReport, Partition
from .record import Record


class FileSource:
    def __init__(self, path: str, batch: int = 500):
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"--source file://{path}: no such file")
        self.fh = self.path.open("rb")
        self.batch = batch
        self.line = 0
        self.eof = False
        self.total_bytes = os.path.getsize(self.path)
        self.bytes_read = 0
        self.rebalances = 0
        self.on_revoke = None
        self.paused = False

    def poll(self, timeout_s: float = 0.0, max_records: int | None = None) -> list[Record]:
        if self.paused:  # nothing to keep alive: wait as a consumer's poll would, read nothing
            time.sleep(timeout_s)
            return []
        out = []
        for _ in range(max_records or self.batch):
            raw = self.fh.readline()
            if not raw:
                self.eof = True
                break
            self.bytes_read += len(raw)
            if raw.strip():
                out.append(Record(raw.rstrip(b"\r\n"), None, str(self.path), 0, self.line))
            self.line += 1
        return out

    def seek_line(self, line: int) -> None:
        """Skip to ``line``."""
        while self.line < line and self.fh.readline():
            self.line += 1

    def restore(self, offsets: dict[Partition, int]) -> None:
        if offsets:
            self.seek_line(max(offsets.values()))

    def owns(self, partition: Partition) -> bool:
        return True

    def rewind(self, records: list[Record]) -> None:
        if records:
            self.fh.seek(0)
            self.line, self.eof = 0, False
            self.seek_line(min(r.offset for r in records))
            self.bytes_read = self.fh.tell()

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def commit(self, offsets: dict[Partition, int], metadata: str = "") -> None:
        pass  # the state checkpoint (if any) records the line; a file has no broker to tell

    async def commit_async(self, offsets: dict[Partition, int], metadata: str = "") -> None:
        self.commit(offsets, metadata)

    def committed_metadata(self, partitions: list[Partition]) -> dict[Partition, str]:
        return {}

    def lag(self) -> dict[Partition, int]:
        return {}

    def lag_report(self) -> list[LagReport]:
        return []

    def member(self) -> GroupMember | None:
        return None

    def progress(self) -> tuple[int, int] | None:
        return self.bytes_read, self.total_bytes

    @property
    def ready(self) -> bool:
        return True

    def close(self) -> None:
        self.fh.close()
