"""T>0 sampling conformance in the sidecar: score sampled outputs under a baseline server, chart them.

For a fraction (``ConformanceConfig.fraction``) of the T>0 samples of each arm, a background worker
asks the baseline server (``--baseline-url``, any OpenAI-compatible server that returns prompt
log-probs: vLLM's ``prompt_logprobs`` extension, or ``echo`` + ``logprobs``) for the top-K log-probs
of prompt + output, turns them into PIT values and token log-probs
(``detectors.conformance.score_topk``) and feeds the PIT values to a two-sided CUSUM over the token
stream per (model, arm) (``PitCusum``): reference-free, because the null is known exactly.  The candidate arm's
chart is the alarm; the baseline arm's chart is the control (an alarm there means the scorer and the
serving engine disagree: another model revision, dtype or sampler).  The mean token log-prob of each
arm and their difference (nats/token, Welch CI) are exported as gauges.

The request path is never touched: the sidecar calls the baseline server from its own thread through a
bounded queue; a full queue skips (and counts) samples.  Without a baseline URL, /metrics says so
(``quality_sidecar_conformance_monitored 0``) and the docs say that T>0 conformance is not monitored.

Cost per scored sample: one prefill of prompt + output on the baseline server (no decode), plus
~0.1 ms of numpy here (K = 20).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .detectors.conformance import ConformanceChart, SamplerParams, SequenceScore, score_topk
from .workers import BackgroundWorker

log = logging.getLogger(__name__)


@dataclass
class ConformanceConfig:
    """Knobs of the T>0 conformance detector (``conformance:`` in the sidecar YAML)."""

    fraction: float = 0.2  # share of each arm's T>0 samples scored by the baseline server
    top_logprobs: int = 20  # K; vLLM's default --max-logprobs is 20
    # Tokens between false alarms per (model, arm) chart: 1e9 = 1M samples of 1,000 tokens, 24M samples
    # of the demo model's ~41-token outputs.  The chart counts tokens because the token stream's PIT
    # values are i.i.d. U(0,1) whatever the output lengths (see PitCusum).
    ert_tokens: float = 1e9
    shift: float = 0.04  # per-token shift of E[(u - 1/2) sqrt(12)] to detect fastest (= mean u +- 0.0115)
    max_queue: int = 256
    timeout_s: float = 30.0
    api: str = "auto"  # prompt_logprobs | echo | auto (prompt_logprobs, falling back to echo)

    def __post_init__(self) -> None:
        if not 0 <= self.fraction <= 1:
            raise ValueError(f"conformance.fraction must be in [0, 1], got {self.fraction}")
        if not 1 <= self.top_logprobs <= 1000:
            raise ValueError(f"conformance.top_logprobs must be in [1, 1000], got {self.top_logprobs}")
        if self.api not in ("auto", "prompt_logprobs", "echo"):
            raise ValueError(f"conformance.api must be auto, prompt_logprobs or echo, got {self.api!r}")
        if self.ert_tokens <= 1 or self.shift <= 0:
            raise ValueError("conformance.ert_tokens must be > 1 and conformance.shift > 0")


class LogprobClient:
    """Top-K log-probs of every position of a token sequence from an OpenAI-compatible server.

    ``prompt_logprobs`` (vLLM): ``POST /v1/completions`` with the token ids as prompt, ``max_tokens: 1``
    and ``prompt_logprobs: K``; each position's dict holds the top K (rank <= K) and the actual token.
    ``echo`` (OpenAI legacy): ``echo: true, logprobs: K`` and vLLM's ``return_tokens_as_token_ids``
    so tokens come back as ``token_id:N``.  Returns arrays for the *last* ``n_out`` positions.
    """

    def __init__(self, url: str, model: str | None = None, top_logprobs: int = 20, timeout_s: float = 30.0,
                 api: str = "auto"):
        self.url, self.model, self.k, self.timeout_s, self.api = url.rstrip("/"), model, top_logprobs, timeout_s, api

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        import requests

        r = requests.post(f"{self.url}/v1/completions", json=body, timeout=self.timeout_s)
        if r.status_code >= 400:
            raise RuntimeError(f"baseline server {self.url} answered {r.status_code}: {r.text[:300]}")
        return r.json()

    def score(self, prompt_ids: list[int], output_ids: list[int], model: str | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(top_ids [n, K], top_logprobs [n, K], token_logprobs [n]) for the n = len(output_ids) outputs."""
        seq = [int(t) for t in prompt_ids] + [int(t) for t in output_ids]
        n = len(output_ids)
        if self.api in ("auto", "prompt_logprobs"):
            body = {"model": model or self.model, "prompt": seq, "max_tokens": 1, "temperature": 0.0,
                    "prompt_logprobs": self.k}
            choice = self._post(body)["choices"][0]
            plp = choice.get("prompt_logprobs")
            if plp is not None:
                return self._from_prompt_logprobs(plp[-n:], output_ids)
            if self.api == "prompt_logprobs":
                raise RuntimeError("baseline server ignored prompt_logprobs (not vLLM?): use api=echo")
        body = {"model": model or self.model, "prompt": seq, "max_tokens": 1, "temperature": 0.0, "echo": True,
                "logprobs": self.k, "return_tokens_as_token_ids": True}
        lp = self._post(body)["choices"][0].get("logprobs") or {}
        tops, toks = lp.get("top_logprobs"), lp.get("token_logprobs")
        if not tops or toks is None or len(toks) < len(seq):
            raise RuntimeError("baseline server returned no echo log-probs for the prompt")
        return self._from_echo(tops[len(seq) - n:len(seq)], toks[len(seq) - n:len(seq)], output_ids)

    def _from_prompt_logprobs(self, rows: list[dict[str, Any]], output_ids: list[int]):
        k = self.k
        ids = np.full((len(rows), k), -1, np.int64)
        lps = np.full((len(rows), k), -np.inf)
        tok = np.empty(len(rows))
        for i, (d, y) in enumerate(zip(rows, output_ids)):
            if d is None:
                raise RuntimeError("baseline server returned no log-probs for an output position")
            items = sorted(((int(t), v) for t, v in d.items()), key=lambda kv: kv[1].get("rank", 0) or 0)
            top = [(t, v["logprob"]) for t, v in items if (v.get("rank") or 0) <= k][:k]
            for j, (t, v) in enumerate(top):
                ids[i, j], lps[i, j] = t, v
            entry = d.get(str(y)) or d.get(y)
            if entry is None:
                raise RuntimeError(f"baseline server omitted the sampled token {y} from prompt_logprobs")
            tok[i] = entry["logprob"]
        return ids, lps, tok

    def _from_echo(self, tops: list[dict[str, float] | None], toks: list[float | None], output_ids: list[int]):
        k = self.k
        ids = np.full((len(tops), k), -1, np.int64)
        lps = np.full((len(tops), k), -np.inf)
        tok = np.empty(len(tops))
        for i, (d, t_lp) in enumerate(zip(tops, toks)):
            if d is None or t_lp is None:
                raise RuntimeError("baseline server returned no log-probs for an output position")
            items = sorted(d.items(), key=lambda kv: -kv[1])[:k]
            for j, (name, v) in enumerate(items):
                if not str(name).startswith("token_id:"):
                    raise RuntimeError("echo log-probs without token ids (server lacks return_tokens_as_token_ids)")
                ids[i, j], lps[i, j] = int(str(name).split(":", 1)[1]), v
            tok[i] = t_lp
        return ids, lps, tok


