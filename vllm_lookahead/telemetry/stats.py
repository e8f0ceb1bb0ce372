"""Sampler health counters, exported to Prometheus (vLLM's ``/metrics``) and to OpenTelemetry.

Counters are plain ints: the request path pays one integer add, never a lock.  The request-path
fields (finished, sampled, dropped[queue_full], otel_dropped) are written by the frontend thread
only; sent/failed, which kafka-python's IO thread also updates, are changed under the Kafka sink's
lock.  Exporters read them lazily (a Prometheus collector, OTel observable counters).
Names are fixed by docs/CONTRACTS.md.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

logger = logging.getLogger("vllm_lookahead.telemetry")

DROP_REASONS = ("queue_full", "backpressure", "invalid", "too_large", "shutdown")


class SamplerStats:
    def __init__(self) -> None:
        self.finished = 0  # finished requests seen (sampled or not)
        self.sampled = 0
        self.sent = 0
        self.failed = 0
        self.otel_dropped = 0  # finished requests whose span was dropped (telemetry queue full)
        self.dropped: defaultdict[str, int] = defaultdict(int)
        for reason in DROP_REASONS:
            self.dropped[reason] = 0

    def snapshot(self) -> dict[str, Any]:
        return {"finished": self.finished, "sampled": self.sampled, "sent": self.sent,
                "failed": self.failed, "otel_dropped": self.otel_dropped, "dropped": dict(self.dropped),
                "dropped_total": sum(self.dropped.values())}


class _PromCollector:
    """prometheus_client custom collector over one SamplerStats."""

    def __init__(self, stats: SamplerStats):
        self.stats = stats

    def describe(self) -> Iterable[Any]:
        return []

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily

        s = self.stats
        for name, doc, value in (
            ("vllm_lookahead_sampler_sampled", "Finished requests chosen for an output sample", s.sampled),
            ("vllm_lookahead_sampler_sent", "Samples acknowledged by the sink", s.sent),
            ("vllm_lookahead_sampler_failed", "Samples the sink failed to deliver", s.failed),
            ("vllm_lookahead_otel_spans_dropped", "Spans dropped because the telemetry queue was full",
             s.otel_dropped),
        ):
            fam = CounterMetricFamily(name, doc)
            fam.add_metric([], value)
            yield fam
        fam = CounterMetricFamily("vllm_lookahead_sampler_dropped",
                                  "Samples dropped before the sink, by reason", labels=["reason"])
        for reason, value in sorted(s.dropped.items()):
            fam.add_metric([reason], value)
        yield fam


_prom_lock = threading.Lock()
_prom_registered: _PromCollector | None = None


def register_prometheus(stats: SamplerStats) -> None:
    """Expose ``stats`` in the default prometheus_client registry (the one vLLM's /metrics serves).

    Re-registering (a second install in the same process) points the collector at the new stats.
    """
    global _prom_registered
    try:
        from prometheus_client import REGISTRY
    except ImportError:  # pragma: no cover - prometheus_client ships with vLLM
        return
    with _prom_lock:
        if _prom_registered is None:
            _prom_registered = _PromCollector(stats)
            REGISTRY.register(_prom_registered)
        else:
            _prom_registered.stats = stats


def register_otel(stats: SamplerStats, meter: Any) -> None:
    """The same counters as OTel observable counters on ``meter``."""
    from opentelemetry.metrics import CallbackOptions, Observation

    def cb(attr: str):
        def callback(_: CallbackOptions) -> Iterable[Observation]:
            return [Observation(getattr(stats, attr))]
        return callback

    for attr in ("sampled", "sent", "failed"):
        meter.create_observable_counter(f"vllm_lookahead.sampler.{attr}", callbacks=[cb(attr)],
                                        unit="{sample}")

    def dropped(_: CallbackOptions) -> Iterable[Observation]:
        return [Observation(v, {"reason": r}) for r, v in list(stats.dropped.items())]

    meter.create_observable_counter("vllm_lookahead.sampler.dropped", callbacks=[dropped],
                                    unit="{sample}")
