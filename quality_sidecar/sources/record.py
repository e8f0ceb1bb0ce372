"""One record of a source (its own module so that the sources import it without importing their
package: ``sources/__init__`` opens them, which would make a cycle)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Record:
    value: bytes
    key: bytes | None
    topic: str
    partition: int
    offset: int

    @property
    def where(self) -> dict:
        return {"topic": self.topic, "partition": self.partition, "offset": self.offset}
