"""The shared background-worker rules: submit never blocks and never drops, a backlog turns on
``saturated`` (the service's cue to stop reading), transient failures are retried for as long as they
last, only a rejected sample is given up and reported per arm and reason, a failing server turns ``up`` False, results keep submission order.
The "server" here is a Python callable that blocks or raises on demand: a fault a real baseline
server cannot produce on cue."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from quality_sidecar.workers import BackgroundWorker, RetryPolicy, WorkFailed, base_url

pytestmark = pytest.mark.unit


class _Worker(BackgroundWorker):
    thread_name = "test-worker"

    def __init__(self, gate: threading.Event, fail: dict[int, list[WorkFailed]] | None = None, **kw: Any):
        self.gate, self.fail, self.seen = gate, fail or {}, []
        super().__init__(**kw)

    def prepare(self, sample: dict[str, Any]) -> Any:
        if sample.get("skip"):
            return "no_prompt"
        return None if sample.get("ignore") else sample["i"]

    def arm_of(self, item: int) -> str:
        return "candidate" if item % 2 else "baseline"

    def handle(self, item: int) -> None:
        self.gate.wait(10)
        errs = self.fail.get(item)
        if errs:
            raise errs.pop(0)
        self.seen.append(item)


FAST = RetryPolicy(backoff_s=0.01, max_backoff_s=0.01, down_after=2)


def test_backlog_saturates_instead_of_dropping_and_drain_is_exact() -> None:
    gate = threading.Event()  # the "server" hangs until released
    w = _Worker(gate, fraction=1.0, max_queue=4, retry=FAST)
    try:
        t0 = time.monotonic()
        queued = [w.submit({"i": i}) for i in range(10)]
        assert time.monotonic() - t0 < 0.5, "submit blocked on a hanging server"
        assert all(queued) and w.counts["submitted"] == 10  # nothing dropped, whatever the backlog
        assert w.saturated and w.pending == 10
        assert not w.submit({"skip": True}) and w.counts["skipped_no_prompt"] == 1
        assert not w.submit({"ignore": True, "i": 99})  # not eligible: not counted anywhere
        assert not w.drain(timeout_s=0.3)  # still stuck: drain says so instead of lying
        gate.set()
        assert w.drain(timeout_s=10)
        assert w.seen == list(range(10))  # one thread, FIFO: the order of submission
        assert not w.saturated and w.counts["done"] == 10
    finally:
        w.close()


def test_saturation_has_hysteresis() -> None:
    gate = threading.Event()
    w = _Worker(gate, fraction=1.0, max_queue=4, retry=FAST)
    try:
        for i in range(3):
            w.submit({"i": i})
        assert not w.saturated  # 3 < 4
        w.submit({"i": 3})
        assert w.saturated
        gate.set()
        assert w.drain(timeout_s=10) and not w.saturated
    finally:
        w.close()


def test_transient_failures_retry_until_they_pass_rejected_ones_are_reported_per_arm_and_reason() -> None:
    gate = threading.Event()
    gate.set()
    timeout = WorkFailed("timeout", "read timed out", transient=True)
    fail = {1: [timeout, timeout],  # recovers on the third attempt
            2: [WorkFailed("rejected", "400", transient=False)],  # given up at once
            3: [timeout] * 20}  # far past the old 6-attempt limit: still delayed, never given up
    given_up: list[tuple[int, str]] = []
    w = _Worker(gate, fail, fraction=1.0, max_queue=100, retry=FAST)
    w.on_failure = lambda item, reason: given_up.append((item, reason))
    try:
        for i in range(5):
            w.submit({"i": i})
        assert w.drain(timeout_s=10)
        assert w.seen == [0, 1, 3, 4]
        assert given_up == [(2, "rejected")]
        assert w.failures == {("baseline", "rejected"): 1}
        assert w.counts["retries"] == 2 + 20 and w.counts["failed"] == 1 and w.counts["done"] == 4
        assert w.up  # the last attempt (item 4) succeeded
    finally:
        w.close()


def test_a_server_that_keeps_failing_is_down_until_it_answers() -> None:
    gate = threading.Event()
    gate.set()
    down = WorkFailed("connection", "refused", transient=True)
    w = _Worker(gate, {0: [down] * 150}, fraction=1.0, max_queue=100, retry=FAST)
    try:
        w.submit({"i": 0})
        assert not w.drain(timeout_s=0.5) and not w.up  # >= down_after failed attempts in a row, still pending
        assert w.pending == 1 and w.counts["failed"] == 0
        assert w.drain(timeout_s=20) and w.up and w.seen == [0]  # answered at last: up again, nothing lost
    finally:
        w.close()


def test_backoff_doubles_up_to_its_cap() -> None:
    r = RetryPolicy()
    assert [r.delay(i) for i in range(8)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert r.delay(10_000) == 30  # an outage of days: no overflow
    with pytest.raises(TypeError):
        RetryPolicy(attempts=6)  # the attempt limit is gone: transient failures are never given up


def test_close_while_backing_off_is_prompt_and_gives_nothing_up() -> None:
    """Stop (SIGTERM) during an outage: the worker leaves at once, the sample is neither done nor given
    up, so the service keeps it pending and a restart redoes it."""
    gate = threading.Event()
    gate.set()
    down = WorkFailed("connection", "refused", transient=True)
    given_up: list[tuple[int, str]] = []
    fail = {0: [down] * 100}
    w = _Worker(gate, fail, fraction=1.0, max_queue=100, retry=RetryPolicy(backoff_s=30.0))
    w.on_failure = lambda item, reason: given_up.append((item, reason))
    w.submit({"i": 0})
    deadline = time.monotonic() + 5
    while len(fail[0]) == 100 and time.monotonic() < deadline:  # until the first attempt has failed
        time.sleep(0.01)
    t0 = time.monotonic()
    w.close()
    assert time.monotonic() - t0 < 2 and not w._thread.is_alive()  # not the 30 s backoff
    assert given_up == [] and w.counts["failed"] == 0 and w.counts["done"] == 0


def test_fraction_selects_about_that_share() -> None:
    gate = threading.Event()
    gate.set()
    w = _Worker(gate, fraction=0.25, max_queue=10_000, seed=7)
    try:
        n = sum(w.submit({"i": i}) for i in range(4000))
        assert 850 < n < 1150  # Binomial(4000, 0.25): sd 27
        assert w.drain(timeout_s=10) and w.counts["done"] == n
    finally:
        w.close()


def test_base_url_takes_both_conventions() -> None:
    assert base_url("http://h:8000/v1") == base_url("http://h:8000/v1/") == "http://h:8000"
    assert base_url("http://h:8000") == "http://h:8000"
