"""A real Jaeger v2 all-in-one (OTLP receiver + in-memory store + query API) on free loopback ports.

Used by the telemetry tests and benchmarks; the binary comes from ``scripts/setup.sh jaeger``.

    with JaegerServer() as jaeger:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = jaeger.otlp_grpc_endpoint   # or otlp_http_endpoint
        ...
        trace = jaeger.wait_for_trace(trace_id_hex, min_spans=1)

Jaeger v2 is an OpenTelemetry Collector build; the ports are set in a generated config file (the
defaults 4317/4318/16686/13133/8888 may be taken by another service on the machine).  Being a
collector, it also runs a *metrics* pipeline here: the same OTLP receiver feeds the collector's
``prometheus`` exporter, so a test reads back OTLP metrics exactly as a collector received them
(Prometheus text at ``http://127.0.0.1:{ports["prometheus"]}/metrics``).
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .paths import tool
from .process import Service, free_port, log_tail, spawn, stop_process_group

_CONFIG = """\
service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
    metrics:
      receivers: [otlp]
      exporters: [prometheus]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn

extensions:
  healthcheckv2:
    use_v2: true
    http:
      endpoint: 127.0.0.1:{health}
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:{query_http}
    grpc:
      endpoint: 127.0.0.1:{query_grpc}
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000

receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{otlp_grpc}
      http:
        endpoint: 127.0.0.1:{otlp_http}

processors:
  batch:
    timeout: 200ms

exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
  prometheus:
    endpoint: 127.0.0.1:{prometheus}
    resource_to_telemetry_conversion:
      enabled: true
"""


class JaegerServer(Service):
    def __init__(self, workdir: Path | None = None):
        super().__init__(workdir, "jaeger-")
        self.ports = {name: free_port() for name in
                      ("otlp_grpc", "otlp_http", "query_http", "query_grpc", "health",
                                   "prometheus")}
        self.proc: subprocess.Popen | None = None

    @property
    def otlp_grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['otlp_grpc']}"

    @property
    def otlp_http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['otlp_http']}"

    @property
    def query_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['query_http']}"

    def start(self, timeout: float = 60.0) -> JaegerServer:
        binary = tool("jaeger")
        config = self.workdir / "jaeger.yaml"
        config.write_text(_CONFIG.format(**self.ports))
        self.proc = spawn([str(binary), "--config", str(config)], self.workdir / "jaeger.log")
        self.wait_ready(timeout)
        return self

    def log_tail(self, n: int = 30) -> str:
        return log_tail(self.workdir / "jaeger.log", n)

    def wait_ready(self, timeout: float) -> None:
        """Block until the health check says OK and the query API answers."""
        deadline = time.time() + timeout
        last: Exception | str | None = None
        while time.time() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"jaeger exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['health']}/status",
                                            timeout=2) as r:
                    if r.status == 200:
                        self._get("/api/services")
                        return
            except (OSError, urllib.error.URLError) as e:
                last = e
            time.sleep(0.2)
        raise TimeoutError(f"jaeger not ready after {timeout:.0f} s: {last!r}\n{self.log_tail()}")

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(self.query_url + path, timeout=5) as r:
            return json.loads(r.read())

    def services(self) -> list[str]:
        return list(self._get("/api/services").get("data") or [])

    def get_trace(self, trace_id: str) -> dict[str, Any] | None:
        """The trace in Jaeger's JSON model (``spans`` with ``tags``), None when not (yet) stored."""
        try:
            data = self._get(f"/api/traces/{trace_id}").get("data") or []
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise
        return data[0] if data else None

    def wait_for_trace(self, trace_id: str, min_spans: int = 1, timeout: float = 30.0,
                       predicate: Any = None) -> dict[str, Any]:
        """Poll the query API until the trace has ``min_spans`` spans (and ``predicate(trace)``)."""
        deadline = time.time() + timeout
        trace = None
        while time.time() < deadline:
            trace = self.get_trace(trace_id)
            if trace is not None and len(trace.get("spans", [])) >= min_spans and (
                    predicate is None or predicate(trace)):
                return trace
            time.sleep(0.3)
        raise TimeoutError(f"trace {trace_id} not in jaeger after {timeout:.0f} s (last: {trace})")

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is not None:
            stop_process_group(self.proc, timeout)
        self.proc = None


def span_tags(span: dict[str, Any]) -> dict[str, Any]:
    """Jaeger JSON tags of one span as a plain dict (arrays arrive JSON-encoded as strings)."""
    return {t["key"]: t["value"] for t in span.get("tags", [])}
