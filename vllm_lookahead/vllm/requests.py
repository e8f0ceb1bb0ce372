"""What the proposer reads of vLLM's request objects (``runner.requests[req_id]``): how many drafts a
request can still use, whose earlier outputs it may draft from, and its temperature.  Plain functions
of the request, so that they are tested without an engine (tests/core/test_chain.py)."""

from __future__ import annotations

from typing import Any


def draft_room(requests: Any, req_ids: list[str], num_tokens: list[int], prompt_lens: list[int], k: int) -> list[int]:
    """How many draft tokens each row can still use: one step commits its accepted drafts plus one token,
    so a request ``r`` output tokens short of its ``max_tokens`` uses at most ``r - 1`` drafts (capped at
    ``k``).  Why: vLLM schedules whatever is drafted, and near the cap the rest are rows that cost step
    time and can never be committed -- every request that stops at ``max_tokens`` pays that in its last
    step or two."""
    room = []
    for rid, nt, pl in zip(req_ids, num_tokens, prompt_lens):
        req = requests.get(rid)
        params = getattr(req, "sampling_params", None)
        max_tokens = getattr(params, "max_tokens", None)
        room.append(k if max_tokens is None else max(0, min(k, pl + max_tokens - nt - 1)))
    return room


def isolation_key(req: Any) -> tuple[Any, Any]:
    """Whose earlier outputs a request may draft from: (LoRA adapter, tenant).  The tenant is
    ``SamplingParams.extra_args["lookahead"]["tenant"]`` (or ``extra_args["tenant"]``); requests of
    different adapters or tenants never see each other's outputs in the engine-wide memory.  The model
    is implicit: the memory lives in one engine."""
    lora = getattr(req, "lora_request", None)
    lora_id = getattr(lora, "lora_name", None) or getattr(lora, "lora_int_id", None) if lora else None
    extra = getattr(getattr(req, "sampling_params", None), "extra_args", None) or {}
    la = extra.get("lookahead") if isinstance(extra.get("lookahead"), dict) else {}
    tenant = la.get("tenant", extra.get("tenant"))
    return (lora_id, None if tenant is None else str(tenant))


def request_temperature(req: Any) -> float:
    """A request's sampling temperature (0: greedy; a request without sampling parameters is greedy):
    the drafter estimates its drafts with the acceptance of its sampler class (``core.acceptance``)."""
    params = getattr(req, "sampling_params", None)
    temperature = getattr(params, "temperature", None)
    return 0.0 if temperature is None else float(temperature)