class ScoringWorker(BackgroundWorker):
    """Background scorer: ``submit(sample)`` (non-blocking) -> ``on_result(sample, SequenceScore)``.

    Counts (``counts``): ``submitted``, ``done`` (scored), ``failed``, ``skipped_queue_full``,
    ``skipped_no_token_ids``; samples that are not plain T>0 (greedy, penalties, logit modifiers)
    are not selected and not counted.
    """

    thread_name = "conformance-scorer"

    def __init__(self, client: LogprobClient, on_result: Callable[[dict, SequenceScore], None],
                 cfg: ConformanceConfig, vocab_size: int | None = None, seed: int = 0):
        self.client, self.on_result, self.cfg, self.vocab_size = client, on_result, cfg, vocab_size
        self.np_rng = np.random.default_rng(seed)
        super().__init__(cfg.fraction, cfg.max_queue, seed)
        self.counts["skipped_no_token_ids"] = 0

    def prepare(self, sample: dict[str, Any]) -> Any:
        params = SamplerParams.from_sampling(sample.get("sampling"))
        if params is None:
            return None
        if not sample.get("prompt_token_ids") or not (sample.get("output") or {}).get("token_ids"):
            return "no_token_ids"
        return sample, params

    def handle(self, item: tuple[dict[str, Any], SamplerParams]) -> None:
        sample, params = item
        out = sample["output"]["token_ids"]
        ids, lps, tok = self.client.score(sample["prompt_token_ids"], out, model=sample.get("model"))
        self.on_result(sample, score_topk(ids, lps, out, tok, params, self.np_rng, vocab_size=self.vocab_size))


