"""What the frontend hook captures when a request finishes, and the schema-v1 sample built from it.

``FinishedRequest`` holds *references* (no copies, no hashing, no JSON): building it is the only work
done on the request path.  ``build_sample`` runs later on the sampler's own thread.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from quality_sidecar.schema import SCHEMA_VERSION

ERROR_FINISH_REASONS = frozenset({"error", "abort"})


@dataclass(frozen=True)
class Decoder:
    """The speculative decoder of one engine: ``method`` and the params reported in telemetry."""

    method: str = "none"
    params: dict[str, Any] = field(default_factory=dict)
    plugin_version: str | None = None
    vllm_version: str | None = None
    dtype: str | None = None  # the model's compute dtype (schema 1.4 decoder.dtype)
    seeded_exact: bool | None = None  # seeded T>0 output reproduces without speculation (schema 1.5)


@dataclass(slots=True)
class FinishedRequest:
    request_id: str
    model: str
    operation: str
    decoder: Decoder
    arrival_unix_s: float
    finish_unix_s: float
    finish_reason: str | None
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    output_text: str | None = None
    output_token_ids: list[int] | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    first_token_unix_s: float | None = None
    queue_s: float | None = None
    tpot_s: float | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    spec: Any = None  # vllm RequestSpecDecodeMetrics (duck-typed: histogram, num_draft_tokens)
    stop_reason: Any = None
    trace_id: int = 0  # 0: none yet; set by the frontend (parent's trace id or a fresh one)
    span_id: int = 0
    parent: Any = None  # opentelemetry Context or None
    parent_is_remote: bool = False
    error: dict[str, str] | None = None
    # vLLM's own id for this request when ``request_id`` had to be made globally unique (``vllm.LLM``
    # numbers requests 0, 1, ... in every process); None when they are the same.
    engine_request_id: str | None = None
    choice_index: int | None = None  # index of this sequence among the request's n choices (n > 1)

    @property
    def decision_id(self) -> str:
        """The id the sampling decision hashes: vLLM's own id, so that the same request (same id) is
        sampled or not in every process and replica, whatever prefix made ``request_id`` unique."""
        return self.engine_request_id or self.request_id

    @property
    def is_error(self) -> bool:
        return self.finish_reason in ERROR_FINISH_REASONS or self.error is not None

    @property
    def e2e_s(self) -> float:
        return max(0.0, self.finish_unix_s - self.arrival_unix_s)

    @property
    def ttft_s(self) -> float | None:
        if self.first_token_unix_s is None:
            return None
        return max(0.0, self.first_token_unix_s - self.arrival_unix_s)

    def tpot(self) -> float | None:
        """Time per output token after the first (semconv definition), seconds."""
        if self.tpot_s is not None:
            return self.tpot_s
        ttft = self.ttft_s
        if ttft is None or self.num_output_tokens < 2:
            return None
        return max(0.0, (self.e2e_s - ttft) / (self.num_output_tokens - 1))


def draft_mask(spec: Any, num_output_tokens: int | None) -> str | None:
    """One character per output token: how the step that committed it treated it.

    ``.`` a step without a draft; ``A`` an accepted draft token; ``R`` the token sampled in place of
    the first rejected draft token; ``B`` the bonus token after a step whose drafts were all accepted.
    A step is a run of ``A`` ended by one of ``.RB``, so a token's draft position is 1 + the ``A`` run
    before it.  From vLLM's ``detailed`` per-step lists with the steps without drafts filled in
    (``vllm/spec_steps.py``); tokens past the end (a stop or ``max_tokens`` inside a step) are cut.
    None when the lists cannot cover the output: not ``detailed``, or the steps without drafts are
    missing (the first output token always comes from such a step: the prefill).
    """
    drafted = list(getattr(spec, "per_step_drafted", None) or [])
    accepted = list(getattr(spec, "per_step_accepted", None) or [])
    if not num_output_tokens or not drafted or len(drafted) != len(accepted) or drafted[0] != 0:
        return None
    out: list[str] = []
    for d, a in zip(drafted, accepted):
        out += ["A"] * a + ["." if d == 0 else "B" if a >= d else "R"]
    return "".join(out[:num_output_tokens]) if len(out) >= num_output_tokens else None


def spec_summary(spec: Any, num_output_tokens: int | None = None) -> dict[str, Any] | None:
    """Schema-v1 ``spec`` block from vLLM's per-request spec-decode metrics (None without speculation).

    ``histogram[j]`` counts verification steps that accepted ``j`` draft tokens; mean accepted length
    counts the bonus token (accepted + 1), matching vLLM's ``mean_acceptance_length``.
    """
    if spec is None:
        return None
    hist = list(getattr(spec, "histogram", None) or [])
    steps = sum(hist)
    accepted = sum(j * c for j, c in enumerate(hist))
    drafted = int(getattr(spec, "num_draft_tokens", 0) or 0)
    per_step = list(getattr(spec, "per_step_drafted", None) or [])
    num_drafts = sum(1 for d in per_step if d > 0) if per_step else steps
    return {
        "num_drafts": int(num_drafts),
        "num_draft_tokens": drafted,
        "num_accepted_tokens": int(accepted),
        "acceptance_rate": (min(1.0, accepted / drafted) if drafted else None),
        "mean_accepted_length": (1.0 + accepted / steps) if steps else None,
        "steps": int(steps),
        "draft_mask": draft_mask(spec, num_output_tokens),
    }


def prompt_sha256(prompt: str | None, token_ids: list[int] | None) -> str:
    """Hash of the prompt text, or of its token ids when there is no text (schema v1)."""
    if prompt is not None:
        data = prompt.encode("utf-8", "surrogatepass")
    else:
        data = json.dumps(list(token_ids or []), separators=(",", ":")).encode()
    return hashlib.sha256(data).hexdigest()


def _scalar_params(params: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in params.items():
        if value is None or isinstance(value, (bool, int, float, str)):
            out[str(key)] = value
        else:
            out[str(key)] = json.dumps(value, sort_keys=True, default=str)
    return out


# Most allowed_token_ids a sample lists (schema 1.6 ``maxItems``).  A larger set is recorded as its
# count and sha256 only: the sidecar's check then skips the sample (counted) instead of shipping a
# vocabulary-sized list in every sample of that client.
MAX_ALLOWED_TOKEN_IDS = 4096


def allowed_token_ids_fields(ids: Any) -> dict[str, Any]:
    """Schema 1.6 ``sampling.allowed_token_ids`` (sorted, distinct; only up to ``MAX_ALLOWED_TOKEN_IDS``),
    ``allowed_token_ids_count`` and ``allowed_token_ids_sha256`` (of the sorted ids as compact JSON)."""
    distinct = sorted({int(t) for t in ids})
    out: dict[str, Any] = {
        "allowed_token_ids_count": len(distinct),
        "allowed_token_ids_sha256": hashlib.sha256(json.dumps(distinct, separators=(",", ":")).encode()).hexdigest(),
    }
    if len(distinct) <= MAX_ALLOWED_TOKEN_IDS:
        out["allowed_token_ids"] = distinct
    return out


def sampling_block(sampling: dict[str, Any]) -> dict[str, Any]:
    """The sample's ``sampling`` object from the hook's dict, whose allowed_token_ids / bad words are
    references to vLLM's lists (the request path copies nothing): copied, sorted, capped, hashed here."""
    out = dict(sampling)
    allowed = out.pop("allowed_token_ids", None)
    if allowed:
        out.update(allowed_token_ids_fields(allowed))
    if out.get("bad_words_token_ids"):
        out["bad_words_token_ids"] = [[int(t) for t in seq] for seq in out["bad_words_token_ids"]]
    if out.get("bad_words"):
        out["bad_words"] = [str(w) for w in out["bad_words"]]
    return out


