"""The sidecar's OTLP metrics, as a real OpenTelemetry Collector receives them.

The collector is the Jaeger v2 binary (an OTel Collector distribution) with a metrics pipeline
``otlp receiver -> prometheus exporter`` (see ``tests/support/jaeger.py``).  The sidecar runs
a file stream with an injected acceptance regression and three malformed lines; what reaches the
collector must carry the same numbers as the sidecar's own Prometheus registry: the sample and DLQ
counters as monotonic counters (``*_total``), the alarm gauge at 1, the resource's service name.
"""

from __future__ import annotations

import time

import pytest

from quality_sidecar.cli import main
from tests.support.jaeger import JaegerServer

from .conftest import metric_sum, scrape, write_jsonl
from .test_cli_file import _config

pytestmark = [pytest.mark.otlp, pytest.mark.slow]


@pytest.fixture(scope="module")
def collector():
    with JaegerServer() as server:
        yield server


def _wait_for(collector: JaegerServer, check, timeout: float = 30.0) -> str:
    """The collector's Prometheus exporter page once ``check(page)`` holds."""
    deadline, text = time.time() + timeout, ""
    while time.time() < deadline:
        text = scrape(collector.ports["prometheus"])
        if check(text):
            return text
        time.sleep(0.3)
    raise AssertionError(f"the collector never showed the expected metrics; last page:\n{text[:3000]}")


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_sidecar_metrics_reach_a_real_collector(tmp_path, monkeypatch, collector, clean_and_regressed, protocol):
    service = f"quality-sidecar-{protocol.replace('/', '-')}"
    endpoint = collector.otlp_grpc_endpoint if protocol == "grpc" else collector.otlp_http_endpoint
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_SERVICE_NAME", service)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "500")
    ref, bad = clean_and_regressed("acceptance")
    src = write_jsonl(tmp_path / "s.jsonl", ref + bad, extra_lines=["{not json", "[1,2]", "{also not json"])
    rc = main(["run", "--source", f"file://{src}", "--dlq", f"file://{tmp_path / 'dlq.jsonl'}",
               "--alerts", f"file://{tmp_path / 'alerts.jsonl'}", "--http-port", "-1",
               "--config", str(_config(tmp_path)), "--no-progress"])
    assert rc == 0

    def ours(text: str, name: str, **labels) -> float:
        return metric_sum(text, name, service_name=service, **labels)

    n = len(ref + bad)
    text = _wait_for(collector, lambda t: ours(t, "quality_sidecar_samples_total") == n
                     and ours(t, "quality_sidecar_dlq_total") == 3
                     and ours(t, "quality_sidecar_alarm", detector="acceptance_down") == 1.0)
    assert ours(text, "quality_sidecar_samples_total", arm="candidate") == n
    assert ours(text, "quality_sidecar_dlq_total", reason="invalid_json") == 2
    assert ours(text, "quality_sidecar_dlq_total", reason="not_an_object") == 1
    # Only the injected regression is in alarm (the gauge is 0 or 1 per detector).
    assert ours(text, "quality_sidecar_alarm") == 1.0
    # A counter stays a counter through OTLP (the collector's exporter types it so).
    assert "# TYPE quality_sidecar_alarms_total counter" in text
