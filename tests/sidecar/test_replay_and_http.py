"""Baseline replay client and the HTTP endpoints.

The replay test serves ``/v1/completions`` from a tiny local HTTP server started in the test: a real
vLLM OpenAI server with the demo model takes 20-60 s to start on this machine, too slow for the
sidecar's test budget; the server here returns token ids the way vLLM does with
``return_token_ids: true`` and records what the client sent.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from quality_sidecar.pipeline import Pipeline
from quality_sidecar.replay import BaselineReplayClient, ReplayWorker
from quality_sidecar.service import ServiceConfig
from quality_sidecar.sinks import HttpServer, Metrics
from tests.support.synth import SampleStream

pytestmark = pytest.mark.unit


class _Baseline(BaseHTTPRequestHandler):
    requests: list[dict] = []
    corrupt = False

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Baseline.requests.append(body)
        k = int(body["prompt"].split("task_")[1].split("(")[0])
        ids = SampleStream().baseline_ids(k)[: body["max_tokens"]]
        if _Baseline.corrupt:
            ids = [i + 1 for i in ids]
        out = json.dumps({"choices": [{"text": "x", "token_ids": ids, "finish_reason": "stop"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *a):
        pass


@pytest.fixture
def baseline_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Baseline)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    _Baseline.requests, _Baseline.corrupt = [], False
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_replay_pairs_greedy_outputs_and_flags_a_broken_candidate(baseline_server):
    client = BaselineReplayClient(baseline_server)
    s = SampleStream(seed=1, greedy_fraction=1.0).one()
    got = client.complete(s["prompt"]["text"], len(s["output"]["token_ids"]), model=s["model"])
    assert got["token_ids"] == s["output"]["token_ids"]
    assert _Baseline.requests[-1]["temperature"] == 0.0 and _Baseline.requests[-1]["return_token_ids"] is True

    pipe = Pipeline(ServiceConfig.from_dict({"monitor": {"reference_size": 200, "exact_match_block": 50}}))
    worker = ReplayWorker(client, pipe.add_replay_pair, fraction=1.0)
    try:
        # baseline-arm replays are the measured A/A reference; candidate replays the test
        samples = [*SampleStream(seed=4, arm="baseline", greedy_fraction=1.0).take(60),
                   *SampleStream(seed=2, greedy_fraction=1.0).take(60)]
        for x in samples:
            worker.submit(x)
        deadline = time.time() + 30
        while worker.counts["done"] < 120 and time.time() < deadline:
            time.sleep(0.05)
        assert worker.counts["done"] == 120 and pipe.charts.pairs["demo-code-4l"].detector.exact_match_rate == 1.0
        assert not pipe.alarm_log
        _Baseline.corrupt = True  # the baseline now disagrees on every token: a broken decoder
        for x in SampleStream(seed=3, greedy_fraction=1.0).take(60):
            worker.submit(x)
        while worker.counts["done"] < 180 and time.time() < deadline + 30:
            time.sleep(0.05)
    finally:
        worker.close()
    assert [e["detector"] for e in pipe.alarm_log] == ["exact_match"]
    assert pipe.alarm_log[0]["example_trace_ids"]


def test_http_endpoints():
    m = Metrics()
    m.samples.labels("m", "candidate").inc(3)
    srv = HttpServer(m, 0, host="127.0.0.1")
    base = f"http://127.0.0.1:{srv.port}"
    try:
        body = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
        assert 'quality_sidecar_samples_total{arm="candidate",model="m"} 3.0' in body
        assert urllib.request.urlopen(base + "/healthz", timeout=5).status == 200
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(base + "/readyz", timeout=5)
        assert e.value.code == 503
        srv.ready = True
        assert urllib.request.urlopen(base + "/readyz", timeout=5).status == 200
    finally:
        srv.close()