def build_sample(req: FinishedRequest, *, arm: str, release: str | None, instance: str | None,
                 redact_prompts: bool) -> dict[str, Any]:
    """The schema-v1 sample for one finished request (validated by the caller)."""
    ttft = req.ttft_s
    tpot = req.tpot()
    sample: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "request_id": req.request_id,
        "trace_id": f"{req.trace_id:032x}" if req.trace_id else None,
        "span_id": f"{req.span_id:016x}" if req.span_id else None,
        "time": {
            "arrival_unix_s": req.arrival_unix_s,
            "first_token_unix_s": req.first_token_unix_s,
            "finish_unix_s": req.finish_unix_s,
            "queue_s": None if req.queue_s is None else max(0.0, req.queue_s),
            "ttft_s": ttft,
            "tpot_s": tpot,
            "e2e_s": req.e2e_s,
        },
        "model": req.model,
        "deployment": {"arm": arm, "release": release, "instance": instance},
        "decoder": {
            "method": req.decoder.method,
            "params": _scalar_params(req.decoder.params),
            "plugin_version": req.decoder.plugin_version,
            "vllm_version": req.decoder.vllm_version,
            "dtype": req.decoder.dtype,
            "seeded_exact": req.decoder.seeded_exact,
        },
        "sampling": sampling_block(req.sampling),
        "prompt": {
            "text": None if redact_prompts else req.prompt,
            "sha256": prompt_sha256(req.prompt, req.prompt_token_ids),
            "redacted": bool(redact_prompts),
            "num_tokens": req.num_prompt_tokens,
        },
        "prompt_token_ids": None if redact_prompts or req.prompt_token_ids is None
        else list(req.prompt_token_ids),
        "output": {
            "text": req.output_text,
            "token_ids": None if req.output_token_ids is None else list(req.output_token_ids),
            "num_tokens": req.num_output_tokens,
            "finish_reason": req.finish_reason,
            "stop_reason": stop_reason_value(req.stop_reason),
        },
        "spec": spec_summary(req.spec, req.num_output_tokens),
        "error": req.error,
    }
    if req.choice_index is not None:
        sample["output"]["index"] = req.choice_index
    if req.engine_request_id is not None:
        sample["vllm_request_id"] = req.engine_request_id
    return sample


def stop_reason_value(stop_reason: Any) -> int | str | None:
    """vLLM's stop reason as schema 1.1 carries it: the matched stop string, the stop token id
    (``stop_token_ids``), or None (EOS, length, abort)."""
    if stop_reason is None or isinstance(stop_reason, (int, str)):
        return stop_reason
    return str(stop_reason)
