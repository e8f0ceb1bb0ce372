"""A crashing candidate is a FAIL verdict, not "no verdict" (exit 1, not 2), without vLLM.

Endpoint mode against tiny ``http.server`` stubs: a real vLLM server cannot be made to die on one
chosen prompt, or on one sampling profile, on demand (fault injection; the real engine's crash is in
test_gate_crash_vllm.py).  The baseline stub answers everything; the candidate stub passes the
preflight and then answers 500 (what vLLM's server returns once its engine is dead) where told.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from vllm_lookahead.decoders import parse_spec
from vllm_lookahead.gate.cli import main as gate_main
from vllm_lookahead.gate.endpoint import PROBE_PROMPT, EndpointClient, EndpointOptions, HttpEngine
from vllm_lookahead.gate.engine import RunCrashed
from vllm_lookahead.gate.evalset import DEFAULT_EVAL_SET, load_eval_set
from vllm_lookahead.gate.policy import load_policy
from vllm_lookahead.gate.profiles import SamplingProfile
from vllm_lookahead.gate.run import GateInputs, crashed

pytestmark = pytest.mark.unit

GOOD = json.dumps({"choices": [{"text": " a + b", "token_ids": [5, 6], "finish_reason": "length",
                                "prompt_token_ids": [1, 2, 3]}]})
DEAD = json.dumps({"error": {"message": "EngineCore encountered an issue. See stack trace for the root cause.",
                             "type": "InternalServerError", "code": 500}})
ITEMS = load_eval_set(DEFAULT_EVAL_SET, limit=1, tasks=["next_line", "copy", "json"])


@pytest.fixture
def stub() -> Iterator[Callable[[Callable[[str, dict], bool]], str]]:
    """``stub(dies)``: a vLLM-like server that answers 500 to every completion ``dies(path, body)``."""
    servers: list[ThreadingHTTPServer] = []

    def start(dies: Callable[[str, dict], bool]) -> str:
        class H(BaseHTTPRequestHandler):
            def _go(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else {}
                if self.path == "/v1/models":
                    code, text = 200, json.dumps({"data": [{"id": "m"}]})
                else:
                    code, text = (500, DEAD) if dies(self.path, body) else (200, GOOD)
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text.encode())

            do_GET = do_POST = _go

            def log_message(self, *a: object) -> None:
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def test_http_run_names_the_request_and_profile_that_killed_the_endpoint(stub: Callable[..., str]) -> None:
    """Only top-k requests of the second item die: the crash names that item, sample 1, the top-k profile."""
    target = ITEMS[1]
    url = stub(lambda path, b: path == "/v1/completions" and b.get("prompt") == target.prompt and b.get("top_k"))
    profiles = [SamplingProfile(0.8), SamplingProfile(1.0, top_p=0.9, top_k=50)]
    eng = HttpEngine(EndpointClient("candidate", url, "m", EndpointOptions(timeout_s=2.0, retries=1, backoff_s=0.01)))
    assert len(eng.run("candidate", ITEMS, concurrency=4).records) == len(ITEMS)  # greedy: served
    with pytest.raises(RunCrashed) as e:
        eng.run("candidate T>0", ITEMS, concurrency=1, profiles=profiles, samples=4)
    crash = e.value.to_json()
    assert crash["run"] == "candidate T>0" and crash["profile_label"] == "T=1 top_p=0.9 top_k=50"
    assert crash["requests"] == [{"item_id": target.id, "item_index": 1, "sample": 1}]
    assert "HTTP 500" in crash["error"] and "gave up after 2 attempts" in crash["error"]


def test_cli_candidate_endpoint_dying_after_the_baseline_is_fail_with_report_and_junit(
        stub: Callable[..., str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The baseline serves every request; the candidate passes preflight, then dies on one prompt:
    exit 1 (not 2), and report.json, summary.md, report.html and the JUnit copy name the request."""
    target = ITEMS[2]
    base = stub(lambda path, b: False)
    cand = stub(lambda path, b: b.get("prompt") == target.prompt)
    policy = tmp_path / "policy.yaml"
    policy.write_text("criteria:\n  sampled: {samples_per_item: 0, required: false}\nruns: {latency_items: 1}\n")
    report, junit = tmp_path / "rep", tmp_path / "ci" / "gate.xml"
    rc = gate_main(["--baseline-url", base, "--candidate-url", cand, "--retries", "0", "--policy", str(policy),
                    "--limit", "1", "--tasks", "next_line,copy,json", "--report", str(report), "--junit", str(junit)])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "verdict: FAIL (failed: candidate_completes)" in out and target.id in out
    result = json.loads((report / "report.json").read_text())
    assert result["verdict"] == "FAIL" and result["meta"]["mode"] == "endpoint"
    crash = result["crash"]
    assert crash["run"] == "candidate" and crash["profile_label"] == "T=0 (greedy)"
    assert crash["requests"] == [{"item_id": target.id, "item_index": 2, "sample": 0}]
    assert "HTTP 500" in crash["error"] and "EngineCore encountered an issue" in crash["error"]
    runs = json.loads((report / "runs.json").read_text())
    assert len(runs["baseline"]["greedy"]["records"]) == 3 and runs["candidate"] is None
    for name in ("summary.md", "report.html"):
        text = (report / name).read_text()
        assert "FAIL" in text and target.id in text and "HTTP 500" in text, name
    case = ET.parse(junit).getroot().find("testsuite/testcase[@name='candidate_completes']")
    assert case is not None
    failure = case.find("failure")
    assert failure is not None and target.id in (failure.text or "") and "T=0 (greedy)" in (failure.text or "")


