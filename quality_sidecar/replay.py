"""Replays greedy prompts against a baseline OpenAI-compatible server (``--baseline-url``).

When no baseline arm shares traffic with the candidate, the sidecar re-asks a baseline server (vLLM
without lookahead) for a sampled fraction of greedy prompts and pairs the answers for the T=0 exact
match detector.  Requests go through the shared worker (``workers.py``): one thread, retries with
backoff, and backpressure on the consumer instead of dropped prompts.
"""

from __future__ import annotations

import logging
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


class ReplayWorker(PairWorker):
    """Background replayer: ``submit(sample)`` enqueues, ``on_result(sample, baseline)`` gets pairs.

    Counts (``counts``): ``submitted``, ``done``, ``failed``, ``retries``, ``skipped_no_prompt``.
    """

    thread_name = "baseline-replay"

    def __init__(self, client: BaselineReplayClient, on_result: Callable[[dict, dict], None],
                 fraction: float = 0.1, max_queue: int = 256, seed: int = 0):
        self.client, self.on_result = client, on_result
        super().__init__(fraction, max_queue, seed)
        self.counts["skipped_no_prompt"] = 0

    def prepare(self, sample: dict[str, Any]) -> Any:
        if (sample.get("sampling") or {}).get("temperature") != 0:
            return None  # greedy outputs only (both arms: baseline-arm pairs are the A/A rate)
        prompt = (sample.get("prompt") or {}).get("text") or sample.get("prompt_token_ids")
        return (sample, prompt) if prompt else "no_prompt"

    def handle(self, item: tuple[dict[str, Any], Any]) -> None:
        sample, prompt = item
        out = sample.get("output") or {}
        n = out.get("num_tokens") or len(out.get("token_ids") or []) or 64
        self.on_result(sample, self.client.complete(prompt, n, model=sample.get("model")))
