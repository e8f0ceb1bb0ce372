"""Outputs of the sidecar: Prometheus/HTTP, OTLP metrics, alert events and the dead-letter queue."""

from .events import AlertSink, JsonWriter, dlq_record
from .metrics import HttpServer, Metrics
from .otlp import start_otlp

__all__ = ["AlertSink", "HttpServer", "JsonWriter", "Metrics", "dlq_record", "start_otlp"]