def test_a_dying_baseline_is_still_no_verdict(stub: Callable[..., str], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The same death on the baseline's side is exit 2 and no report: the gate has nothing to compare."""
    base = stub(lambda path, b: path == "/v1/completions" and b.get("prompt") != PROBE_PROMPT)
    cand = stub(lambda path, b: False)
    policy = tmp_path / "policy.yaml"
    policy.write_text("criteria:\n  sampled: {samples_per_item: 0, required: false}\n")
    rc = gate_main(["--baseline-url", base, "--candidate-url", cand, "--retries", "0", "--policy", str(policy),
                    "--limit", "1", "--tasks", "next_line", "--report", str(tmp_path / "rep")])
    assert rc == 2
    assert "the baseline arm crashed, no verdict" in capsys.readouterr().err
    assert not (tmp_path / "rep").exists()


def test_in_process_crash_report_without_vllm(demo_model: Path, tmp_path: Path) -> None:
    """An in-process crash as ``GateEngine`` raises it (the real engine's error text): every report
    file is written, without plots, and the JUnit failure carries the error, profile and requests."""
    try:
        raise RuntimeError("index 1266 is out of bounds for dimension 0 with size 1024")
    except RuntimeError as err:
        crash = RunCrashed("candidate T>0", err, [(it.id, k, 1) for k, it in enumerate(ITEMS)],
                           SamplingProfile(1.0, top_p=0.9, top_k=50))
    inp = GateInputs(demo_model, ITEMS, "subset", parse_spec("none"), parse_spec("ngram:k=4"), load_policy())
    result, paths = crashed(inp, None, crash, tmp_path / "rep", 1.0)
    assert result["verdict"] == "FAIL" and result["failed"] == ["candidate_completes"]
    assert json.loads(paths["json"].read_text())["crash"]["requests"][2] == {
        "item_id": ITEMS[2].id, "item_index": 2, "sample": 1}
    md = paths["markdown"].read_text()
    assert "T=1 top_p=0.9 top_k=50" in md and "out of bounds" in md and ITEMS[0].id in md
    assert "data:image/png" not in paths["html"].read_text()
    suite = ET.fromstring(paths["junit"].read_text()).find("testsuite")
    assert suite is not None and suite.get("failures") == "1" and suite.get("tests") == "1"
    assert "3 requests in flight" in (suite.find("testcase/failure").text or "")  # type: ignore[union-attr]


def test_sequential_gate_fails_a_candidate_that_dies_at_a_later_look(
        stub: Callable[..., str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With ``sequential.looks: 2`` the first look passes through; the candidate dies on an item of
    the second stage: still FAIL, reported over the items run so far (both stages)."""
    target = load_eval_set(DEFAULT_EVAL_SET, limit=2, tasks=["next_line"])[1]  # stage 2: each task's 2nd item
    base = stub(lambda path, b: False)
    cand = stub(lambda path, b: b.get("prompt") == target.prompt)
    policy = tmp_path / "policy.yaml"
    policy.write_text("criteria:\n  sampled: {samples_per_item: 0, required: false}\nruns: {latency_items: 1}\n"
                      "sequential: {looks: 2}\n")
    rc = gate_main(["--baseline-url", base, "--candidate-url", cand, "--retries", "0", "--policy", str(policy),
                    "--limit", "2", "--tasks", "next_line", "--report", str(tmp_path / "rep")])
    assert rc == 1, capsys.readouterr()
    result = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert result["n_items"] == 2 and result["crash"]["requests"][0]["item_id"] == target.id
