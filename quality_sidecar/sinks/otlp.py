"""Optional OTLP metrics export, configured only by the standard ``OTEL_*`` environment variables.

Enabled when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` is set (and
``OTEL_METRICS_EXPORTER`` is not ``none``).  The exporter protocol follows
``OTEL_EXPORTER_OTLP_PROTOCOL`` (grpc default, or http/protobuf); the interval follows
``OTEL_METRIC_EXPORT_INTERVAL`` (ms).  Instruments are observable and read the Prometheus registry at
export time, so both sinks always agree: a Prometheus counter becomes an OTel observable *counter*
(a cumulative monotonic sum; a collector's Prometheus exporter shows it as ``<name>_total`` again, and
APMs can take rates of it), a gauge becomes an observable gauge.  The last values are exported on
shutdown.
"""

from __future__ import annotations

import logging
import os

from .metrics import Metrics

log = logging.getLogger(__name__)


def otlp_enabled() -> bool:
    if os.environ.get("OTEL_METRICS_EXPORTER", "otlp").lower() == "none":
        return False
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"))


def start_otlp(metrics: Metrics):
    """Start a periodic OTLP exporter mirroring every sidecar metric; returns the provider or None."""
    if not otlp_enabled():
        return None
    from opentelemetry.metrics import Observation
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    proto = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"))
    if proto.startswith("http"):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    reader = PeriodicExportingMetricReader(OTLPMetricExporter())
    provider = MeterProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "quality-sidecar")}),
                             metric_readers=[reader])
    meter = provider.get_meter("quality_sidecar")

    def callback_for(family_name: str):
        def cb(_options):
            for fam in metrics.registry.collect():
                if fam.name != family_name:
                    continue
                for s in fam.samples:
                    if s.name.endswith("_created"):
                        continue
                    yield Observation(s.value, dict(s.labels))
        return cb

    for fam in metrics.registry.collect():
        create = {"counter": meter.create_observable_counter,
                  "gauge": meter.create_observable_gauge}.get(fam.type)
        if create is None:  # the registry holds counters and gauges only (see metrics.py)
            raise TypeError(f"no OTLP mapping for Prometheus {fam.type} {fam.name}")
        create(fam.name, callbacks=[callback_for(fam.name)], description=fam.documentation)
    log.info("OTLP metrics export on (%s)", proto)
    return provider