class ConformanceMonitor:
    """Per-(model, arm) PIT charts and log-prob accumulators for one model."""

    STATE = ("stats",)

    def __init__(self, model: str, cfg: ConformanceConfig, restart_after_alarm: bool = False):
        self.model, self.cfg, self.restart_after_alarm = model, cfg, restart_after_alarm
        self.charts: dict[str, ConformanceChart] = {}
        self.stats: dict[str, dict[str, float]] = {}
        self.examples: dict[str, list[tuple[str | None, str]]] = {}

    def _chart(self, arm: str) -> ConformanceChart:
        c = self.charts.get(arm)
        if c is None:
            c = self.charts[arm] = ConformanceChart("sampling_conformance", self.cfg.ert_tokens, self.cfg.shift,
                                                    self.restart_after_alarm)
            self.stats[arm] = {"samples": 0, "tokens": 0, "pit_tokens": 0, "skipped": 0, "out_of_support": 0,
                               "lp_sum": 0.0, "lp_sumsq": 0.0}
        return c

    def add(self, arm: str, score: SequenceScore, trace_id: str | None, request_id: str):
        """Feed one scored sample; returns the chart's Result."""
        chart = self._chart(arm)
        st = self.stats[arm]
        st["samples"] += 1
        st["tokens"] += score.n_tokens
        st["pit_tokens"] += len(score.pit)
        st["skipped"] += score.skipped
        st["out_of_support"] += score.out_of_support
        m = score.mean_logprob
        if math.isfinite(m):
            st["lp_sum"] += m
            st["lp_sumsq"] += m * m
        ex = self.examples.setdefault(arm, [])
        ex.append((trace_id, request_id))
        del ex[:-5]
        r = chart.update([score])
        r.extra.update(self.summary(arm))
        return r

    def mean_logprob(self, arm: str) -> tuple[float, float, int]:
        """(mean of per-sample mean token log-probs, its variance, n) for an arm."""
        st = self.stats.get(arm)
        if not st or st["samples"] == 0:
            return math.nan, math.nan, 0
        n = st["samples"]
        mean = st["lp_sum"] / n
        var = max(0.0, (st["lp_sumsq"] - n * mean * mean) / (n - 1)) if n > 1 else math.nan
        return mean, var, n

    def shift(self) -> tuple[float, float, float]:
        """Candidate - baseline mean token log-prob (nats/token) with a 95% Welch CI."""
        mb, vb, nb = self.mean_logprob("baseline")
        mc, vc, nc = self.mean_logprob("candidate")
        if nb < 2 or nc < 2:
            return math.nan, math.nan, math.nan
        d = mc - mb
        se = math.sqrt(vb / nb + vc / nc)
        return d, d - 1.96 * se, d + 1.96 * se

    def summary(self, arm: str) -> dict[str, Any]:
        st = self.stats.get(arm, {})
        mean, _, n = self.mean_logprob(arm)
        d, lo, hi = self.shift()
        return {"scored_samples": n, "mean_token_logprob_nats": mean,
                "skipped_token_fraction": st.get("skipped", 0) / max(1, st.get("tokens", 0)),
                "out_of_support_tokens": st.get("out_of_support", 0),
                "logprob_shift_nats_per_token": d, "logprob_shift_ci95": [lo, hi]}

    def get_state(self) -> dict[str, Any]:
        return {"stats": self.stats, "charts": {a: c.get_state() for a, c in self.charts.items()}}

    def set_state(self, st: dict[str, Any]) -> None:
        for arm, cs in (st.get("charts") or {}).items():
            self._chart(arm).set_state(cs)
        self.stats.update(st.get("stats") or {})

    def reset(self, arm: str | None = None) -> None:
        """Acknowledge: restart the chart(s) so they can fire again (accumulators are kept)."""
        for a, c in self.charts.items():
            if arm is None or a == arm:
                c.reset()
