"""Endpoint mode's HTTP client without vLLM: retries, backoff, timeouts, garbage, dead endpoints, and
the CLI's exit 2 with nothing written.

The misbehaving servers here are tiny ``http.server`` stubs: a real vLLM server cannot be made to
answer 503 twice and then recover, or to return HTML instead of JSON, on demand (fault injection).
The real-server tests are in test_gate_endpoint_vllm.py.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.process import free_port
from vllm_lookahead.gate.cli import main as gate_main
from vllm_lookahead.gate.endpoint import EndpointClient, EndpointError, EndpointOptions

pytestmark = pytest.mark.unit

Handler = Callable[[BaseHTTPRequestHandler, int], tuple[int, str]]


def _stub(answer: Handler) -> Iterator[str]:
    calls = {"n": 0}

    class H(BaseHTTPRequestHandler):
        def _go(self) -> None:
            calls["n"] += 1
            n = int(self.headers.get("Content-Length") or 0)
            if n:
                self.rfile.read(n)
            code, body = answer(self, calls["n"])
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        do_GET = do_POST = _go

        def log_message(self, *a: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        request_queue_size = 128

    srv = Server(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def _dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


FAST = EndpointOptions(timeout_s=2.0, retries=2, backoff_s=0.05)
GOOD = json.dumps({"choices": [{"text": " a + b", "token_ids": [5, 6], "finish_reason": "length",
                                "prompt_token_ids": [1, 2, 3]}]})


def test_retries_5xx_with_backoff_then_succeeds() -> None:
    gen = _stub(lambda h, n: (503, "busy") if n <= 2 else (200, GOOD))
    url = next(gen)
    try:
        c = EndpointClient("candidate", url, "m", FAST)
        t0 = time.perf_counter()
        out, _ = c.generate("p", 2, 0.0)
        assert out["token_ids"] == [5, 6] and out["prompt_token_ids"] == [1, 2, 3]
        assert time.perf_counter() - t0 >= 0.05 + 0.1  # two backoffs: 0.05 s, then 0.1 s
    finally:
        gen.close()


@pytest.mark.parametrize("code, body, words", [
    (200, "<html>oops</html>", "returned garbage (not JSON)"),
    (200, json.dumps({"choices": [{"text": "x"}]}), "no token ids"),
    (400, json.dumps({"error": "bad model"}), "rejected the request (HTTP 400)"),
    (503, "down", "HTTP 503"),
])
def test_garbage_and_errors_raise_clear_endpoint_errors(code: int, body: str, words: str) -> None:
    gen = _stub(lambda h, n: (code, body))
    url = next(gen)
    try:
        with pytest.raises(EndpointError, match=words.replace("(", r"\(").replace(")", r"\)")) as e:
            EndpointClient("candidate", url, "m", FAST).generate("p", 2, 0.0)
        assert "candidate endpoint" in str(e.value)
    finally:
        gen.close()


def test_timeout_is_retried_and_reported() -> None:
    def slow(h: BaseHTTPRequestHandler, n: int) -> tuple[int, str]:
        time.sleep(1.0)
        return 200, GOOD

    gen = _stub(slow)
    url = next(gen)
    try:
        c = EndpointClient("baseline", url, "m", EndpointOptions(timeout_s=0.2, retries=1, backoff_s=0.0))
        with pytest.raises(EndpointError, match=r"no answer within 0.2 s \(gave up after 2 attempts\)"):
            c.generate("p", 2, 0.0)
    finally:
        gen.close()


def test_dead_endpoint_is_unreachable() -> None:
    with pytest.raises(EndpointError, match="unreachable"):
        EndpointClient("candidate", _dead_url(), None, FAST).served_models()


def test_model_resolution_and_spec_counters() -> None:
    metrics = ("# HELP x\nvllm:spec_decode_num_drafts_total{engine=\"0\",model_name=\"m\"} 10.0\n"
               "vllm:spec_decode_num_draft_tokens_total{engine=\"0\",model_name=\"m\"} 40.0\n"
               "vllm:spec_decode_num_accepted_tokens_total{engine=\"0\",model_name=\"m\"} 25.0\n"
               "vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",position=\"1\"} 9.0\n"
               "vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",position=\"0\"} 10.0\n"
               "vllm:spec_decode_num_drafts_created{engine=\"0\"} 1.7e9\n")

    def answer(h: BaseHTTPRequestHandler, n: int) -> tuple[int, str]:
        if h.path == "/v1/models":
            return 200, json.dumps({"data": [{"id": "served-a"}, {"id": "served-b"}]})
        return 200, metrics

    gen = _stub(answer)
    url = next(gen)
    try:
        assert EndpointClient("baseline", url, None, FAST).resolve_model() == "served-a"
        assert EndpointClient("baseline", url, "served-b", FAST).resolve_model() == "served-b"
        with pytest.raises(EndpointError, match="does not serve model 'nope'"):
            EndpointClient("baseline", url, "nope", FAST).resolve_model()
        sc = EndpointClient("candidate", url, None, FAST).spec_counters()
        assert sc == {"num_drafts": 10.0, "num_draft_tokens": 40.0, "num_accepted_tokens": 25.0,
                      "num_accepted_tokens_per_pos": [10.0, 9.0]}
    finally:
        gen.close()


def test_bad_url_and_options_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert gate_main(["--baseline-url", "http://x:1"]) == 2
    assert "needs both --baseline-url and --candidate-url" in capsys.readouterr().err
    assert gate_main(["--baseline-url", "http://x:1", "--candidate-url", "http://y:1", "--candidate", "ngram:k=4"]) == 2
    assert "in-process mode" in capsys.readouterr().err
    assert gate_main(["--baseline-url", "ftp://x", "--candidate-url", "http://y:1"]) == 2
    assert "must start with http" in capsys.readouterr().err
    assert gate_main(["--baseline-url", "http://x:1", "--candidate-url", "http://y:1", "--concurrency", "0"]) == 2
    assert "concurrency >= 1" in capsys.readouterr().err


def test_cli_dead_candidate_exits_2_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A healthy-looking baseline stub, a dead candidate: exit 2, the message names the candidate, no report."""
    def answer(h: BaseHTTPRequestHandler, n: int) -> tuple[int, str]:
        if h.path == "/v1/models":
            return 200, json.dumps({"data": [{"id": "m"}]})
        return 200, GOOD

    gen = _stub(answer)
    url = next(gen)
    dead = _dead_url()
    try:
        rc = gate_main(["--baseline-url", url, "--candidate-url", dead, "--retries", "1", "--timeout", "2",
                        "--report", str(tmp_path / "rep"), "--limit", "1"])
    finally:
        gen.close()
    err = capsys.readouterr().err
    assert rc == 2
    assert f"candidate endpoint {dead}/v1/models: unreachable" in err and "gave up after 2 attempts" in err
    assert not (tmp_path / "rep").exists()


