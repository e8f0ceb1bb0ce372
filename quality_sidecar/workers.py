"""One background-worker shape for everything the sidecar asks a baseline server.

Both the T=0 replay (``detectors/replay.py``) and the T>0 conformance scorer (``conformance.py``) take
a sampled fraction of samples off the consumer loop, call a remote server, and hand the result on.
They share the rules that keep that safe, so the rules live here once:

- ``submit`` never blocks: a bounded queue; when it is full the sample is skipped and counted
  (backpressure must not reach the Kafka consumer, whose poll interval is bounded);
- a failing server is counted and logged, never raised into the consumer;
- ``counts`` is the only output besides the callback (the service turns it into metrics; the worker
  never touches them, so it stays testable without a registry);
- ``drain`` waits on the queue's own unfinished-task count, so it is exact.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from typing import Any

log = logging.getLogger(__name__)


class BackgroundWorker:
    """Subclasses implement ``prepare`` (cheap, on the caller's thread) and ``handle`` (remote call).

    ``prepare(sample)`` returns the work item, or a string naming why the sample is skipped (counted
    as ``skipped_<reason>``), or ``None`` for "not selected" (not counted: sampling by design).
    """

    thread_name = "sidecar-worker"

    def __init__(self, fraction: float, max_queue: int, seed: int = 0):
        self.fraction = fraction
        self.queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self.rng = random.Random(seed)
        self.counts: dict[str, int] = {"submitted": 0, "done": 0, "skipped_queue_full": 0, "failed": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    # -- subclass API --------------------------------------------------------------------------
    def prepare(self, sample: dict[str, Any]) -> Any:
        raise NotImplementedError

    def handle(self, item: Any) -> None:
        raise NotImplementedError

    # -- shared machinery ----------------------------------------------------------------------
    def _count(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1

    def submit(self, sample: dict[str, Any]) -> bool:
        """Queue a sample if selected; never blocks.  True when queued."""
        if self.rng.random() >= self.fraction:
            return False
        item = self.prepare(sample)
        if item is None:
            return False
        if isinstance(item, str):
            self._count(f"skipped_{item}")
            return False
        try:
            self.queue.put_nowait(item)
        except queue.Full:
            self._count("skipped_queue_full")
            return False
        self._count("submitted")
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item = self.queue.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                self.handle(item)
                self._count("done")
            except Exception as e:  # noqa: BLE001 - a flaky baseline must not stop the sidecar
                self._count("failed")
                log.warning("%s failed: %s", self.thread_name, e)
            finally:
                self.queue.task_done()

    def drain(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything submitted so far is handled (tests, file sources); True if drained."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.queue.unfinished_tasks == 0:
                return True
            time.sleep(0.05)
        return False

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
