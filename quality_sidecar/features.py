"""Per-sample features: the compact record the detectors consume (no raw sample kept around)."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Features:
    request_id: str
    model: str
    arm: str
    trace_id: str | None
    greedy: bool
    pair_key: str
    length: int
    finish_reason: str
    truncated: bool
    acceptance: float
    text: str | None
    token_ids: list[int] | None
    flags: dict[str, bool] = field(default_factory=dict)
    embedding: Any = None  # text vector, filled lazily by the first two-sample test that needs it


def pair_key(sample: dict[str, Any]) -> str:
    """Prompt hash + the sampling params that change the output: same key = comparable outputs."""
    s = sample.get("sampling") or {}
    params = {k: s.get(k) for k in ("temperature", "top_p", "top_k", "seed", "max_tokens", "response_format")}
    h = hashlib.sha1(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{sample['prompt']['sha256']}:{h}"


def acceptance_of(spec: dict[str, Any] | None) -> float:
    if not spec:
        return math.nan
    a = spec.get("acceptance_rate")
    if a is not None:
        return float(a)
    d = spec.get("num_draft_tokens") or 0
    return spec.get("num_accepted_tokens", 0) / d if d else math.nan


def extract(sample: dict[str, Any]) -> Features:
    out = sample["output"]
    ids = out.get("token_ids")
    n = out.get("num_tokens")
    if n is None:
        n = len(ids) if ids is not None else len((out.get("text") or "").split())
    temp = (sample.get("sampling") or {}).get("temperature")
    fr = out.get("finish_reason")
    max_tokens = (sample.get("sampling") or {}).get("max_tokens")
    # "Truncated" = stopped before its natural end for a reason other than the token budget the
    # client chose: abort/error, or 'length' with fewer tokens than max_tokens (a model-length or
    # decoder cut).  Hitting max_tokens is the client's choice; its rate is tested via finish_reason.
    truncated = fr in ("abort", "error") or (fr == "length" and (max_tokens is None or int(n) < max_tokens))
    return Features(
        request_id=sample["request_id"], model=sample["model"], arm=sample["deployment"]["arm"],
        trace_id=sample.get("trace_id"), greedy=temp is not None and temp == 0, pair_key=pair_key(sample),
        length=int(n), finish_reason=str(fr), truncated=truncated,
        acceptance=acceptance_of(sample.get("spec")), text=out.get("text"), token_ids=ids,
    )
