"""The sidecar's OTLP metrics, as a real OpenTelemetry Collector receives them.

The collector is the Jaeger v2 binary (an OTel Collector distribution) with a metrics pipeline
``otlp receiver -> prometheus exporter`` (see ``vllm_lookahead/devtools/jaeger.py``).  The sidecar runs
a file stream with an injected acceptance regression and three malformed lines; what reaches the
collector must carry the same numbers as the sidecar's own Prometheus registry: the sample and DLQ
counters as monotonic counters (``*_total``), the alarm gauge at 1, the resource's service name.
"""

from __future__ import annotations

import time

import pytest

from quality_sidecar.cli import main
from vllm_lookahead.devtools.jaeger import JaegerServer

from .conftest import write_jsonl
from .test_cli_file import _config

pytestmark = [pytest.mark.otlp, pytest.mark.slow]


@pytest.fixture(scope="module")
def collector():
    with JaegerServer() as server:
        yield server


def _wait_for(collector: JaegerServer, name: str, predicate, timeout: float = 30.0) -> dict[str, float]:
    deadline, values = time.time() + timeout, {}
    while time.time() < deadline:
        values = collector.metric_values(name)
        if predicate(values):
            return values
        time.sleep(0.3)
    raise AssertionError(f"{name} never satisfied the check; last: {values}\n{collector.metrics_text()[:3000]}")


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

    def ours(values: dict[str, float]) -> dict[str, float]:
        return {k: v for k, v in values.items() if f'service_name="{service}"' in k}

    samples = _wait_for(collector, "quality_sidecar_samples_total", lambda v: sum(ours(v).values()) == len(ref + bad))
    assert all('arm="candidate"' in k for k in ours(samples))
    dlq = _wait_for(collector, "quality_sidecar_dlq_total", lambda v: sum(ours(v).values()) == 3)
    by_reason = {r: sum(x for k, x in ours(dlq).items() if f'reason="{r}"' in k)
                 for r in ("invalid_json", "not_an_object")}
    assert by_reason == {"invalid_json": 2, "not_an_object": 1}, dlq
    alarm = _wait_for(collector, "quality_sidecar_alarm",
                      lambda v: any('detector="acceptance_down"' in k and x == 1.0 for k, x in ours(v).items()))
    # Only the injected regression is in alarm.
    assert [k for k, x in ours(alarm).items() if x == 1.0] == \
        [k for k in ours(alarm) if 'detector="acceptance_down"' in k]
    # A counter stays a counter through OTLP (the collector's exporter types it so).
    assert "# TYPE quality_sidecar_alarms_total counter" in collector.metrics_text()
