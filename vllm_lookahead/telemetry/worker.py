"""A bounded, lossy hand-off from the request path to one background thread per process.

The request path calls ``submit()``: an approximate size check and a ``SimpleQueue.put`` (C code, no
Python-level lock), never a wait.  A full queue returns False so the caller can count the drop.
The thread *polls* (drains the queue, then sleeps ``poll_interval_s``) instead of blocking in
``get()``: a blocked consumer would be woken by every put, and on a busy machine that wake-up (futex
call, the woken thread preempting the request thread's CPU) cost ~20-30 us per request in the
benchmark; a put into a queue nobody waits on costs ~0.2 us.
The thread is created lazily on the first ``submit()`` and re-created in a forked child (threads do
not survive ``fork``), so importing or configuring the module in a parent process is harmless.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("vllm_lookahead.telemetry")

_STOP = object()


class BoundedWorker:
    """``handler(item)`` runs on a daemon thread; exceptions are logged (rate-limited) and swallowed.

    ``idle()`` runs once the queue has been empty for ``idle_interval_s``, and again every
    ``idle_interval_s`` for as long as it returns True (the sink has retries pending)."""

    def __init__(self, name: str, maxsize: int, handler: Callable[[Any], None],
                 on_start: Callable[[], None] | None = None,
                 on_stop: Callable[[float], None] | None = None,
                 idle: Callable[[], bool | None] | None = None, idle_interval_s: float = 0.5,
                 poll_interval_s: float = 0.02):
        self.name = name
        self.maxsize = maxsize
        self._handler = handler
        self._on_start = on_start
        self._on_stop = on_stop
        self._idle = idle
        self._idle_interval_s = idle_interval_s
        self._poll_interval_s = poll_interval_s
        self._lock = threading.Lock()
        self._reset()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._last_error_log = 0.0
        self._lock = threading.Lock()

    # ---- request path -------------------------------------------------------------------------
    def submit(self, item: Any) -> bool:
        """Hand ``item`` to the thread; False (and nothing else) when the queue is full or stopped."""
        # No pid check here: register_at_fork resets the worker in a forked child.
        if self._thread is None and not self._ensure_thread():
            return False
        q = self._q
        if q.qsize() >= self.maxsize:
            return False
        q.put(item)
        return True

    # ---- lifecycle ------------------------------------------------------------------------------
    def _ensure_thread(self) -> bool:
        if self._pid != os.getpid():
            self._reset()
        with self._lock:
            if self._stopped:
                return False
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
        return True

    @property
    def started(self) -> bool:
        return self._thread is not None and self._pid == os.getpid()

    def qsize(self) -> int:
        return self._q.qsize()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Drain what is queued, then stop; waits at most ``timeout_s`` (what is left is lost)."""
        with self._lock:
            self._stopped = True
            thread = self._thread
        if thread is None or self._pid != os.getpid():
            return
        deadline = time.monotonic() + timeout_s
        self._q.put(_STOP)
        thread.join(max(0.0, deadline - time.monotonic()))
        if self._on_stop is not None:
            try:
                self._on_stop(max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 (shutdown must not raise)
                logger.debug("%s: error while stopping", self.name, exc_info=True)

    def _log_error(self, what: str) -> None:
        now = time.monotonic()
        if now - self._last_error_log > 30.0:
            self._last_error_log = now
            logger.warning("%s: %s (further errors suppressed for 30 s)", self.name, what, exc_info=True)

    def _run(self) -> None:
        if self._on_start is not None:
            try:
                self._on_start()
            except Exception:  # noqa: BLE001
                self._log_error("start-up failed")
        q = self._q
        last_item = time.monotonic()
        idle_pending = False
        while True:
            try:
                item = q.get_nowait()
            except queue.Empty:
                if idle_pending and time.monotonic() - last_item >= self._idle_interval_s:
                    idle_pending = False
                    if self._idle is not None:
                        try:
                            # True: work is still pending (e.g. a sample waiting for a retry)
                            if self._idle():
                                idle_pending = True
                                last_item = time.monotonic()
                        except Exception:  # noqa: BLE001
                            self._log_error("idle callback failed")
                time.sleep(self._poll_interval_s)
                continue
            if item is _STOP:
                return
            try:
                self._handler(item)
            except Exception:  # noqa: BLE001 (the thread must survive any sink failure)
                self._log_error("handler failed")
            last_item = time.monotonic()
            idle_pending = True
