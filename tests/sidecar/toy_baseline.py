"""A toy language model served the way vLLM serves ``prompt_logprobs``, for the sidecar's pipeline tests.

Why not a real vLLM server here: these tests inject what a real server cannot produce on cue -- a
server that is slow for a while, answers 503 on the first try, or is down -- and drive thousands of
samples through the consumer loop in seconds.  The scores themselves are checked against a real
vLLM server in ``test_conformance_serve.py``.

The model: V tokens, the next-token log-probs depend on the previous token only (a seeded normal
logit vector per previous token).  ``sample`` draws outputs from it with a sampler (exact), or with
the truncation ignored at every other position (a decoder that ignores top-p / top-k / min-p at its
draft positions).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from quality_sidecar.detectors.conformance_scoring import SamplerParams, sampler_probs

V = 64


@lru_cache(maxsize=V)
def row(prev: int) -> np.ndarray:
    z = np.random.default_rng([int(prev), 7]).normal(0.0, 2.0, V)
    return z - np.log(np.exp(z - z.max()).sum()) - z.max()


def sample(rng: np.random.Generator, params: SamplerParams, n_tokens: int = 30, arm: str = "baseline",
           ignore_truncation_every: int = 0, model: str = "toy", prompt: list[int] | None = None) -> dict[str, Any]:
    """One schema-v1 sample drawn from the toy model (``ignore_truncation_every=2``: every other token
    drawn at the temperature alone, the fault)."""
    prompt = list(prompt) if prompt is not None else [int(x) for x in rng.integers(0, V, 5)]
    out: list[int] = []
    prev = prompt[-1]
    plain = SamplerParams(params.temperature)
    for i in range(n_tokens):
        p = params if not ignore_truncation_every or i % ignore_truncation_every else plain
        q = sampler_probs(row(prev)[None, :], p)[0]
        prev = int(rng.choice(V, p=q))
        out.append(prev)
    return {"schema_version": "1.2", "request_id": secrets.token_hex(8), "trace_id": secrets.token_hex(16),
            "model": model, "deployment": {"arm": arm}, "decoder": {"method": "none"},
            "time": {"arrival_unix_s": 1.8e9, "finish_unix_s": 1.8e9 + 1},
            "sampling": {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k or None,
                         "min_p": params.min_p or None, "max_tokens": n_tokens, "n": 1},
            "prompt": {"text": "toy", "sha256": hashlib.sha256(repr(prompt).encode()).hexdigest(), "redacted": False},
            "prompt_token_ids": prompt,
            "output": {"text": "toy", "token_ids": out, "num_tokens": len(out), "finish_reason": "length"}}


class ToyServer:
    """``POST /v1/completions`` with ``prompt_logprobs`` (vLLM's format) for the toy model.

    Fault injection (class-level, set by the test): ``delay_s`` per request, ``fail_first`` (the
    first try of every sequence answers 503), ``down`` (every request answers 503); ``max_logprobs``
    refuses a larger K with vLLM 0.32's 400 message (``--max-logprobs``, default 20).  ``stop()`` closes
    the listening socket (connections are refused, as from a pod that is gone) and ``start()`` listens
    again on the same port (the pod is back).
    """

    def __init__(self) -> None:
        self.delay_s, self.fail_first, self.down, self.max_logprobs = 0.0, False, False, 20
        self.asked_k: list[int] = []
        self.unknown_models: set[str] = set()  # answered 404, as vLLM answers a model it does not serve
        self.zero_prob: set[int] = set()  # tokens sent with vLLM's -9999.0 for a -inf log-prob (clamp_prompt_logprobs)
        self.requests = 0
        self.tried: set[tuple[int, ...]] = set()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests += 1
                time.sleep(outer.delay_s)
                seq = tuple(body["prompt"])
                if outer.down or (outer.fail_first and seq not in outer.tried):
                    outer.tried.add(seq)
                    self._send(503, {"error": "overloaded"})
                    return
                if body.get("model") in outer.unknown_models:
                    self._send(404, {"error": {"message": f"The model `{body['model']}` does not exist."}})
                    return
                if any(t >= V or t < 0 for t in seq):
                    self._send(400, {"error": {"message": f"Token id {max(seq)} is out of vocabulary"}})
                    return
                k = int(body["prompt_logprobs"])
                outer.asked_k.append(k)
                if k > outer.max_logprobs:
                    self._send(400, {"error": {"message": f"Requested prompt logprobs of {k}, which is greater "
                                                          f"than max allowed: {outer.max_logprobs}"}})
                    return
                plp: list[Any] = [None]
                for j in range(1, len(seq)):
                    r = row(seq[j - 1])
                    order = np.argsort(-r, kind="stable")
                    rank = {int(t): i + 1 for i, t in enumerate(order)}
                    d = {str(int(t)): {"logprob": outer.logprob(r, int(t)), "rank": rank[int(t)]} for t in order[:k]}
                    d[str(seq[j])] = {"logprob": outer.logprob(r, seq[j]), "rank": rank[seq[j]]}
                    plp.append(d)
                self._send(200, {"choices": [{"text": "", "prompt_logprobs": plp}]})

            def _send(self, code: int, obj: Any) -> None:
                out = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a: Any) -> None:
                pass

        self._handler = Handler
        self.port = 0
        self.start()
        self.url = f"http://127.0.0.1:{self.port}"

    def logprob(self, r: np.ndarray, t: int) -> float:
        """Token t's log-prob in row r as the server sends it (-9999.0 for a zero-probability token)."""
        return -9999.0 if t in self.zero_prob else float(r[t])

    def start(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler)  # SO_REUSEADDR: same port
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    close = stop
