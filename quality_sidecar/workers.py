"""One background-worker shape for everything the sidecar asks a baseline server.

The T=0 replay (``replay.py``) and the T>0 conformance scorer (``baseline_scoring.py``) both take a
sampled fraction of samples off the consumer loop to a remote server; the rules that keep their
evidence whole live here once:

- **no drops**: a selected sample is always queued (unbounded); ``saturated`` (on at ``max_queue``
  unfinished items, off at half) makes the service stop reading its source until the worker catches
  up, so a consumer catching up on lag scores exactly what a live one would, in the same order;
- **an outage delays, never drops**: a transient failure (timeout, connection refused, 408 / 429 /
  5xx) is retried in place, with exponential backoff capped at 30 s, for as long as it lasts; the
  queue fills and ``saturated`` pauses the source.  Only a non-transient answer (4xx, a malformed
  answer) gives a sample up, to ``on_failure(sample, reason)`` and ``failures[(arm, reason)]``.  A
  sample still being retried at ``close`` stays pending for the service, which never commits past
  it, so a restart redoes it;
- ``up`` goes False after ``RetryPolicy.down_after`` failed attempts in a row (``/readyz`` 503,
  ``quality_sidecar_baseline_up 0``) and True at the next success;
- no metrics here (``counts``/``failures`` are the outputs), so the worker is testable without a
  registry;
- one thread, FIFO: results arrive in submission order whatever the speed, so the sample at which a
  chart first alarms does not depend on how fast the stream was read.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


class WorkFailed(Exception):
    """A call to the baseline server that failed; ``reason`` is a metric label, ``transient`` retries."""

    def __init__(self, reason: str, message: str, transient: bool):
        super().__init__(message)
        self.reason, self.transient = reason, transient


def classify_http_failure(exc: BaseException) -> WorkFailed:
    """Map a ``requests`` exception to a ``WorkFailed``: timeouts, refused connections and a connection
    cut mid-answer (a server restarting) are transient."""
    import requests

    if isinstance(exc, WorkFailed):
        return exc
    if isinstance(exc, requests.Timeout):
        return WorkFailed("timeout", str(exc), True)
    if isinstance(exc, (requests.ConnectionError, requests.exceptions.ChunkedEncodingError)):
        return WorkFailed("connection", str(exc), True)
    return WorkFailed("error", f"{type(exc).__name__}: {exc}", False)


def http_status_failure(url: str, status: int, text: str) -> WorkFailed:
    """A non-2xx answer: 408 / 429 / 5xx are transient, other 4xx are the server rejecting the request."""
    transient = status in (408, 429) or status >= 500
    return WorkFailed("server_error" if transient else "rejected", f"{url} answered {status}: {text[:300]}",
                      transient)


def base_url(url: str) -> str:
    """The server root from either convention: ``http://host:8000`` or the OpenAI client's
    ``http://host:8000/v1`` (both are accepted by ``--baseline-url``)."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff between tries of one sample.  There is no attempt limit for transient failures: a
    limit would turn a baseline outage longer than the backoff sum into silently lost evidence."""

    backoff_s: float = 0.5
    max_backoff_s: float = 30.0  # cap: a recovered server is noticed within 30 s, at 2 requests/min while down
    down_after: int = 3  # failed attempts in a row after which the server counts as down

    def __post_init__(self) -> None:
        if self.backoff_s < 0 or self.max_backoff_s < self.backoff_s or self.down_after < 1:
            raise ValueError("retry: 0 <= backoff_s <= max_backoff_s and down_after >= 1")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after the ``attempt``-th failure (0-based): 0.5, 1, 2, ... 30, 30, ..."""
        return min(self.max_backoff_s, self.backoff_s * 2 ** min(attempt, 64))


