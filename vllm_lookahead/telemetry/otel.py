"""OpenTelemetry spans and metrics for finished requests (GenAI semantic conventions + lookahead).

Everything here runs on the telemetry thread (``FrontendTelemetry``), never on the request path.  The
providers are private to the plugin (not the global ones): vLLM's own ``--otlp-traces-endpoint``
tracer, or an ``opentelemetry-instrument`` set-up, keep working unchanged.  Exporters follow the
standard ``OTEL_*`` variables (see ``docs/telemetry.md``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

from .record import FinishedRequest, spec_summary

logger = logging.getLogger("vllm_lookahead.telemetry")

PROVIDER = "vllm"
NS = "vllm_lookahead"

# Explicit bucket boundaries from the GenAI metrics semantic conventions (seconds).
REQUEST_DURATION_BUCKETS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                            40.96, 81.92]
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
ACCEPTANCE_BUCKETS = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]


def _preset_id_generator_class() -> type:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class PresetIdGenerator(RandomIdGenerator):
        """Span/trace ids chosen by the frontend when the request finished (so the output sample
        can carry them before the span exists); random ids when none are preset."""

        def __init__(self) -> None:
            self._local = threading.local()

        def preset(self, trace_id: int, span_id: int) -> None:
            self._local.ids = (trace_id, span_id)

        def generate_span_id(self) -> int:
            ids = getattr(self._local, "ids", None)
            return ids[1] if ids and ids[1] else super().generate_span_id()

        def generate_trace_id(self) -> int:
            ids = getattr(self._local, "ids", None)
            return ids[0] if ids and ids[0] else super().generate_trace_id()

    return PresetIdGenerator


def _protocol(signal: str) -> str:
    return (os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
            or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc").strip().lower()


def make_span_exporter() -> Any | None:
    """Span exporter from OTEL_TRACES_EXPORTER (otlp|console|none) and the OTLP protocol variables."""
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")[0].strip().lower()
    if kind == "none":
        return None
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter
        return ConsoleSpanExporter()
    if kind != "otlp":
        raise ValueError(f"OTEL_TRACES_EXPORTER={kind!r}: vllm_lookahead supports otlp, console, none")
    proto = _protocol("TRACES")
    if proto == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        return OTLPSpanExporter()
    if proto in ("http/protobuf", "http"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExp,
        )
        return HttpExp()
    raise ValueError(f"OTLP traces protocol {proto!r}: expected grpc or http/protobuf")


def make_metric_reader() -> Any | None:
    kind = os.environ.get("OTEL_METRICS_EXPORTER", "otlp").split(",")[0].strip().lower()
    if kind == "none":
        return None
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    if kind == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter
        return PeriodicExportingMetricReader(ConsoleMetricExporter())
    if kind != "otlp":
        raise ValueError(f"OTEL_METRICS_EXPORTER={kind!r}: vllm_lookahead supports otlp, console, none")
    proto = _protocol("METRICS")
    if proto == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        return PeriodicExportingMetricReader(OTLPMetricExporter())
    if proto in ("http/protobuf", "http"):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter as HttpM,
        )
        return PeriodicExportingMetricReader(HttpM())
    raise ValueError(f"OTLP metrics protocol {proto!r}: expected grpc or http/protobuf")


def span_attributes(req: FinishedRequest, capture_content: bool) -> dict[str, Any]:
    """GenAI semconv attributes + timings + ``vllm_lookahead.*`` decoder/acceptance attributes."""
    a: dict[str, Any] = {
        "gen_ai.operation.name": req.operation,
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.request.model": req.model,
        "gen_ai.response.model": req.model,
        "gen_ai.response.id": req.request_id,
        "gen_ai.usage.input_tokens": req.num_prompt_tokens,
        "gen_ai.usage.output_tokens": req.num_output_tokens,
        "gen_ai.response.finish_reasons": [req.finish_reason or "unknown"],
        # vLLM's llm_request names for the timings (not semconv; APMs built on vLLM traces use them)
        "gen_ai.latency.e2e": req.e2e_s,
    }
    if req.num_cached_tokens:
        a["gen_ai.usage.cache_read.input_tokens"] = req.num_cached_tokens
    s = req.sampling
    for key, attr in (("temperature", "gen_ai.request.temperature"), ("top_p", "gen_ai.request.top_p"),
                      ("top_k", "gen_ai.request.top_k"), ("max_tokens", "gen_ai.request.max_tokens"),
                      ("seed", "gen_ai.request.seed"),
                      ("frequency_penalty", "gen_ai.request.frequency_penalty"),
                      ("presence_penalty", "gen_ai.request.presence_penalty")):
        value = s.get(key)
        if value is not None:
            a[attr] = value
    if s.get("n") not in (None, 1):
        a["gen_ai.request.choice.count"] = s["n"]
    if req.queue_s is not None:
        a["gen_ai.latency.time_in_queue"] = max(0.0, req.queue_s)
    ttft = req.ttft_s
    if ttft is not None:
        a["gen_ai.latency.time_to_first_token"] = ttft
    tpot = req.tpot()
    if tpot is not None:
        a[f"{NS}.time_per_output_token"] = tpot
    a[f"{NS}.decoder.method"] = req.decoder.method
    for key, value in req.decoder.params.items():
        if isinstance(value, (bool, int, float, str)):
            a[f"{NS}.decoder.{key}"] = value
    spec = spec_summary(req.spec)
    if spec is not None:
        a[f"{NS}.spec.num_drafts"] = spec["num_drafts"]
        a[f"{NS}.spec.steps"] = spec["steps"]
        a[f"{NS}.spec.draft_tokens"] = spec["num_draft_tokens"]
        a[f"{NS}.spec.accepted_tokens"] = spec["num_accepted_tokens"]
        if spec["acceptance_rate"] is not None:
            a[f"{NS}.spec.acceptance_rate"] = spec["acceptance_rate"]
        if spec["mean_accepted_length"] is not None:
            a[f"{NS}.spec.mean_accepted_length"] = spec["mean_accepted_length"]
    if req.is_error:
        a["error.type"] = (req.error or {}).get("type") or req.finish_reason or "error"
    if capture_content:
        a["gen_ai.input.messages"] = json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": req.prompt or ""}]}])
        a["gen_ai.output.messages"] = json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": req.output_text or ""}],
              "finish_reason": req.finish_reason or "unknown"}])
    return a


class OTelEmitter:
    """Owns the plugin's TracerProvider/MeterProvider; ``start`` on the telemetry thread."""

    def __init__(self, capture_content: bool = False, span_exporter: Any = None,
                 metric_reader: Any = None):
        self.capture_content = capture_content
        self._span_exporter = span_exporter
        self._metric_reader = metric_reader
        self.tracer: Any = None
        self.ids: Any = None
        self.tracer_provider: Any = None
        self.meter_provider: Any = None
        self.meter: Any = None
        self._instruments: dict[str, Any] = {}
        self._started = False
        self._stopped = False

    def start(self, on_meter: Any = None) -> None:
        if self._started:
            return
        self._started = True
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from vllm_lookahead import __version__ as plugin_version

        attrs = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "vllm"}
        resource = Resource.create(attrs)
        self.ids = _preset_id_generator_class()()
        # shutdown_on_exit=False: the SDK's own atexit hook would call the unbounded shutdown() again
        # and hold process exit for a whole export timeout; FrontendTelemetry's atexit hook calls
        # self.shutdown() (bounded) instead.
        self.tracer_provider = TracerProvider(resource=resource, id_generator=self.ids,
                                              shutdown_on_exit=False)
        exporter = self._span_exporter if self._span_exporter is not None else make_span_exporter()
        if exporter is not None:
            # BatchSpanProcessor: bounded queue (OTEL_BSP_MAX_QUEUE_SIZE), drops when full, exports on
            # its own thread -- a dead collector never blocks this thread either.
            self.tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.tracer_provider.get_tracer("vllm_lookahead", plugin_version)
        reader = self._metric_reader if self._metric_reader is not None else make_metric_reader()
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[reader] if reader else [],
                                            shutdown_on_exit=False)
        self.meter = self.meter_provider.get_meter("vllm_lookahead", plugin_version)
        m = self.meter
        self._instruments = {
            "duration": m.create_histogram(
                "gen_ai.server.request.duration", unit="s",
                description="Generative AI server request duration",
                explicit_bucket_boundaries_advisory=REQUEST_DURATION_BUCKETS),
            "ttft": m.create_histogram(
                "gen_ai.server.time_to_first_token", unit="s",
                description="Time to generate the first token",
                explicit_bucket_boundaries_advisory=TTFT_BUCKETS),
            "tpot": m.create_histogram(
                "gen_ai.server.time_per_output_token", unit="s",
                description="Time per output token after the first",
                explicit_bucket_boundaries_advisory=TPOT_BUCKETS),
            "acceptance": m.create_histogram(
                f"{NS}.spec.acceptance_rate", unit="1",
                description="Per-request draft acceptance rate (accepted / drafted tokens)",
                explicit_bucket_boundaries_advisory=ACCEPTANCE_BUCKETS),
            "tokens": m.create_counter(
                f"{NS}.token.usage", unit="{token}",
                description="Tokens by type: input, output, draft, accepted"),
        }
        if on_meter is not None:
            on_meter(self.meter)

    def emit(self, req: FinishedRequest) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        if not self._started:
            self.start()
        attrs = span_attributes(req, self.capture_content)
        assert self.ids is not None
        self.ids.preset(req.trace_id, req.span_id)
        kind = SpanKind.SERVER if req.parent is None or req.parent_is_remote else SpanKind.INTERNAL
        span = self.tracer.start_span(f"{req.operation} {req.model}", context=req.parent, kind=kind,
                                      attributes=attrs, start_time=int(req.arrival_unix_s * 1e9))
        self.ids.preset(0, 0)
        if req.finish_reason == "error" or req.error is not None:
            span.set_status(Status(StatusCode.ERROR, (req.error or {}).get("message", "error")))
        span.end(end_time=int(req.finish_unix_s * 1e9))
        self.record_metrics(req, attrs)

    def record_metrics(self, req: FinishedRequest, attrs: dict[str, Any]) -> None:
        labels = {"gen_ai.operation.name": req.operation, "gen_ai.provider.name": PROVIDER,
                  "gen_ai.request.model": req.model, f"{NS}.decoder.method": req.decoder.method}
        if "error.type" in attrs:
            labels = {**labels, "error.type": attrs["error.type"]}
        ins = self._instruments
        ins["duration"].record(req.e2e_s, labels)
        ttft = attrs.get("gen_ai.latency.time_to_first_token")
        if ttft is not None:
            ins["ttft"].record(ttft, labels)
        tpot = attrs.get(f"{NS}.time_per_output_token")
        if tpot is not None:
            ins["tpot"].record(tpot, labels)
        rate = attrs.get(f"{NS}.spec.acceptance_rate")
        if rate is not None:
            ins["acceptance"].record(rate, labels)
        tokens = ins["tokens"]
        tokens.add(req.num_prompt_tokens, {**labels, "gen_ai.token.type": "input"})
        tokens.add(req.num_output_tokens, {**labels, "gen_ai.token.type": "output"})
        if f"{NS}.spec.draft_tokens" in attrs:
            tokens.add(attrs[f"{NS}.spec.draft_tokens"], {**labels, "gen_ai.token.type": "draft"})
            tokens.add(attrs[f"{NS}.spec.accepted_tokens"], {**labels, "gen_ai.token.type": "accepted"})

    def shutdown(self, timeout_s: float) -> bool:
        """Flush and shut both providers down within ``timeout_s``; True when that finished in time.

        ``TracerProvider.shutdown()`` takes no timeout: it joins the batch processor's thread, which
        may be inside an OTLP export to a collector that accepts and never answers (10 s exporter
        timeout, then retries).  So the whole sequence runs on a daemon thread joined with the
        deadline; past it we return (process exit is not held up) and what was not exported is lost.
        """
        if self._stopped:
            return True
        self._stopped = True
        timeout_s = max(0.1, timeout_s)
        deadline = time.monotonic() + timeout_s

        def left_ms() -> int:
            return max(1, int((deadline - time.monotonic()) * 1000))

        def run() -> None:
            try:
                if self.tracer_provider is not None:
                    try:
                        self.tracer_provider.force_flush(left_ms())
                    finally:
                        self.tracer_provider.shutdown()
                if self.meter_provider is not None:
                    self.meter_provider.shutdown(timeout_millis=left_ms())
            except Exception:  # noqa: BLE001 (shutdown must not raise)
                logger.debug("OTel shutdown failed", exc_info=True)

        thread = threading.Thread(target=run, name="vllm-lookahead-otel-shutdown", daemon=True)
        thread.start()
        thread.join(timeout_s)
        if thread.is_alive():
            logger.warning("OpenTelemetry exporters did not shut down within %.1f s (collector not "
                           "answering?); unexported spans/metrics are dropped", timeout_s)
            return False
        return True
