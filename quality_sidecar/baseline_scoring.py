"""T>0 sampling conformance in the sidecar: score sampled outputs under a baseline server, chart them.

For a fraction (``ConformanceConfig.fraction``) of the T>0 samples of each arm, a background worker
(``workers.py``: never drops a selected sample) asks the baseline server (``--baseline-url``, any
OpenAI-compatible server that returns prompt log-probs: vLLM's ``prompt_logprobs``, or ``echo`` +
``logprobs``) for the top-K log-probs of prompt + output, scores them
(``detectors.conformance_scoring.score_topk``) and feeds the per-(model, arm) charts of
``conformance_monitor.py``: reference-free, because the null is known exactly.  The candidate arm's
chart is the alarm; the baseline arm's is the control (an alarm there means the scorer and the serving
engine disagree: another model revision, dtype or sampler).  The request path is never touched.

Cost per scored sample: one prefill of prompt + output on the baseline server (no decode), plus
~0.1 ms of numpy here (K = 20).
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .detectors.conformance_scoring import (
    OOS_TOLERANCE_NATS,
    SamplerParams,
    SequenceScore,
    score_topk,
)
from .workers import (
    PairWorker,
    WorkFailed,
    base_url,
    classify_http_failure,
    http_status_failure,
)

log = logging.getLogger(__name__)


@dataclass
class ConformanceConfig:
    """Knobs of the T>0 conformance detector (``conformance:`` in the sidecar YAML)."""

    # Share of each arm's T>0 samples scored by the baseline server.  All of them by default: the
    # producer already samples (1% of requests by default), a moderate fault (+0.08 nat/token) needs
    # ~500 scored samples, and backpressure makes an overloaded baseline server slow the sidecar
    # down (visible as lag) rather than lose evidence.
    fraction: float = 1.0
    top_logprobs: int = 20  # K (at least; a sample's larger top-k raises it): vLLM's default --max-logprobs is 20
    # Tokens between false alarms per (model, arm) chart: 1e9 = 1M samples of 1,000 tokens, 24M samples
    # of the demo model's ~41-token outputs.  The chart counts tokens because the token stream's PIT
    # values are i.i.d. U(0,1) whatever the output lengths (see PitCusum).
    ert_tokens: float = 1e9
    shift: float = 0.04  # per-token shift of E[(u - 1/2) sqrt(12)] to detect fastest (= mean u +- 0.0115)
    # The late-draft-position chart's shift, per token at draft position >= 2.  Larger than ``shift``:
    # those tokens are a few percent of the stream, so a late-only fault that matters is large per
    # token, while a small per-token drift there (bf16 rounding of the verify pass) is harmless.
    late_shift: float = 0.2
    # Samples queued or in scoring at which the service stops reading its source until half are done
    # (backpressure: selected samples are never dropped).
    max_queue: int = 256
    timeout_s: float = 60.0
    api: str = "auto"  # prompt_logprobs | echo | auto (prompt_logprobs, falling back to echo)
    # The served model's vocabulary size: token ids at or above it are impossible, and at T > 1 the
    # unknown tail's mass is bounded by it (None: such tokens are skipped instead of counted).
    vocab_size: int | None = None
    oos_tolerance_nats: float = OOS_TOLERANCE_NATS  # numeric slack of an "impossible token" verdict
    # Impossible tokens per token that numeric noise between the serving engine and the scorer may
    # produce without alarming (measured on real exact streams: 0 in float32; see docs/sidecar.md).
    impossible_floor_per_token: float = 1e-5

    def __post_init__(self) -> None:
        if not 0 <= self.fraction <= 1:
            raise ValueError(f"conformance.fraction must be in [0, 1], got {self.fraction}")
        if not 1 <= self.top_logprobs <= 1000:
            raise ValueError(f"conformance.top_logprobs must be in [1, 1000], got {self.top_logprobs}")
        if self.api not in ("auto", "prompt_logprobs", "echo"):
            raise ValueError(f"conformance.api must be auto, prompt_logprobs or echo, got {self.api!r}")
        if self.ert_tokens <= 1 or self.shift <= 0 or self.late_shift <= 0:
            raise ValueError("conformance.ert_tokens must be > 1, conformance.shift and late_shift > 0")
        if self.max_queue < 1 or self.timeout_s <= 0:
            raise ValueError("conformance.max_queue must be >= 1, conformance.timeout_s > 0")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError(f"conformance.vocab_size must be >= 1, got {self.vocab_size}")
        if self.oos_tolerance_nats < 0 or self.impossible_floor_per_token < 0:
            raise ValueError("conformance.oos_tolerance_nats and impossible_floor_per_token must be >= 0")


# JSON has no -inf, so vLLM sends a log-prob of -inf (a token the model gives probability 0) as -9999.0:
# ``max(logprob, -9999.0)`` for completion log-probs, ``clamp_prompt_logprobs`` for prompt log-probs
# (vLLM 0.32; checked against a real server in test_conformance_serve.py).  Read as a number, one such
# token would add -9999/n nats to a sample's mean log-prob and pass as possible; read as -inf it is an
# impossible token.  Anything at or below it is read as -inf too (no real log-prob is that small).
VLLM_NEG_INF = -9999.0


def read_logprob(v: float) -> float:
    """A log-prob from the server's JSON, with vLLM's -9999.0 stand-in (and below) read back as -inf."""
    v = float(v)
    return -math.inf if v <= VLLM_NEG_INF else v


class LogprobClient:
    """Top-K log-probs of every position of a token sequence from an OpenAI-compatible server.

    ``prompt_logprobs`` (vLLM): ``POST /v1/completions`` with the token ids as prompt, ``max_tokens: 1``
    and ``prompt_logprobs: K``; each position's dict holds the top K (rank <= K) and the actual token.
    ``echo`` (OpenAI legacy): ``echo: true, logprobs: K`` and vLLM's ``return_tokens_as_token_ids``
    so tokens come back as ``token_id:N``.  Returns arrays for the *last* ``n_out`` positions.
    """

    def __init__(self, url: str, model: str | None = None, top_logprobs: int = 20, timeout_s: float = 30.0,
                 api: str = "auto"):
        self.url, self.model, self.k, self.timeout_s, self.api = base_url(url), model, top_logprobs, timeout_s, api
        self.server_max: int | None = None  # the server's --max-logprobs, once it has refused a larger K

    def k_for(self, top_k: int) -> int:
        """K to ask for: at least the sample's top-k (else a token ranked between K and top-k cannot be
        proven impossible), at most what the server accepts."""
        k = max(self.k, top_k)
        return min(k, self.server_max) if self.server_max else k

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST /v1/completions; failures as ``WorkFailed`` (``rejected_token_ids`` when the server
        refuses the sequence's token ids: vLLM answers 400 "Token id N is out of vocabulary";
        ``context_limit`` when the sequence leaves no room for the one token a request must ask for:
        vLLM 0.32 clamps ``max_tokens`` to the context left and answers 400 "max_tokens must be at least
        1, got 0" at exactly max_model_len tokens, "... maximum context length ..." beyond it)."""
        import requests

        try:
            r = requests.post(f"{self.url}/v1/completions", json=body, timeout=self.timeout_s)
        except requests.RequestException as e:
            raise classify_http_failure(e) from e
        if r.status_code >= 300:
            err = http_status_failure(self.url, r.status_code, r.text)
            if r.status_code == 400 and re.search(r"token[ _]?id|vocab", r.text, re.I):
                err.reason = "rejected_token_ids"
            elif r.status_code == 400 and re.search(r"maximum context length|max_tokens must be at least 1, got 0",
                                                    r.text, re.I):
                err.reason = "context_limit"
            raise err
        try:
            return r.json()
        except ValueError as e:
            raise WorkFailed("bad_response", f"{self.url} answered non-JSON: {r.text[:200]}", False) from e

    def score(self, prompt_ids: list[int], output_ids: list[int], model: str | None = None, top_k: int = 0
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(top_ids [n, K], top_logprobs [n, K], token_logprobs [n]) for the n = len(output_ids) outputs;
        K = ``k_for(top_k)``.  A server that refuses that K (vLLM: 400 "... greater than max allowed: 20")
        is asked again with its maximum, which is remembered.

        An output that ran to the context limit (prompt + output = the server's max_model_len) cannot be
        sent whole: a request must leave room for one generated token.  It is scored without its last
        token (n - 1 rows): the scored tokens are then a prefix of the output whose length was fixed by
        the context, not by what the sampler drew, so the PIT and excess statistics stay unbiased."""
        k = self.k_for(top_k)
        try:
            return self._score_fitting(prompt_ids, output_ids, model, k)
        except Exception as e:  # WorkFailed here; the gate's endpoint client raises its own errors
            m = re.search(r"logprobs.{0,80}max(?:imum)? allowed:?\s*(\d+)", str(e), re.I)
            if not m or k <= self.k or int(m.group(1)) >= k:
                raise
            self.server_max = max(self.k, int(m.group(1)))
            return self._score_fitting(prompt_ids, output_ids, model, self.server_max)

    def _score_fitting(self, prompt_ids: list[int], output_ids: list[int], model: str | None, k: int
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        try:
            return self._score(prompt_ids, output_ids, model, k)
        except WorkFailed as e:
            if e.reason != "context_limit" or len(output_ids) < 2:
                raise
            return self._score(prompt_ids, output_ids[:-1], model, k)

    def _score(self, prompt_ids: list[int], output_ids: list[int], model: str | None, k: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        seq = [int(t) for t in prompt_ids] + [int(t) for t in output_ids]
        n = len(output_ids)
        if self.api in ("auto", "prompt_logprobs"):
            body = {"model": model or self.model, "prompt": seq, "max_tokens": 1, "temperature": 0.0,
                    "prompt_logprobs": k}
            choice = self._post(body)["choices"][0]
            plp = choice.get("prompt_logprobs")
            if plp is not None:
                return self._from_prompt_logprobs(plp[-n:], output_ids, k)
            if self.api == "prompt_logprobs":
                raise WorkFailed("bad_response", "baseline server ignored prompt_logprobs (not vLLM?): use api=echo", False)
        body = {"model": model or self.model, "prompt": seq, "max_tokens": 1, "temperature": 0.0, "echo": True,
                "logprobs": k, "return_tokens_as_token_ids": True}
        lp = self._post(body)["choices"][0].get("logprobs") or {}
        tops, toks = lp.get("top_logprobs"), lp.get("token_logprobs")
        if not tops or toks is None or len(toks) < len(seq):
            raise WorkFailed("bad_response", "baseline server returned no echo log-probs for the prompt", False)
        return self._from_echo(tops[len(seq) - n:len(seq)], toks[len(seq) - n:len(seq)], output_ids, k)

    @staticmethod
    def _from_prompt_logprobs(rows: list[dict[str, Any]], output_ids: list[int], k: int):
        ids = np.full((len(rows), k), -1, np.int64)
        lps = np.full((len(rows), k), -np.inf)
        tok = np.empty(len(rows))
        for i, (d, y) in enumerate(zip(rows, output_ids)):
            if d is None:
                raise WorkFailed("bad_response", "baseline server returned no log-probs for an output position", False)
            items = sorted(((int(t), v) for t, v in d.items()), key=lambda kv: kv[1].get("rank", 0) or 0)
            top = [(t, read_logprob(v["logprob"])) for t, v in items if (v.get("rank") or 0) <= k][:k]
            for j, (t, v) in enumerate(top):
                ids[i, j], lps[i, j] = t, v
            entry = d.get(str(y)) or d.get(y)
            if entry is None:
                raise WorkFailed("bad_response", f"baseline server omitted the sampled token {y} from prompt_logprobs", False)
            tok[i] = read_logprob(entry["logprob"])
        return ids, lps, tok

    @staticmethod
    def _from_echo(tops: list[dict[str, float] | None], toks: list[float | None], output_ids: list[int], k: int):
        ids = np.full((len(tops), k), -1, np.int64)
        lps = np.full((len(tops), k), -np.inf)
        tok = np.empty(len(tops))
        for i, (d, t_lp) in enumerate(zip(tops, toks)):
            if d is None or t_lp is None:
                raise WorkFailed("bad_response", "baseline server returned no log-probs for an output position", False)
            items = sorted(d.items(), key=lambda kv: -kv[1])[:k]
            for j, (name, v) in enumerate(items):
                if not str(name).startswith("token_id:"):
                    raise WorkFailed("bad_response", "echo log-probs without token ids (server lacks return_tokens_as_token_ids)", False)
                ids[i, j], lps[i, j] = int(str(name).split(":", 1)[1]), read_logprob(v)
            tok[i] = read_logprob(t_lp)
        return ids, lps, tok


def unscorable_reason(sampling: dict[str, Any]) -> str | None:
    """Why a T>0 sample's distribution cannot be rebuilt from prompt log-probs (None: greedy).  Such
    samples are counted per reason, so that a decoder whose faults hide behind these options shows up
    as a share of its traffic nobody checks."""
    if not (sampling.get("temperature") or 0) > 0:
        return None
    if sampling.get("response_format"):
        return "structured_output"
    if any(sampling.get(k) for k in ("frequency_penalty", "presence_penalty")) \
            or sampling.get("repetition_penalty") not in (None, 1, 1.0):
        return "penalties"
    # Schema 1.6 names these two (their outputs still get the exact checks, ``exact_checks``); older
    # samples and the other modifiers (logit bias, logits processors) say only ``logits_modified``.
    if sampling.get("allowed_token_ids") or sampling.get("allowed_token_ids_count"):
        return "allowed_token_ids"
    if sampling.get("bad_words_token_ids") or sampling.get("bad_words"):
        return "bad_words"
    return "logits_modified"


def scorable(sample: dict[str, Any]) -> SamplerParams | str | None:
    """The sampler to judge a sample under, a reason it cannot be judged, or None (not T>0 plain).

    Excluded, with the reason as a string: requests that ended by ``abort`` / ``error`` (cut at an
    arbitrary point, and always sampled by the producer: ~100x over-represented), ``min_tokens`` > 0
    (EOS was masked until then: the sampler's distribution differs from the model's), samples
    without token ids, and T>0 requests with penalties, logit modifiers or structured output
    (``unscorable_reason``).  None: greedy.
    """
    params = SamplerParams.from_sampling(sample.get("sampling"))
    if params is None:
        return unscorable_reason(sample.get("sampling") or {})
    out = sample.get("output") or {}
    if sample.get("error") or out.get("finish_reason") in ("abort", "error"):
        return "aborted"
    if ((sample.get("sampling") or {}).get("min_tokens") or 0) > 0:
        return "min_tokens"
    if not sample.get("prompt_token_ids") or not out.get("token_ids"):
        return "no_token_ids"
    return params


def draft_positions(sample: dict[str, Any]) -> np.ndarray | None:
    """Per output token, its draft position from the sample's ``spec.draft_mask`` (schema 1.3): 0 for
    a token of a step without a draft, j for the j-th token a verification step committed (accepted
    drafts ``A``, then the recovered ``R`` or bonus ``B`` token).  None without a usable mask."""
    mask = (sample.get("spec") or {}).get("draft_mask")
    n = len((sample.get("output") or {}).get("token_ids") or [])
    return mask_positions(mask) if mask and len(mask) == n else None


def mask_positions(mask: str) -> np.ndarray:
    """Draft position of every token of a draft mask (see ``draft_positions``)."""
    out = np.zeros(len(mask), np.int64)
    run = 0
    for i, c in enumerate(mask):
        if c == ".":
            run = 0
            continue
        out[i] = run + 1
        run = run + 1 if c == "A" else 0
    return out


def out_of_vocab_score(token_ids: list[int], vocab_size: int) -> SequenceScore | None:
    """A sample holding token ids outside the vocabulary, judged without asking the server (which
    would refuse it): those tokens are impossible, the others unscored.  None when all ids are valid."""
    ids = np.asarray(token_ids, np.int64)
    bad = int(((ids < 0) | (ids >= vocab_size)).sum())
    if not bad:
        return None
    return SequenceScore(np.full(len(ids), np.nan), np.zeros(0), out_of_support=bad, skipped=len(ids) - bad,
                         oos_reasons={"vocab": bad})


def score_sample(client: LogprobClient, sample: dict[str, Any], params: SamplerParams, cfg: ConformanceConfig,
                 rng: np.random.Generator) -> SequenceScore:
    """One sample scored under the baseline server (ids outside ``cfg.vocab_size`` judged without it);
    raises ``WorkFailed`` as the client does.  The streaming scorer and ``quality-sidecar score`` share it."""
    out = sample["output"]["token_ids"]
    sc = out_of_vocab_score(out, cfg.vocab_size) if cfg.vocab_size else None
    if sc is None:
        ids, lps, tok = client.score(sample["prompt_token_ids"], out, model=sample.get("model"), top_k=params.top_k)
        sc = score_topk(ids, lps, out[:len(tok)], tok, params, rng, vocab_size=cfg.vocab_size,
                        tolerance=cfg.oos_tolerance_nats)  # a prefix of the output at the context limit
    return sc


class ScoringWorker(PairWorker):
    """Background scorer: ``submit(sample)`` (non-blocking) -> ``on_result(sample, SequenceScore)``.

    Counts (``counts``): ``submitted``, ``done`` (scored), ``failed``, ``retries`` and
    ``skipped_<reason>`` (``scorable``); ``skips`` counts the skipped samples per (model, arm, reason),
    as the replay worker does, so that a decoder whose traffic hides from the scorer shows on its own
    arm; ``failures`` per (arm, reason).  Greedy samples are not eligible and not counted.
    """

    thread_name = "conformance-scorer"

    def __init__(self, client: LogprobClient, on_result: Callable[[dict, SequenceScore], None],
                 cfg: ConformanceConfig, seed: int = 0):
        self.client, self.on_result, self.cfg = client, on_result, cfg
        self.np_rng = np.random.default_rng(seed)
        self.skips: Counter[tuple[str, str, str]] = Counter()
        super().__init__(cfg.fraction, cfg.max_queue, seed)

    def prepare(self, sample: dict[str, Any]) -> Any:
        params = scorable(sample)
        if isinstance(params, str):
            self.skips[(str(sample.get("model")), str((sample.get("deployment") or {}).get("arm")), params)] += 1
        return params if params is None or isinstance(params, str) else (sample, params)

    def handle(self, item: tuple[dict[str, Any], SamplerParams]) -> None:
        sample, params = item
        self.on_result(sample, score_sample(self.client, sample, params, self.cfg, self.np_rng))


IMPOSSIBLE_ALPHA = 1e-6  # per update of the impossible-token chart (see ImpossibleTokenChart)
