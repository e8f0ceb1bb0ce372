"""Endpoint mode through the chat API (``--api chat``) on a real vLLM server (CPU, demo model).

The demo model has no chat template of its own, so the server gets a pass-through one (the user
message is the prompt): the chat path must then return exactly the completions path's greedy tokens,
and a chat-mode gate of the server against itself PASSes (an A/A gate: baseline = candidate)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.vllm_server import VllmServer
from vllm_lookahead.gate.endpoint import EndpointClient, EndpointOptions

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def server(demo_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    work = tmp_path_factory.mktemp("chat")
    (work / "template.jinja").write_text(TEMPLATE)
    srv = VllmServer(str(demo_model), env={}, workdir=str(work),
                     args=["--served-model-name", "demo", "--max-model-len", "768", "--enforce-eager",
                           "--dtype", "float32", "--seed", "0", "--chat-template", str(work / "template.jinja")])
    try:
        yield srv.start(timeout_s=900)
    finally:
        srv.stop()


def test_chat_and_completions_agree_token_for_token(server: VllmServer) -> None:
    prompt = "def fibonacci(n):\n    if n < 2:"
    comp = EndpointClient("baseline", server.url, "demo", EndpointOptions(api="completions"))
    chat = EndpointClient("candidate", server.url, "demo", EndpointOptions(api="chat"))
    a, _ = comp.generate(prompt, 24, 0.0)
    b, _ = chat.generate(prompt, 24, 0.0)
    assert len(a["token_ids"]) > 0
    assert b["prompt_token_ids"] == a["prompt_token_ids"] and b["token_ids"] == a["token_ids"]


def test_chat_mode_gate_of_a_server_against_itself_passes(server: VllmServer, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("criteria:\n  sampled: {samples_per_item: 2}\nruns: {latency_items: 1}\n")
    cmd = [sys.executable, "-m", "vllm_lookahead.cli", "gate", "--baseline-url", server.url, "--candidate-url",
           server.url, "--api", "chat", "--limit", "1", "--tasks", "next_line,copy,json", "--max-tokens", "24",
           "--policy", str(policy), "--report", str(tmp_path / "rep")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False, cwd=tmp_path,
                          env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert rep["verdict"] == "PASS" and rep["meta"]["candidate"]["api"] == "chat"
