"""Replays greedy prompts against a baseline OpenAI-compatible server (``--baseline-url``).

When no baseline arm shares traffic with the candidate, the sidecar re-asks a baseline server (vLLM
without lookahead) for a sampled fraction of greedy prompts and pairs the answers for the T=0 exact
match detector.  Requests go through the shared worker (``workers.py``): one thread, retries with
backoff, and backpressure on the consumer instead of dropped prompts.

A replay is only a fair comparison at the serving dtype: a bf16 output replayed on an fp32 server
(or the reverse) differs by rounding, not by decoding.  The server's dtype is what the operator
states (``baseline_dtype`` / ``--baseline-dtype``; vLLM 0.32's OpenAI server does not report it:
``/v1/models`` has no dtype, ``/metrics`` only the KV-cache dtype, ``/server_info`` needs dev mode).
A sample whose ``decoder.dtype`` (schema 1.4) differs is skipped as ``dtype_mismatch``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from .workers import PairWorker, base_url, classify_http_failure, http_status_failure

log = logging.getLogger(__name__)


class BaselineReplayClient:
    """Minimal client for ``POST {url}/v1/completions`` returning the greedy token ids (or text).

    vLLM's OpenAI server returns token ids when asked with ``return_token_ids: true``; other servers
    return text only, in which case pairs are compared on text (weaker; said in the result).
    """

    def __init__(self, url: str, model: str | None = None, timeout_s: float = 30.0):
        self.url = base_url(url)
        self.model = model
        self.timeout_s = timeout_s

    def complete(self, prompt: str | list[int], max_tokens: int, model: str | None = None) -> dict[str, Any]:
        import requests

        body = {"model": model or self.model, "prompt": prompt, "max_tokens": max(1, max_tokens),
                "temperature": 0.0, "return_token_ids": True}
        try:
            r = requests.post(f"{self.url}/v1/completions", json=body, timeout=self.timeout_s)
        except requests.RequestException as e:
            raise classify_http_failure(e) from e
        if r.status_code >= 300:
            raise http_status_failure(self.url, r.status_code, r.text)
        choice = r.json()["choices"][0]
        return {"text": choice.get("text"), "token_ids": choice.get("token_ids"),
                "finish_reason": choice.get("finish_reason")}


_DTYPE_ALIASES = {"bf16": "bfloat16", "fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16"}


def normalize_dtype(dtype: str | None) -> str | None:
    """"torch.bfloat16", "bf16", "BFloat16" -> "bfloat16"; None stays None (unknown)."""
    if dtype is None:
        return None
    d = str(dtype).strip().lower().removeprefix("torch.")
    return _DTYPE_ALIASES.get(d, d)


class ReplayWorker(PairWorker):
    """Background replayer: ``submit(sample)`` enqueues, ``on_result(sample, baseline)`` gets pairs.

    Counts (``counts``): ``submitted``, ``done``, ``failed``, ``retries``, ``skipped_no_prompt``,
    ``skipped_dtype_mismatch``; ``skips`` counts the skipped samples per (model, arm, reason).
    ``server_dtype`` (the baseline server's dtype, as stated by the operator; None: not checked)
    refuses samples served at another dtype; a sample without ``decoder.dtype`` is replayed.
    """

    thread_name = "baseline-replay"

    def __init__(self, client: BaselineReplayClient, on_result: Callable[[dict, dict], None],
                 fraction: float = 0.1, max_queue: int = 256, seed: int = 0, server_dtype: str | None = None):
        self.client, self.on_result = client, on_result
        self.server_dtype = normalize_dtype(server_dtype)
        super().__init__(fraction, max_queue, seed)
        self.counts["skipped_no_prompt"] = 0
        self.counts["skipped_dtype_mismatch"] = 0
        self.skips: Counter[tuple[str, str, str]] = Counter()
        if self.server_dtype is None:
            log.warning("baseline dtype not stated (--baseline-dtype): greedy replays are not checked for a "
                        "dtype mismatch, which makes exact_match compare rounding, not decoding")

    def _skip(self, sample: dict[str, Any], reason: str) -> str:
        key = (str(sample.get("model")), str((sample.get("deployment") or {}).get("arm")), reason)
        if not self.skips[key]:
            log.warning("not replaying %s/%s greedy samples (%s): served as %s, the baseline server runs %s; "
                        "their token ids would differ by rounding alone", key[0], key[1], reason,
                        normalize_dtype((sample.get("decoder") or {}).get("dtype")), self.server_dtype)
        self.skips[key] += 1
        return reason

    def prepare(self, sample: dict[str, Any]) -> Any:
        if (sample.get("sampling") or {}).get("temperature") != 0:
            return None  # greedy outputs only (both arms: baseline-arm pairs are the A/A rate)
        dtype = normalize_dtype((sample.get("decoder") or {}).get("dtype"))
        if None not in (dtype, self.server_dtype) and dtype != self.server_dtype:
            return self._skip(sample, "dtype_mismatch")
        prompt = (sample.get("prompt") or {}).get("text") or sample.get("prompt_token_ids")
        return (sample, prompt) if prompt else self._skip(sample, "no_prompt")

    def handle(self, item: tuple[dict[str, Any], Any]) -> None:
        sample, prompt = item
        out = sample.get("output") or {}
        n = out.get("num_tokens") or len(out.get("token_ids") or []) or 64
        self.on_result(sample, self.client.complete(prompt, n, model=sample.get("model")))
