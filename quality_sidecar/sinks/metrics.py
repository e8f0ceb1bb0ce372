"""Prometheus metrics (names fixed by docs/CONTRACTS.md) and the one HTTP port that serves them.

``/metrics``, ``/healthz`` (200 while the consume loop has ticked within ``stall_s``), ``/readyz``
(200 once the source is connected and the classifiers are loaded, 503 while a baseline server the
sidecar depends on keeps failing).  Each service owns its ``CollectorRegistry``, so tests can run
several in one process.

Alarm control (``control``: the service's ``Pipeline``), answering JSON: ``GET /alarms``; ``POST
/alarms/{detector}/ack[?model=&arm=&by=]`` (``404`` when none matched), ``POST /alarms/clear[?...]``
(all), ``POST /rebaseline[?...]``.  Alarms latch until acknowledged, so that an alarm nobody saw is
not lost.  The POSTs change what the sidecar watches: with ``QUALITY_SIDECAR_CONTROL_TOKEN`` set they
need ``Authorization: Bearer <token>`` (``401`` otherwise).
"""

from __future__ import annotations

import hmac
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.samples = Counter("quality_sidecar_samples", "Valid samples processed", ["model", "arm"], registry=r)
        self.dlq = Counter("quality_sidecar_dlq", "Messages sent to the dead-letter queue", ["reason"], registry=r)
        self.lag = Gauge("quality_sidecar_consumer_lag", "Messages behind the partition end",
                         ["topic", "partition"], registry=r)
        # Consumer lag in kafka-lag-exporter's names and labels, per partition this member owns, from
        # the group's committed offset (dashboards and alerts built for that exporter work unchanged).
        group_labels = ["cluster_name", "group", "topic", "partition", "member_host", "consumer_id", "client_id"]
        self.group_offset = Gauge("kafka_consumergroup_group_offset",
                                  "The group's committed offset (next record to process) of a partition",
                                  group_labels, registry=r)
        self.group_lag = Gauge("kafka_consumergroup_group_lag",
                               "Partition end offset minus the group's committed offset", group_labels, registry=r)
        self.group_lag_seconds = Gauge("kafka_consumergroup_group_lag_seconds",
                                       "Estimated age of the oldest uncommitted record (0 when caught up)",
                                       group_labels, registry=r)
        self.partition_latest_offset = Gauge("kafka_partition_latest_offset", "End offset of a partition",
                                             ["cluster_name", "topic", "partition"], registry=r)
        self.alarm = Gauge("quality_sidecar_alarm", "1 while the detector is in alarm",
                           ["detector", "model", "arm"], registry=r)
        self.alarms = Counter("quality_sidecar_alarms", "Alarms raised", ["detector", "model", "arm"], registry=r)
        self.statistic = Gauge("quality_sidecar_detector_statistic", "Current detector statistic",
                               ["detector", "model", "arm"], registry=r)
        self.pvalue = Gauge("quality_sidecar_detector_pvalue", "Latest (Holm-adjusted) p-value",
                            ["detector", "model", "arm"], registry=r)
        self.rate = Gauge("quality_sidecar_behaviour_rate", "Flag rate over the last window",
                          ["classifier", "model", "arm"], registry=r)
        self.exact = Gauge("quality_sidecar_exact_match_rate", "T=0 paired exact-match rate", ["model"], registry=r)
        self.acceptance = Gauge("quality_sidecar_acceptance_rate", "Mean draft acceptance over the last window",
                                ["model", "arm"], registry=r)
        # T>0 sampling conformance (quality_sidecar/baseline_scoring.py): scored under the baseline server
        self.conformance_monitored = Gauge(
            "quality_sidecar_conformance_monitored",
            "1 when T>0 outputs are scored under a baseline server (--baseline-url), 0 when T>0 conformance "
            "is NOT monitored", registry=r)
        self.conformance_scored = Counter("quality_sidecar_conformance_scored_samples",
                                          "T>0 samples scored under the baseline model", ["model", "arm"], registry=r)
        self.conformance_selected = Counter("quality_sidecar_conformance_selected_samples",
                                            "T>0 samples drawn for scoring (scored / selected = the scored share)",
                                            ["model", "arm"], registry=r)
        self.conformance_tokens = Counter("quality_sidecar_conformance_scored_tokens",
                                          "Output tokens of the scored T>0 samples", ["model", "arm"], registry=r)
        self.conformance_skipped = Counter("quality_sidecar_conformance_skipped_samples",
                                           "T>0 samples the scorer cannot judge, by model, arm and reason (aborted, "
                                           "min_tokens, no_token_ids, penalties, allowed_token_ids, bad_words, "
                                           "logits_modified, structured_output)",
                                           ["model", "arm", "reason"], registry=r)
        self.exact_check_skipped = Counter("quality_sidecar_exact_check_skipped_samples",
                                           "Samples an exact check (allowed_token_ids, bad_words) cannot run on, by "
                                           "reason: too_many_ids (only the set's hash recorded), not_tokenized (bad "
                                           "words recorded as strings), not_recorded (schema < 1.6), no_token_ids",
                                           ["model", "arm", "check", "reason"], registry=r)
        self.worker_failed = Counter("quality_sidecar_baseline_failed_samples",
                                     "Samples a baseline-server worker gave up, by reason: answers a retry "
                                     "cannot change (rejected, rejected_token_ids, bad_response, error); "
                                     "timeouts, refused connections, 408/429/5xx are retried until answered",
                                     ["worker", "arm", "reason"], registry=r)
        self.baseline_up = Gauge("quality_sidecar_baseline_up",
                                 "0 while the baseline server keeps failing (then /readyz answers 503)",
                                 ["worker"], registry=r)
        self.backpressure = Gauge("quality_sidecar_backpressure",
                                  "1 while the source is paused because a baseline-server worker is behind",
                                  ["worker"], registry=r)
        self.worker_pending = Gauge("quality_sidecar_worker_pending_samples",
                                    "Samples queued or in flight at a baseline-server worker", ["worker"], registry=r)
        self.impossible = Counter("quality_sidecar_impossible_tokens",
                                  "Sampled tokens outside the request's sampler support, by the parameter that "
                                  "excludes them (top_p, top_k, min_p, vocab, min_tokens, allowed_token_ids, "
                                  "bad_words); 0 under exact sampling",
                                  ["model", "arm", "reason"], registry=r)
        self.replay_samples = Counter("quality_sidecar_replay_samples",
                                      "Greedy and seeded T>0 samples re-asked of the baseline server for exact match, "
                                      "by outcome (done, failed, retries, skipped_<reason>)",
                                      ["outcome"], registry=r)
        self.replay_skipped = Counter("quality_sidecar_replay_skipped_samples",
                                      "Greedy and seeded T>0 samples not replayed, by reason: dtype_mismatch (served at "
                                      "another dtype than the baseline server's --baseline-dtype), no_prompt, "
                                      "not_seeded_exact, not_replayable, n_gt_1",
                                      ["model", "arm", "reason"], registry=r)
        self.conformance_logprob = Gauge("quality_sidecar_conformance_mean_token_logprob_nats",
                                         "Mean token log-prob of scored T>0 outputs under the baseline model",
                                         ["model", "arm"], registry=r)
        self.conformance_shift = Gauge("quality_sidecar_conformance_logprob_shift_nats_per_token",
                                       "Candidate - baseline mean token log-prob under the baseline model",
                                       ["model"], registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class HttpServer:
    """``/metrics``, ``/healthz``, ``/readyz`` and the alarm control endpoints, in a daemon thread."""

    def __init__(self, metrics: Metrics, port: int, host: str = "0.0.0.0", stall_s: float = 60.0):
        self.metrics, self.stall_s = metrics, stall_s
        self.control: Any = None  # set by the service: its Pipeline (active_alarms, acknowledge, rebaseline)
        self.ready = False
        self.heartbeat = time.monotonic()
        # name -> callable: /readyz is 503 while any returns False (a baseline server that keeps failing)
        self.checks: dict[str, Any] = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                path = self.path.split("?")[0]
                if path == "/metrics":
                    self._send(200, outer.metrics.render(), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    ok = time.monotonic() - outer.heartbeat < outer.stall_s
                    self._send(200 if ok else 503, b"ok\n" if ok else b"consume loop stalled\n")
                elif path == "/readyz":
                    failing = [name for name, ok in outer.checks.items() if not ok()]
                    if outer.ready and not failing:
                        self._send(200, b"ready\n")
                    else:
                        why = f"not ready: {', '.join(failing)} failing\n" if failing else "not ready\n"
                        self._send(503, why.encode())
                elif path == "/alarms" and outer.control is not None:
                    self._json(200, {"alarms": outer.control.active_alarms()})
                else:
                    self._send(404, b"not found: try /metrics /healthz /readyz /alarms\n")

            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                url = urlsplit(self.path)
                q = {k: v[-1] for k, v in parse_qs(url.query).items()}
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)  # no body is used; read it so the connection stays sane
                if outer.control is None:
                    self._json(404, {"error": "no alarm control on this server"})
                    return
                token = os.environ.get("QUALITY_SIDECAR_CONTROL_TOKEN")
                if token and not hmac.compare_digest(self.headers.get("Authorization", ""), f"Bearer {token}"):
                    self._json(401, {"error": "POST needs Authorization: Bearer $QUALITY_SIDECAR_CONTROL_TOKEN"})
                    return
                parts = [unquote(p) for p in url.path.strip("/").split("/")]
                who = {"model": q.get("model"), "arm": q.get("arm"), "by": q.get("by")}
                if len(parts) == 3 and parts[0] == "alarms" and parts[2] == "ack":
                    done = outer.control.acknowledge(parts[1], **who)
                    self._json(200 if done else 404, {"acknowledged": done} if done else
                               {"acknowledged": [], "error": f"no latched alarm of {parts[1]!r} matches"})
                elif parts == ["alarms", "clear"]:
                    self._json(200, {"acknowledged": outer.control.acknowledge(None, **who)})
                elif parts == ["rebaseline"]:
                    self._json(200, {"rebaselined": outer.control.rebaseline(**who)})
                else:
                    self._json(404, {"error": "try POST /alarms/{detector}/ack, /alarms/clear or /rebaseline"})

            def _json(self, code: int, obj: Any) -> None:
                self._send(code, (json.dumps(obj) + "\n").encode(), "application/json")

            def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="sidecar-http", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
