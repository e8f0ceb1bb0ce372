"""Shared helpers of the telemetry tests (a finished request built by hand, no vLLM needed)."""

from __future__ import annotations

from vllm_lookahead.telemetry.record import Decoder, FinishedRequest


class Spec:  # the two fields of vLLM's RequestSpecDecodeMetrics that the sampler reads
    def __init__(self, histogram, num_draft_tokens):
        self.histogram = histogram
        self.num_draft_tokens = num_draft_tokens


def make_request(rid: str = "cmpl-1", finish_reason: str | None = "stop", **kw) -> FinishedRequest:
    base = dict(
        request_id=rid, model="demo", operation="text_completion",
        decoder=Decoder("lookahead", {"k": 4, "window": 5, "ngram": 3, "pool_size": 8}, "0.1.0", "0.32.0"),
        arrival_unix_s=1000.0, finish_unix_s=1001.5, finish_reason=finish_reason,
        prompt="def add(a, b):", prompt_token_ids=[1, 2, 3], output_text=" return a + b",
        output_token_ids=[4, 5, 6, 7], num_prompt_tokens=3, num_output_tokens=4,
        first_token_unix_s=1000.25, queue_s=0.01,
        sampling={"temperature": 0.0, "top_p": 1.0, "top_k": None, "seed": None, "max_tokens": 16, "n": 1},
        spec=Spec([1, 0, 2, 1], 12), trace_id=0x1234, span_id=0x99,
    )
    base.update(kw)
    return FinishedRequest(**base)


def sampler_counts(metrics: dict[str, float]) -> dict[str, float]:
    dropped = sum(v for k, v in metrics.items() if k.startswith("vllm_lookahead_sampler_dropped_total"))
    return {"sampled": metrics.get("vllm_lookahead_sampler_sampled_total", 0.0),
            "sent": metrics.get("vllm_lookahead_sampler_sent_total", 0.0),
            "failed": metrics.get("vllm_lookahead_sampler_failed_total", 0.0),
            "dropped": dropped}


def check_draft_mask(mask: str | None, num_tokens: int, spec: dict) -> None:
    """The mask covers the output, starts with the prefill's token, and agrees with vLLM's own counters
    (the last step may be cut by a stop: one step end and up to k accepted tokens fewer)."""
    assert mask is not None and len(mask) == num_tokens and mask[0] == ".", (mask, spec)
    ends = mask.count("R") + mask.count("B")
    assert spec["num_spec_steps"] - 1 <= ends <= spec["num_spec_steps"], (mask, spec)
    accepted = spec["num_accepted_draft_tokens"]
    assert accepted - spec["num_spec_tokens"] <= mask.count("A") <= accepted, (mask, spec)
