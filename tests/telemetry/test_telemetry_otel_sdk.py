"""Spans and metrics as the OpenTelemetry SDK produces them (in-memory exporter/reader of the real
SDK; the network exporters are covered by the OTLP receiver tests)."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from telemetry_support import make_request

from vllm_lookahead.telemetry.otel import (
    REQUEST_DURATION_BUCKETS,
    TPOT_BUCKETS,
    TTFT_BUCKETS,
    OTelEmitter,
)

pytestmark = pytest.mark.unit


@pytest.fixture
def emitter():
    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    em = OTelEmitter(capture_content=False, span_exporter=spans, metric_reader=reader)
    em.start()
    yield em, spans, reader
    em.shutdown(1)


def test_span_ids_attributes_and_no_content(emitter):
    em, spans, _ = emitter
    em.emit(make_request("cmpl-7", trace_id=0xABC, span_id=0xDEF))
    em.tracer_provider.force_flush()
    (span,) = spans.get_finished_spans()
    # the ids the sample carries are the span's ids
    assert span.context.trace_id == 0xABC and span.context.span_id == 0xDEF
    assert span.name == "text_completion demo" and span.kind == SpanKind.SERVER
    assert span.start_time == int(1000.0 * 1e9) and span.end_time == int(1001.5 * 1e9)
    a = span.attributes
    assert a["gen_ai.provider.name"] == "vllm" and a["gen_ai.usage.output_tokens"] == 4
    assert tuple(a["gen_ai.response.finish_reasons"]) == ("stop",)
    assert a["vllm_lookahead.decoder.window"] == 5 and a["vllm_lookahead.decoder.k"] == 4
    assert a["vllm_lookahead.spec.acceptance_rate"] == pytest.approx(7 / 12)
    assert not any("messages" in k for k in a) and "def add" not in str(dict(a))


def test_error_status_and_content_opt_in(emitter):
    em, spans, _ = emitter
    em.capture_content = True
    em.emit(make_request("cmpl-8", finish_reason="error"))
    em.tracer_provider.force_flush()
    (span,) = spans.get_finished_spans()
    assert span.status.status_code.name == "ERROR" and span.attributes["error.type"] == "error"
    assert "def add(a, b):" in span.attributes["gen_ai.input.messages"]


def test_metrics_use_semconv_buckets(emitter):
    em, _, reader = emitter
    for i in range(3):
        em.emit(make_request(f"cmpl-{i}"))
    data = reader.get_metrics_data()
    metrics = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    expect = {"gen_ai.server.request.duration": REQUEST_DURATION_BUCKETS,
              "gen_ai.server.time_to_first_token": TTFT_BUCKETS,
              "gen_ai.server.time_per_output_token": TPOT_BUCKETS}
    for name, buckets in expect.items():
        (point,) = metrics[name].data.data_points
        assert list(point.explicit_bounds) == buckets and point.count == 3
        assert point.attributes["gen_ai.request.model"] == "demo"
        assert point.attributes["vllm_lookahead.decoder.method"] == "lookahead"
    assert REQUEST_DURATION_BUCKETS[-1] == 81.92 and TTFT_BUCKETS[0] == 0.001
    tokens = {p.attributes["gen_ai.token.type"]: p.value
              for p in metrics["vllm_lookahead.token.usage"].data.data_points}
    assert tokens == {"input": 9, "output": 12, "draft": 36, "accepted": 21}