class BackgroundWorker:
    """Subclasses implement ``prepare`` (cheap, on the caller's thread) and ``handle`` (remote call).

    ``prepare(sample)`` returns the work item, or a string naming why the sample cannot be worked on
    (counted as ``skipped_<reason>``), or ``None`` for "not eligible" (not counted).  ``handle`` raises
    ``WorkFailed`` for a classified failure; any other exception is a non-transient ``error``.
    ``on_failure(sample, reason)``, if set, hears of every sample given up (``sample_of(item)``).
    """

    thread_name = "sidecar-worker"

    def __init__(self, fraction: float, max_queue: int, seed: int = 0, retry: RetryPolicy | None = None):
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.fraction, self.max_queue, self.retry = fraction, max_queue, retry or RetryPolicy()
        self.queue: queue.Queue = queue.Queue()
        self.rng = random.Random(seed)
        self.counts: dict[str, int] = {"submitted": 0, "done": 0, "failed": 0, "retries": 0}
        self.failures: dict[tuple[str, str], int] = {}  # (arm, reason) -> samples given up
        self.on_failure: Any = None
        self.up = True
        self._failed_in_a_row = 0
        self._saturated = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    # -- subclass API --------------------------------------------------------------------------
    def prepare(self, sample: dict[str, Any]) -> Any:
        raise NotImplementedError

    def handle(self, item: Any) -> None:
        raise NotImplementedError

    def sample_of(self, item: Any) -> Any:
        """The sample a work item was prepared from (subclasses whose items wrap it override this)."""
        return item

    def arm_of(self, item: Any) -> str:
        return "unknown"

    # -- shared machinery ----------------------------------------------------------------------
    def _count(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1

    def selected(self, sample: dict[str, Any]) -> Any:
        """The work item when this sample is eligible and drawn, else None (skips counted)."""
        item = self.prepare(sample)
        if item is None:
            return None
        if isinstance(item, str):
            self._count(f"skipped_{item}")
            return None
        return item if self.rng.random() < self.fraction else None

    def enqueue(self, item: Any) -> None:
        """Queue a work item; never blocks, never drops (see ``saturated``)."""
        self._count("submitted")
        self.queue.put(item)

    def submit(self, sample: dict[str, Any]) -> bool:
        """``selected`` + ``enqueue``; True when queued."""
        item = self.selected(sample)
        if item is None:
            return False
        self.enqueue(item)
        return True

    @property
    def pending(self) -> int:
        """Items queued or in flight."""
        return self.queue.unfinished_tasks

    @property
    def saturated(self) -> bool:
        """True from ``max_queue`` pending items until the backlog is down to half of it: the service
        stops reading its source meanwhile."""
        n = self.pending
        if n >= self.max_queue:
            self._saturated = True
        elif n <= self.max_queue // 2:
            self._saturated = False
        return self._saturated

    def _attempt(self, item: Any) -> WorkFailed | None:
        try:
            self.handle(item)
            return None
        except WorkFailed as e:
            return e
        except Exception as e:  # noqa: BLE001 - a flaky baseline must not stop the sidecar
            return WorkFailed("error", f"{type(e).__name__}: {e}", False)

    def _work(self, item: Any) -> None:
        attempt = 0
        while (err := self._attempt(item)) is not None:
            self._failed_in_a_row += 1
            if self._failed_in_a_row >= self.retry.down_after:
                self.up = False
            if not err.transient:
                self._give_up(item, err)
                return
            delay = self.retry.delay(attempt)
            log.log(logging.WARNING if self._failed_in_a_row == self.retry.down_after else logging.INFO,
                    "%s: %s (attempt %d, retrying in %.1f s)", self.thread_name, err, attempt + 1, delay)
            if self._stop.wait(delay):  # closing: neither done nor given up, so the service keeps it pending
                return
            self._count("retries")
            attempt += 1
        self.up, self._failed_in_a_row = True, 0
        self._count("done")

    def _give_up(self, item: Any, err: WorkFailed) -> None:
        self._count("failed")
        key = (self.arm_of(item), err.reason)
        self.failures[key] = self.failures.get(key, 0) + 1
        log.warning("%s gave up a sample (%s): %s", self.thread_name, err.reason, err)
        if self.on_failure is not None:
            self.on_failure(self.sample_of(item), err.reason)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item = self.queue.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                self._work(item)
            except Exception:  # noqa: BLE001 - a failing callback must not kill the thread
                log.exception("%s: callback failed", self.thread_name)
            finally:
                self.queue.task_done()

    def drain(self, timeout_s: float | None = 30.0, stop: threading.Event | None = None) -> bool:
        """Wait until everything submitted so far is handled; True if drained.  ``timeout_s=None``
        waits until then or until ``stop`` is set: a baseline outage can last, and only the caller's
        stop (SIGTERM) ends the wait early, leaving the unfinished samples pending (never committed,
        redone after a restart)."""
        end = None if timeout_s is None else time.monotonic() + timeout_s
        while end is None or time.monotonic() < end:
            if self.queue.unfinished_tasks == 0:
                return True
            if stop is not None and stop.is_set():
                return False
            time.sleep(0.05)
        return False

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)


class PairWorker(BackgroundWorker):
    """A worker whose items are ``(sample, payload)`` pairs (the replay and the conformance scorer):
    the sample and its arm are read from the pair."""

    def sample_of(self, item: tuple[dict[str, Any], Any]) -> dict[str, Any]:
        return item[0]

    def arm_of(self, item: tuple[dict[str, Any], Any]) -> str:
        return item[0]["deployment"]["arm"]
