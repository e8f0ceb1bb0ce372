"""Bounded OTel shutdown against a collector that accepts connections and never answers.

Fault injection: a real collector cannot be made to hang on demand, so the "collector" here is a
plain TCP socket that accepts and never replies (no mock of the SDK or exporter: the real OTLP gRPC
and HTTP exporters talk to it).  Before the fix, ``OTelEmitter.shutdown(1.0)`` took ~11 s (the
exporter's 10 s timeout) and the SDK's own atexit hook held process exit as long again.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from telemetry_support import make_request

from vllm_lookahead.telemetry.otel import OTelEmitter

pytestmark = pytest.mark.otlp


@pytest.fixture
def silent_collector() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a socket that accepts and never replies."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                continue

    th = threading.Thread(target=accept, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        th.join(2)
        for c in conns:
            c.close()
        srv.close()


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_shutdown_returns_within_its_timeout(silent_collector, protocol, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", silent_collector)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    em = OTelEmitter()
    em.start()
    for i in range(5):
        em.emit(make_request(f"cmpl-{i}", trace_id=i + 1, span_id=i + 1))
    t0 = time.monotonic()
    finished = em.shutdown(1.0)
    took = time.monotonic() - t0
    assert took < 1.6, f"shutdown(1.0) took {took:.1f} s"
    assert finished is False  # the collector never answered: reported, not waited for


CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from telemetry_support import make_request
    from vllm_lookahead.telemetry.config import TelemetryConfig
    from vllm_lookahead.telemetry.frontend import FrontendTelemetry

    t = FrontendTelemetry(TelemetryConfig.from_env({
        "VLLM_LOOKAHEAD_TELEMETRY": "1", "VLLM_LOOKAHEAD_SAMPLE_RATE": "0"}))  # atexit: bounded
    for i in range(5):
        t.on_finished(make_request(f"cmpl-{i}", trace_id=i + 1, span_id=i + 1))
    import time
    time.sleep(1.0)  # let the telemetry thread start the exporters and hand them the spans
    print("done", flush=True)
""")


def test_process_exit_is_not_held_by_a_silent_collector(silent_collector, tmp_path):
    """The atexit path: FrontendTelemetry's hook bounds the flush to 3 s in all; the SDK's own
    unbounded atexit shutdown is off."""
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": silent_collector,
           "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_METRICS_EXPORTER": "otlp",
           "OTEL_TRACES_EXPORTER": "otlp"}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(Path(__file__).parent)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        t0 = time.monotonic()
        assert line.strip() == "done", proc.stderr.read() if proc.stderr else ""
        rc = proc.wait(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0
    assert took < 5.0, f"process exit took {took:.1f} s with a silent collector (bound: 3 s)"
