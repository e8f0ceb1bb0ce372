"""Replays greedy prompts against a baseline OpenAI-compatible server (``--baseline-url``).

When no baseline arm shares traffic with the candidate, the sidecar re-asks a baseline server (vLLM
without lookahead) for a sampled fraction of greedy prompts and pairs the answers for the T=0 exact
match detector.  Requests go through a bounded queue and one worker thread: when the queue is full the
prompt is skipped and counted (backpressure never reaches the consumer loop).
"""

from __future__ import annotations

import logging
import queue
import random
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class BaselineReplayClient:
    """Minimal client for ``POST {url}/v1/completions`` returning the greedy token ids (or text).

    vLLM's OpenAI server returns token ids when asked with ``return_token_ids: true``; other servers
    return text only, in which case pairs are compared on text (weaker; said in the result).
    """

    def __init__(self, url: str, model: str | None = None, timeout_s: float = 30.0):
        self.url = url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s

    def complete(self, prompt: str | list[int], max_tokens: int, model: str | None = None) -> dict[str, Any]:
        import requests

        body = {"model": model or self.model, "prompt": prompt, "max_tokens": max(1, max_tokens),
                "temperature": 0.0, "return_token_ids": True}
        r = requests.post(f"{self.url}/v1/completions", json=body, timeout=self.timeout_s)
        r.raise_for_status()
        choice = r.json()["choices"][0]
        return {"text": choice.get("text"), "token_ids": choice.get("token_ids"),
                "finish_reason": choice.get("finish_reason")}


class ReplayWorker:
    """Background replayer: ``submit(sample)`` enqueues, ``on_result(sample, baseline)`` gets pairs."""

    def __init__(self, client: BaselineReplayClient, on_result: Callable[[dict, dict], None],
                 fraction: float = 0.1, max_queue: int = 256, seed: int = 0):
        self.client, self.on_result, self.fraction = client, on_result, fraction
        self.queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self.rng = random.Random(seed)
        self.skipped = self.failed = self.done = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="baseline-replay", daemon=True)
        self._thread.start()

    def submit(self, sample: dict) -> bool:
        if self.rng.random() >= self.fraction:
            return False
        prompt = (sample.get("prompt") or {}).get("text") or sample.get("prompt_token_ids")
        if not prompt:
            self.skipped += 1
            return False
        try:
            self.queue.put_nowait(sample)
            return True
        except queue.Full:
            self.skipped += 1
            return False

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                sample = self.queue.get(timeout=0.2)
            except queue.Empty:
                continue
            out = sample.get("output") or {}
            n = out.get("num_tokens") or len(out.get("token_ids") or []) or 64
            prompt = (sample.get("prompt") or {}).get("text") or sample.get("prompt_token_ids")
            try:
                base = self.client.complete(prompt, n, model=sample.get("model"))
                self.done += 1
                self.on_result(sample, base)
            except Exception as e:  # noqa: BLE001 (a flaky baseline must not stop the sidecar)
                self.failed += 1
                log.warning("baseline replay failed: %s", e)

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
