"""Fixtures for the telemetry tests: a real OTLP receiver with a query API.

Default: Jaeger v2 all-in-one (binary from `scripts/setup.sh jaeger`; missing -> error with the fix).
``VLLM_LOOKAHEAD_TEST_OTLP_RECEIVER=python`` selects the small gRPC/HTTP OTLP receiver in
``otlp_sink.py`` instead (same query shape), for machines where Jaeger is not built yet.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator:
    """An OTLP receiver on free loopback ports with ``otlp_grpc_endpoint``, ``otlp_http_endpoint``
    and ``wait_for_trace(trace_id, ...)`` returning the trace in Jaeger's JSON shape."""
    choice = os.environ.get("VLLM_LOOKAHEAD_TEST_OTLP_RECEIVER", "jaeger")
    if choice == "python":
        from otlp_sink import OtlpReceiver

        receiver = OtlpReceiver().start()
    elif choice == "jaeger":
        from tests.support.jaeger import JaegerServer

        receiver = JaegerServer().start()
    else:
        raise ValueError(f"VLLM_LOOKAHEAD_TEST_OTLP_RECEIVER={choice!r}: expected jaeger or python")
    try:
        yield receiver
    finally:
        receiver.close()
