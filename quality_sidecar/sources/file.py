"""JSONL file source: one sample per line; "offset" = line number (0-based)."""

from __future__ import annotations

import os
from pathlib import Path

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

    def poll(self, timeout_s: float = 0.0, max_records: int | None = None) -> list[Record]:
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
        """Skip to ``line`` (resume from a state checkpoint)."""
        while self.line < line and self.fh.readline():
            self.line += 1

    def commit(self, offsets: dict[str, int]) -> None:
        pass  # the state checkpoint (if any) records the line; a file has no broker to tell

    def lag(self) -> dict[tuple[str, int], int]:
        return {}

    @property
    def ready(self) -> bool:
        return True

    def close(self) -> None:
        self.fh.close()
