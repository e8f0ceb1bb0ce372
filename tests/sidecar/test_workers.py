"""The shared background-worker rules: submit never blocks, a full queue and a failing server are
counted (not raised), drain is exact.  The "server" here is a Python callable that blocks or raises on
demand: a fault a real baseline server cannot produce on cue."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from quality_sidecar.workers import BackgroundWorker

pytestmark = pytest.mark.unit


class _Worker(BackgroundWorker):
    thread_name = "test-worker"

    def __init__(self, gate: threading.Event, fail_on: set[int], **kw: Any):
        self.gate, self.fail_on, self.seen = gate, fail_on, []
        super().__init__(**kw)

    def prepare(self, sample: dict[str, Any]) -> Any:
        if sample.get("skip"):
            return "no_prompt"
        return None if sample.get("ignore") else sample["i"]

    def handle(self, item: int) -> None:
        self.gate.wait(10)
        if item in self.fail_on:
            raise RuntimeError(f"server said no to {item}")
        self.seen.append(item)


def test_full_queue_failures_and_drain_are_counted_never_raised() -> None:
    gate = threading.Event()  # the "server" hangs until released
    w = _Worker(gate, fail_on={3}, fraction=1.0, max_queue=4)
    try:
        t0 = time.monotonic()
        queued = [w.submit({"i": i}) for i in range(10)]
        assert time.monotonic() - t0 < 0.5, "submit blocked on a hanging server"
        # one item may already be in handle() (off the queue), so 4 or 5 are accepted
        assert sum(queued) in (4, 5) and w.counts["skipped_queue_full"] == 10 - sum(queued)
        assert not w.submit({"skip": True}) and w.counts["skipped_no_prompt"] == 1
        assert not w.submit({"ignore": True, "i": 99})  # not selected: not counted anywhere
        assert not w.drain(timeout_s=0.3)  # still stuck: drain says so instead of lying
        gate.set()
        assert w.drain(timeout_s=10)
        accepted = [i for i, ok in enumerate(queued) if ok]
        assert w.counts["failed"] == (1 if 3 in accepted else 0)
        assert sorted(w.seen) == [i for i in accepted if i != 3]
        assert w.counts["done"] == len(w.seen) and w.counts["submitted"] == len(accepted)
    finally:
        w.close()


def test_fraction_selects_about_that_share() -> None:
    gate = threading.Event()
    gate.set()
    w = _Worker(gate, fail_on=set(), fraction=0.25, max_queue=10_000, seed=7)
    try:
        n = sum(w.submit({"i": i}) for i in range(4000))
        assert 850 < n < 1150  # Binomial(4000, 0.25): sd 27
        assert w.drain(timeout_s=10) and w.counts["done"] == n
    finally:
        w.close()
