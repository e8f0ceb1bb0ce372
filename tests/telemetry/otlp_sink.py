"""A minimal OTLP trace receiver (gRPC + HTTP/protobuf) with a Jaeger-shaped query method.

Stand-in for Jaeger while `scripts/setup.sh jaeger` has not produced the binary (select it with
``VLLM_LOOKAHEAD_TEST_OTLP_RECEIVER=python``).  It speaks the real OTLP wire protocols (the
opentelemetry-proto service definitions), so the exporters under test talk to it exactly as to a
collector; ``wait_for_trace`` returns the trace in Jaeger's JSON shape (``spans`` with ``tags``,
``references``; arrays as JSON strings, ``span.kind`` as a tag) so the same assertions run on both.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.process import free_port

_KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return json.dumps([_value(x) for x in v.array_value.values])
    if kind == "int_value":
        return int(v.int_value)
    return getattr(v, kind) if kind else None


class OtlpReceiver:
    def __init__(self) -> None:
        self.grpc_port = free_port()
        self.http_port = free_port()
        self._spans: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._grpc: Any = None
        self._http: ThreadingHTTPServer | None = None

    @property
    def otlp_grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def otlp_http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def _ingest(self, request: Any) -> None:
        spans = []
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for s in ss.spans:
                    tags = [{"key": a.key, "value": _value(a.value)} for a in s.attributes]
                    tags.append({"key": "span.kind", "value": _KINDS.get(s.kind, "unspecified")})
                    refs = []
                    if s.parent_span_id:
                        refs.append({"refType": "CHILD_OF", "traceID": s.trace_id.hex(),
                                     "spanID": s.parent_span_id.hex()})
                    spans.append({"traceID": s.trace_id.hex(), "spanID": s.span_id.hex(),
                                  "operationName": s.name, "references": refs, "tags": tags})
        with self._lock:
            self._spans.extend(spans)

    def start(self) -> OtlpReceiver:
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as pb_grpc

        receiver = self

        class Service(pb_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC method name)
                receiver._ingest(request)
                return pb.ExportTraceServiceResponse()

        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_TraceServiceServicer_to_server(Service(), self._grpc)
        self._grpc.add_insecure_port(f"127.0.0.1:{self.grpc_port}")
        self._grpc.start()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                req = pb.ExportTraceServiceRequest()
                req.ParseFromString(body)
                receiver._ingest(req)
                out = pb.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", self.http_port), Handler)
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        return self

    def get_trace(self, trace_id: str) -> dict[str, Any] | None:
        with self._lock:
            spans = [s for s in self._spans if s["traceID"] == trace_id]
        return {"traceID": trace_id, "spans": spans} if spans else None

    def wait_for_trace(self, trace_id: str, min_spans: int = 1, timeout: float = 30.0,
                       predicate: Any = None) -> dict[str, Any]:
        deadline = time.time() + timeout
        trace = None
        while time.time() < deadline:
            trace = self.get_trace(trace_id)
            if trace is not None and len(trace["spans"]) >= min_spans and (
                    predicate is None or predicate(trace)):
                return trace
            time.sleep(0.2)
        raise TimeoutError(f"trace {trace_id} not received after {timeout:.0f} s (last: {trace})")

    def close(self) -> None:
        if self._grpc is not None:
            self._grpc.stop(grace=1).wait(5)
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