def test_github_actions_example_uses_real_flags() -> None:
    """docs/examples/gate-endpoints.yml stays in step with the CLI: every flag it passes exists."""
    import re

    import yaml

    from tests.support.paths import REPO_ROOT
    from vllm_lookahead.gate.cli import build_parser

    wf = yaml.safe_load((REPO_ROOT / "docs" / "examples" / "gate-endpoints.yml").read_text())
    script = next(s["run"] for s in wf["jobs"]["gate"]["steps"] if "vllm-lookahead gate" in s.get("run", ""))
    flags = set(re.findall(r"(--[a-z][a-z-]+)", script))
    known = {o for a in build_parser()._actions for o in a.option_strings}
    assert {"--baseline-url", "--candidate-url", "--junit"} <= flags and flags <= known, flags - known


def test_truncated_answer_is_an_endpoint_error_not_a_crash() -> None:
    """A body cut short (Content-Length 100, 10 bytes sent, connection closed): retried, then EndpointError."""
    class Short(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b'{"choices"')
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)

        def log_message(self, *a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Short)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        c = EndpointClient("candidate", f"http://127.0.0.1:{srv.server_address[1]}", "m", FAST)
        with pytest.raises(EndpointError, match=r"candidate endpoint .*(broken answer|unreachable|garbage)"):
            c.generate("p", 2, 0.0)
    finally:
        srv.shutdown()
        srv.server_close()
