"""Sequential stopping: the spending function, its false-FAIL rate by simulation, and the staged gate
end to end in endpoint mode.

The end-to-end test talks to two ``http.server`` stubs that answer from a table (fault injection: a
candidate that gets every item wrong on demand); real servers are exercised in
test_gate_endpoint_vllm.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from vllm_lookahead.gate import stats
from vllm_lookahead.gate.cli import main as gate_main
from vllm_lookahead.gate.policy import PolicyError, validate
from vllm_lookahead.gate.sequential import look_alphas, obf_spending, split

pytestmark = pytest.mark.unit


def test_obrien_fleming_spending() -> None:
    a = look_alphas(3, 0.05)
    assert abs(sum(a) - 0.05) < 1e-12 and a[0] < a[1] < a[2]
    assert a[0] == pytest.approx(2 - 2 * 0.999657, abs=2e-5)  # 2 - 2 Phi(1.96 * sqrt(3))
    assert obf_spending(1.0, 0.05) == pytest.approx(0.05, rel=1e-9) and obf_spending(0, 0.05) == 0
    assert look_alphas(1, 0.01) == [0.01]
    with pytest.raises(PolicyError, match="looks must be an integer in 1..10"):
        validate({"sequential": {"looks": 0}})
    with pytest.raises(PolicyError, match="obrien_fleming"):
        validate({"sequential": {"looks": 3, "spending": "pocock"}})


def test_sequential_mcnemar_keeps_level_and_stops_broken_candidates_early() -> None:
    """Paired pass/fail with 10% discordance: under H0 (symmetric) FAIL at any of 3 looks <= alpha;
    a candidate that loses 40% of items is stopped at the first look (40 of 120 items) most of the time
    (at 30% it is 62%: O'Brien-Fleming spends only 0.0007 there)."""
    rng = np.random.default_rng(1)
    alpha, n, looks = 0.05, 120, 3
    a = look_alphas(looks, alpha)
    cuts = [n * (k + 1) // looks for k in range(looks)]

    def first_fail(n10: np.ndarray, n01: np.ndarray) -> int | None:
        for k, c in enumerate(cuts):
            r, i = int(n10[:c].sum()), int(n01[:c].sum())
            if stats.mcnemar_p(r, i) < a[k] and r > i:
                return k
        return None

    h0 = [first_fail(*(rng.random((2, n)) < 0.05)) for _ in range(3000)]
    rate = np.mean([x is not None for x in h0])
    assert rate <= alpha + 3 * np.sqrt(alpha * (1 - alpha) / 3000), rate
    bad = [first_fail(rng.random(n) < 0.4, rng.random(n) < 0.0) for _ in range(300)]
    assert np.mean([x == 0 for x in bad]) > 0.8 and all(x is not None for x in bad)


def test_split_keeps_every_task_in_every_stage() -> None:
    from vllm_lookahead.gate.evalset import EvalItem

    items = [EvalItem(f"{t}{i}", t, "p", {"type": "exact", "answer": "x"}) for t in "ab" for i in range(7)]
    stages = split(items, 3)
    assert [len(s) for s in stages] == [6, 4, 4]
    assert all({it.task for it in s} == {"a", "b"} for s in stages)
    assert sorted(it.id for s in stages for it in s) == sorted(it.id for it in items)


def _table_server(answer: str) -> Iterator[str]:
    class H(BaseHTTPRequestHandler):
        def _send(self, code: int, body: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._send(200, json.dumps({"data": [{"id": "m"}]}))
            else:
                self._send(404, "{}")

        def do_POST(self) -> None:
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            ids = [ord(ch) % 97 for ch in req["prompt"]]
            self._send(200, json.dumps({"choices": [{"text": answer, "token_ids": [ord(ch) for ch in answer],
                                                     "finish_reason": "stop", "prompt_token_ids": ids}]}))

        def log_message(self, *a: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        request_queue_size = 128  # the gate opens up to --concurrency connections at once

    srv = Server(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("cand_answer, verdict, stopped_at", [(" no", "FAIL", 1), (" ok", "PASS", 3)])
def test_staged_endpoint_gate_stops_at_the_first_decided_look(tmp_path: Path, cand_answer: str, verdict: str,
                                                               stopped_at: int, capsys: pytest.CaptureFixture[str]) -> None:
    ev = tmp_path / "eval.jsonl"
    ev.write_text("".join(json.dumps({"id": f"{t}{i}", "task": t, "prompt": f"q {t} {i}:",
                                      "checker": {"type": "exact", "answer": "ok"}}) + "\n"
                          for t in "ab" for i in range(45)))
    pol = tmp_path / "policy.yaml"
    pol.write_text("sequential: {looks: 3}\ncriteria:\n  sampled: {samples_per_item: 0, required: false}\n"
                   "runs: {latency_items: 2}\n")
    base_gen, cand_gen = _table_server(" ok"), _table_server(cand_answer)
    try:
        rc = gate_main(["--baseline-url", next(base_gen), "--candidate-url", next(cand_gen), "--eval-set", str(ev),
                        "--policy", str(pol), "--report", str(tmp_path / "rep"), "--concurrency", "8"])
    finally:
        base_gen.close()
        cand_gen.close()
    cap = capsys.readouterr()
    out = cap.out
    assert rc == (0 if verdict == "PASS" else 1), out + cap.err[-2000:]
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    sq = rep["sequential"]
    assert rep["verdict"] == verdict and sq["stopped_at"] == stopped_at
    assert rep["n_items"] == 30 * stopped_at
    if verdict == "FAIL":
        assert sq["stopped_early"] and {"pass_rate_overall", "exact_match"} <= set(sq["history"][0]["decided_fail"])
        assert "stopped early at look 1 of 3 (30 items)" in out
    else:
        assert not sq["stopped_early"] and rep["meta"]["alpha"] == pytest.approx(look_alphas(3, 0.05)[2])
