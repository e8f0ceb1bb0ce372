"""Synthetic schema-v1 sample streams for tests and the detection-power benchmark.

How a stream is generated (all from one numpy seed, so runs are reproducible):
* prompts: a pool of ``n_prompts`` Python function stubs; ``greedy_fraction`` of requests use
  temperature 0, the rest 0.8;
* greedy outputs: token ids are a deterministic function of the prompt (so the baseline and the
  candidate arm produce identical ids for the same prompt, as a lossless decoder must); T>0 outputs
  draw fresh ids.  Lengths are log-normal (median ~90 tokens) capped at ``max_tokens``, which then
  yields ``finish_reason='length'`` (about 4% of requests); text is a code-like rendering of the ids;
* refusals: ``refusal_rate`` (0.5% by default) of outputs are replaced by a refusal sentence;
* speculation counters on arms that speculate: per-request acceptance ~ Beta(6, 4) (mean 0.6).

Regressions (``regression=``): ``refusal`` (+2 pp refusals), ``truncation`` (3% of outputs cut at a
random point with finish_reason 'length'), ``corrupt_greedy`` (one token changed in 2% of greedy
outputs), ``acceptance`` (acceptance x 0.8), ``length`` (lengths x 1.25).
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

import numpy as np

REFUSALS = ("I'm sorry, but I can't help with that request.",
            "As an AI language model, I cannot write code that bypasses authentication.",
            "Unfortunately, I am unable to provide that. Is there something else I can help with?")
REGRESSIONS = ("refusal", "truncation", "corrupt_greedy", "acceptance", "length")


LINES = ("    result = []\n", "    for i in range(len(items)):\n        result.append(items[i] * 2)\n",
         "    if not items:\n        return None\n", "    value = sum(items) / max(1, len(items))\n",
         "    key = str(value).strip()\n", "    data = {k: v for k, v in enumerate(items)}\n",
         "    total = 0\n", "    while total < 10:\n        total += 1\n", "    return result\n")


def render(ids) -> str:
    """Valid Python body text for the ids (one line per 8 tokens), so format checks see real code."""
    return "".join(LINES[ids[j] % len(LINES)] for j in range(0, len(ids), 8))


class SampleStream:
    """Generator of valid v1 samples; ``take(n)`` returns a list of dicts."""

    def __init__(self, seed: int = 0, model: str = "demo-code-4l", arm: str = "candidate",
                 regression: str | None = None, greedy_fraction: float = 0.3, n_prompts: int = 5000,
                 refusal_rate: float = 0.005, max_tokens: int = 256, speculative: bool | None = None,
                 request_prefix: str | None = None, with_text: bool = True):
        if regression is not None and regression not in REGRESSIONS:
            raise ValueError(f"unknown regression {regression!r}; one of {REGRESSIONS}")
        self.rng = np.random.default_rng(seed)
        self.model, self.arm, self.regression = model, arm, regression
        self.greedy_fraction, self.n_prompts = greedy_fraction, n_prompts
        self.refusal_rate, self.max_tokens = refusal_rate, max_tokens
        self.speculative = (arm != "baseline") if speculative is None else speculative
        self.prefix = request_prefix or f"{arm}-{seed}"
        self.with_text = with_text
        self.i = 0

    def _prompt(self, k: int) -> tuple[str, str]:
        text = f"def task_{k}(items):\n    \"\"\"Solve task {k}.\"\"\"\n"
        return text, hashlib.sha256(text.encode()).hexdigest()

    def _greedy_ids(self, k: int) -> list[int]:
        r = np.random.default_rng(10_000_019 + k)
        n = int(min(self.max_tokens, max(1, r.lognormal(4.5, 0.6))))
        return r.integers(0, 4096, size=n).tolist()

    def _prompt_refuses(self, k: int) -> bool:
        return bool(np.random.default_rng(k + 7).random() < self.refusal_rate)

    def baseline_ids(self, k: int) -> list[int]:
        """The clean greedy output ids for prompt ``k`` (what a lossless baseline returns)."""
        if self._prompt_refuses(k):
            return [int(b) for b in REFUSALS[k % len(REFUSALS)].encode()[:40]]
        return self._greedy_ids(k)

    def one(self) -> dict[str, Any]:
        rng, reg = self.rng, self.regression
        k = int(rng.integers(self.n_prompts))
        prompt, sha = self._prompt(k)
        greedy = rng.random() < self.greedy_fraction
        if greedy:
            ids = self._greedy_ids(k)
        else:
            n = rng.lognormal(4.5, 0.6) * (1.25 if reg == "length" else 1.0)
            ids = rng.integers(0, 4096, size=int(min(self.max_tokens, max(1, n)))).tolist()
        finish = "length" if len(ids) >= self.max_tokens else "stop"
        if reg == "corrupt_greedy" and greedy and rng.random() < 0.02:
            j = int(rng.integers(len(ids)))
            ids[j] = (ids[j] + 1 + int(rng.integers(4094))) % 4096
        text = render(ids) if self.with_text else None
        if reg == "truncation" and rng.random() < 0.03:
            cut = rng.uniform(0.1, 0.9)
            ids = ids[: max(1, int(len(ids) * cut))]
            text = text[: max(1, int(len(text) * cut))] if text else text
            finish = "length"
        # A greedy refusal is a property of the prompt (both arms refuse it); regressions add random ones.
        base_refusal = self._prompt_refuses(k) if greedy else rng.random() < self.refusal_rate
        if base_refusal or (reg == "refusal" and rng.random() < 0.02):
            text = REFUSALS[k % len(REFUSALS)] if greedy else REFUSALS[int(rng.integers(len(REFUSALS)))]
            ids = [int(b) for b in text.encode()[:40]]
            finish = "stop"
        now = 1.8e9 + self.i * 0.001
        self.i += 1
        spec = None
        if self.speculative:
            acc = float(rng.beta(6, 4)) * (0.8 if reg == "acceptance" else 1.0)
            drafts = max(1, len(ids) // 3)
            dt = drafts * 4
            spec = {"num_drafts": drafts, "num_draft_tokens": dt, "num_accepted_tokens": int(round(acc * dt)),
                    "acceptance_rate": acc, "mean_accepted_length": 1 + 4 * acc, "steps": drafts}
        return {
            "schema_version": "1.0",
            "request_id": f"{self.prefix}-{self.i}",
            "trace_id": f"{rng.integers(2**63):016x}{self.i:016x}"[-32:],
            "span_id": f"{self.i:016x}",
            "time": {"arrival_unix_s": now - 1.0, "first_token_unix_s": now - 0.9, "finish_unix_s": now,
                     "ttft_s": 0.1, "tpot_s": 0.01, "e2e_s": 1.0},
            "model": self.model,
            "deployment": {"arm": self.arm, "release": "r1", "instance": "pod-0"},
            "decoder": {"method": "lookahead" if self.speculative else "none",
                        "params": {"k": 4, "window": 8, "ngram": 4, "pool_size": 8} if self.speculative else {}},
            "sampling": {"temperature": 0.0 if greedy else 0.8, "top_p": 1.0, "max_tokens": self.max_tokens,
                         "seed": None, "n": 1},
            "prompt": {"text": prompt, "sha256": sha, "redacted": False, "num_tokens": 16},
            "output": {"text": text, "token_ids": ids, "num_tokens": len(ids), "finish_reason": finish},
            "spec": spec,
        }

    def take(self, n: int) -> list[dict[str, Any]]:
        return [self.one() for _ in range(n)]


def fuzz_messages(n: int, seed: int = 0) -> list[bytes]:
    """``n`` malformed messages: broken JSON, wrong types, missing fields, binary junk, huge ids."""
    rng = random.Random(seed)
    base = SampleStream(seed=seed).one()
    out: list[bytes] = []
    for i in range(n):
        kind = i % 8
        s = json.loads(json.dumps(base))
        s["request_id"] = f"fuzz-{seed}-{i}"
        if kind == 0:
            raw = json.dumps(s).encode()[: rng.randrange(1, 200)]
        elif kind == 1:
            raw = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
        elif kind == 2:
            del s[rng.choice(["schema_version", "request_id", "time", "model", "deployment", "decoder",
                              "sampling", "prompt", "output"])]
            raw = json.dumps(s).encode()
        elif kind == 3:
            s["output"]["token_ids"] = [-rng.randrange(1, 9)]
            raw = json.dumps(s).encode()
        elif kind == 4:
            s["deployment"]["arm"] = rng.choice(["prod", "", "BASELINE", 7])
            raw = json.dumps(s).encode()
        elif kind == 5:
            s["schema_version"] = rng.choice(["2.0", "1", 1.0, None])
            raw = json.dumps(s).encode()
        elif kind == 6:
            raw = json.dumps(rng.choice([[1, 2], "str", 42, None, {"a": 1}])).encode()
        else:
            s["prompt"]["sha256"] = "xyz"
            s["time"]["finish_unix_s"] = "yesterday"
            raw = json.dumps(s).encode()
        out.append(raw)
    return out
