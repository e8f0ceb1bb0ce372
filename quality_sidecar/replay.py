"""Replays greedy and seeded prompts against a baseline OpenAI-compatible server (``--baseline-url``).

A sampled fraction of greedy prompts, and of seeded T>0 prompts of decoders that keep vLLM's seed
promise (``decoder.seeded_exact``), is re-asked of a baseline server (vLLM without lookahead) through
the shared worker (``workers.py``), and the answers are paired for the exact match detector (sources
``replay`` and ``seeded``; baseline-arm samples give the A/A reference).

A replay is only a fair comparison at the serving dtype: a bf16 output replayed on an fp32 server
differs by rounding, not by decoding.  The server's dtype is what the operator states
(``--baseline-dtype``: vLLM 0.32's OpenAI server reports it nowhere usable); a sample whose
``decoder.dtype`` differs is skipped as ``dtype_mismatch``.
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

    def complete(self, prompt: str | list[int], max_tokens: int, model: str | None = None,
                 sampling: dict[str, Any] | None = None) -> dict[str, Any]:
        """Greedy, or with ``sampling`` (``seeded_sampling``'s fields, seed included) when given."""
        import requests

        body = {"model": model or self.model, "prompt": prompt, "max_tokens": max(1, max_tokens),
                "temperature": 0.0, "return_token_ids": True, **(sampling or {})}
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


# sample.sampling fields a seeded replay sends as recorded (vLLM's names); anything that changes the
# distribution and is not recorded makes the sample not replayable (``seeded_sampling``)
REPLAYED_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "frequency_penalty", "presence_penalty",
                   "repetition_penalty", "min_tokens")


def seeded_sampling(sample: dict[str, Any]) -> dict[str, Any] | str | None:
    """The sampling fields to replay a seeded T>0 sample with, the reason it cannot be replayed exactly,
    or None when it is not a seeded T>0 sample (greedy ones are replayed greedy, unseeded ones are for
    the conformance scorer)."""
    s = sample.get("sampling") or {}
    if not (s.get("temperature") or 0) > 0 or not isinstance(s.get("seed"), int):
        return None
    if (sample.get("decoder") or {}).get("seeded_exact") is not True:
        return "not_seeded_exact"  # rejection sampling: a seeded output differs without any fault
    if s.get("logits_modified") or s.get("response_format"):
        return "not_replayable"
    if (s.get("n") or 1) > 1:
        return "n_gt_1"
    fields = {k: s[k] for k in REPLAYED_FIELDS if s.get(k) is not None}
    if "min_tokens" in fields:
        fields["min_tokens"] = min(fields["min_tokens"], output_length(sample))
    return fields


def output_length(sample: dict[str, Any]) -> int:
    """The sample's output tokens: what a replay asks for as ``max_tokens`` (0 when unknown)."""
    out = sample.get("output") or {}
    return out.get("num_tokens") or len(out.get("token_ids") or [])


def normalize_dtype(dtype: str | None) -> str | None:
    """"torch.bfloat16", "bf16", "BFloat16" -> "bfloat16"; None stays None (unknown)."""
    if dtype is None:
        return None
    d = str(dtype).strip().lower().removeprefix("torch.")
    return _DTYPE_ALIASES.get(d, d)


class ReplayWorker(PairWorker):
    """Background replayer: ``submit(sample)`` enqueues, ``on_result(sample, baseline)`` gets pairs.

    Counts (``counts``): ``submitted``, ``done``, ``failed``, ``retries``, ``skipped_<reason>``
    (``no_prompt``, ``dtype_mismatch`` and ``seeded_sampling``'s reasons); ``skips`` counts the skipped
    samples per (model, arm, reason).
    ``server_dtype`` (the baseline server's dtype, as stated by the operator; None: not checked)
    refuses samples served at another dtype; a sample without ``decoder.dtype`` is replayed.
    """

    thread_name = "baseline-replay"

    def __init__(self, client: BaselineReplayClient, on_result: Callable[[dict, dict], None],
                 fraction: float = 0.1, max_queue: int = 256, seed: int = 0, server_dtype: str | None = None):
        self.client, self.on_result = client, on_result
        self.server_dtype = normalize_dtype(server_dtype)
        super().__init__(fraction, max_queue, seed)
        for reason in ("no_prompt", "dtype_mismatch", "not_seeded_exact", "not_replayable", "n_gt_1"):
            self.counts[f"skipped_{reason}"] = 0
        self.skips: Counter[tuple[str, str, str]] = Counter()
        if self.server_dtype is None:
            log.warning("baseline dtype not stated (--baseline-dtype): greedy replays are not checked for a "
                        "dtype mismatch, which makes exact_match compare rounding, not decoding")

    def _skip(self, sample: dict[str, Any], reason: str) -> str:
        key = (str(sample.get("model")), str((sample.get("deployment") or {}).get("arm")), reason)
        if not self.skips[key] and reason == "dtype_mismatch":
            log.warning("not replaying %s/%s samples (%s): served as %s, the baseline server runs %s; "
                        "their token ids would differ by rounding alone", key[0], key[1], reason,
                        normalize_dtype((sample.get("decoder") or {}).get("dtype")), self.server_dtype)
        self.skips[key] += 1
        return reason

    def prepare(self, sample: dict[str, Any]) -> Any:
        """Greedy outputs, and seeded T>0 outputs of seed-exact decoders, of both arms (baseline-arm
        pairs are the A/A rate); anything else is not this worker's."""
        sampling: dict[str, Any] | str | None = None
        if (sample.get("sampling") or {}).get("temperature") != 0:
            sampling = seeded_sampling(sample)
            if sampling is None:
                return None
            if isinstance(sampling, str):
                return self._skip(sample, sampling)
        dtype = normalize_dtype((sample.get("decoder") or {}).get("dtype"))
        if None not in (dtype, self.server_dtype) and dtype != self.server_dtype:
            return self._skip(sample, "dtype_mismatch")
        prompt = (sample.get("prompt") or {}).get("text") or sample.get("prompt_token_ids")
        return (sample, prompt, sampling) if prompt else self._skip(sample, "no_prompt")

    def handle(self, item: tuple[dict[str, Any], Any, dict[str, Any] | None]) -> None:
        sample, prompt, sampling = item
        n = output_length(sample) or 64
        self.on_result(sample, self.client.complete(prompt, n, model=sample.get("model"), sampling=sampling))
