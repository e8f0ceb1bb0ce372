"""Lookahead configuration: one validated dataclass, built from a dict (``additional_config["lookahead"]``
or the ``VLLM_LOOKAHEAD_CONFIG`` JSON environment variable).  Bad values raise ``LookaheadConfigError``
naming the key, the value and the allowed range, so a typo fails at engine start, not mid-request; an
unknown key (a typo, or a key of an unreleased draft of this config) fails listing the known ones, and a
key that moved to an opt-in extension's own section (``vllm_lookahead.extensions.MOVED_KEYS``) fails
naming where it went.  The validation helpers (``check_fields``, ``floats``) serve those sections too."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, fields
from typing import Any

from vllm_lookahead.extensions import MOVED_KEYS


class LookaheadConfigError(ValueError):
    pass


# Ranges and choices, declared once: ``__post_init__`` enforces them, and the Helm chart's values.schema.json
# ``lookahead`` subtree is generated from them (deploy/scripts/gen_lookahead_schema.py; a test fails on
# drift).  (lo, hi): inclusive; hi None = unbounded.  Keys not listed here have no range.
LIMITS: dict[str, tuple[float, float | None]] = {
    "max_prompt_index_tokens": (0, None), "min_match": (1, 32), "max_match": (1, 32),
    "memory_tokens": (0, 100_000_000), "memory_depth": (1, 32), "chain_min_p": (0.0, 1.0),
    "chain_busy_min_p": (0.0, 1.0), "batch_size_threshold": (1, None), "max_batch_draft_tokens": (0, None),
    "guard_batch_size": (1, None),
}
CHOICES: dict[str, tuple[str, ...]] = {}  # key -> allowed strings (none at present; schema "enum")
K_LIMITS = (1, 128)
"""num_speculative_tokens: vLLM's MAX_SPEC_LEN bounds a step's draft rows."""
BUSY_FLOOR_BY_K = ((4, 0.05), (8, 0.15))
"""(k, floor) points of the default busy floor (``LookaheadConfig.busy_floor``)."""


def _field_type(f: dataclasses.Field) -> tuple[str, bool]:
    """A config field's type as (base type name, whether None is allowed): ``"float | None"`` ->
    ("float", True).  The annotations are strings here (``from __future__ import annotations``)."""
    text = str(f.type)
    return text.split(" |")[0], text.endswith("| None")


def range_text(key: str, limits: dict[str, tuple[float, float | None]] = LIMITS,
               notes: dict[str, str] | None = None) -> str:
    lo, hi = limits[key]
    text = f"must be >= {lo}" if hi is None else f"must be in {lo}..{hi}"
    return text + (notes or {}).get(key, "")


def check_fields(obj: Any, limits: dict[str, tuple[float, float | None]], choices: dict[str, tuple[str, ...]],
                 prefix: str = "", notes: dict[str, str] | None = None) -> None:
    """Types, ranges and choices of a config dataclass's fields."""

    def need(cond: bool, key: str, rule: str) -> None:
        if not cond:
            raise LookaheadConfigError(f"lookahead config: {prefix}{key}={getattr(obj, key)!r} is invalid; {rule}")

    for f in fields(obj):
        v = getattr(obj, f.name)
        base, optional = _field_type(f)
        if v is None and optional:  # unset: a default chosen at run time
            continue
        expected = bool if base == "bool" else float if base == "float" else str if base == "str" else int
        ok = isinstance(v, expected) if expected in (bool, str) else (
            isinstance(v, (int, float)) and not isinstance(v, bool) if expected is float
            else isinstance(v, int) and not isinstance(v, bool))
        need(ok, f.name, f"expected {expected.__name__}")
    for key, (lo, hi) in limits.items():
        v = getattr(obj, key)
        need(v is None or (v >= lo and (hi is None or v <= hi)), key, range_text(key, limits, notes))
    for key, allowed in choices.items():
        need(getattr(obj, key) in allowed, key, "must be " + " or ".join(f'"{c}"' for c in allowed))


def floats(cls: type, raw: dict[str, Any]) -> dict[str, Any]:
    """Ints given where floats are expected are fine."""
    for f in fields(cls):
        if f.name in raw and _field_type(f)[0] == "float" and isinstance(raw[f.name], int) \
                and not isinstance(raw[f.name], bool):
            raw[f.name] = float(raw[f.name])
    return raw


@dataclass(frozen=True)
class LookaheadConfig:
    max_prompt_index_tokens: int = 8192
    """Only the last this-many prompt tokens are scanned for context matches, bounding the cost of a long
    prompt.  Default 8192."""
    min_match: int = 1
    """Shortest suffix of the committed tokens that the context match (prompt lookup over prompt and
    output) may match on.  Default 1."""
    max_match: int = 4
    """Longest suffix the context match tries first (it drafts what followed the most recent earlier
    occurrence of the longest matching suffix).  Default 4."""
    memory_tokens: int = 65536
    """Output tokens kept in the engine-wide memory of earlier outputs (0 = off), oldest outputs evicted
    first; requests of different LoRA adapters or tenants (``extra_args["lookahead"]["tenant"]``) never
    draft from each other's outputs.  At most ``memory_depth`` entries of 44 bytes per token.
    Default 65536."""
    memory_depth: int = 8
    """Longest context (tokens) the output memory matches on.  Default 8."""
    chain_min_p: float = 0.05
    """With one running request a draft token is drafted while its estimated probability of being
    committed (the learned acceptance estimates of it and its predecessors, times the request's own
    accepted/expected history) is at least this; with more requests the floor rises linearly to the
    busy floor at ``batch_size_threshold``.  Default 0.05."""
    chain_busy_min_p: float | None = None
    """The floor from ``batch_size_threshold`` running requests on.  Unset (None, the default): chosen by
    k -- 0.05 up to k = 4, rising linearly to 0.15 at k = 8 and staying there, as a request's draft rows
    cost more step time the longer its drafts are.  Raise it where draft rows are dear."""
    batch_size_threshold: int = 16
    """Running requests at which the floor reaches the busy floor (``chain_busy_min_p``).  Default 16."""
    measured_floor: bool = True
    """Once the engine has timed enough of its own steps at a batch size (32 per power-of-two bucket of
    running requests), the floor there is the measured price of a draft row -- the step time one row
    adds times the tokens/s of those steps -- at least ``chain_min_p``, at most 0.5.  False: the fixed
    floors always.  Default True."""
    max_batch_draft_tokens: int = 256
    """Draft tokens per step across the whole batch; beyond it the most probable draft tokens are kept.
    Default 256."""
    guard_batch_size: int = 16
    """Above this many running requests a guard per batch-size bucket (17-32, 33-64, ...) times the
    engine's own steps with drafts and without, and runs whichever serves more tokens/s (a loser is
    re-tried 2 steps in 64).  With ``measured_floor`` a batch with a request sampling at T > 0 is guarded
    at any size.  Lower it where a batch of this size is compute-bound.  Default 16."""
    def __post_init__(self) -> None:
        check_fields(self, LIMITS, CHOICES)
        if self.min_match > self.max_match:
            raise LookaheadConfigError(f"lookahead config: min_match={self.min_match!r} is invalid; "
                                       "must be <= max_match")

    def busy_floor(self, k: int) -> float:
        """The floor from ``batch_size_threshold`` rows on, for drafts of up to ``k`` tokens:
        ``chain_busy_min_p`` if set, else 0.05 at k <= 4, 0.15 at k >= 8, linear between."""
        if self.chain_busy_min_p is not None:
            return self.chain_busy_min_p
        lo, hi = BUSY_FLOOR_BY_K
        return lo[1] + (hi[1] - lo[1]) * min(max(k - lo[0], 0), hi[0] - lo[0]) / (hi[0] - lo[0])

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> LookaheadConfig:
        raw = dict(raw or {})
        moved = sorted(set(raw) & set(MOVED_KEYS))
        if moved:
            raise LookaheadConfigError(f"lookahead config: {moved[0]!r} is not a key of the lookahead section; "
                                       f"{MOVED_KEYS[moved[0]]}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise LookaheadConfigError(f"lookahead config: unknown key(s) {unknown}; known keys: {sorted(known)}")
        return cls(**floats(cls, raw))

    @classmethod
    def from_sources(cls, additional_config: dict[str, Any] | None) -> LookaheadConfig:
        """``additional_config["lookahead"]`` wins; else ``$VLLM_LOOKAHEAD_CONFIG`` (JSON); else defaults."""
        if additional_config and "lookahead" in additional_config:
            section = additional_config["lookahead"]
            if not isinstance(section, dict):
                raise LookaheadConfigError('additional_config["lookahead"] must be a JSON object')
            return cls.from_dict(section)
        env = os.environ.get("VLLM_LOOKAHEAD_CONFIG")
        if env:
            try:
                section = json.loads(env)
            except json.JSONDecodeError as e:
                raise LookaheadConfigError(f"VLLM_LOOKAHEAD_CONFIG is not valid JSON: {e}") from None
            if not isinstance(section, dict):
                raise LookaheadConfigError("VLLM_LOOKAHEAD_CONFIG must be a JSON object")
            return cls.from_dict(section)
        return cls()

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def overrides(self) -> dict[str, Any]:
        """The validated settings that differ from the defaults (what telemetry reports as the decoder's
        params: nothing unvalidated, scalar values)."""
        default = LookaheadConfig()
        return {k: v for k, v in self.as_dict().items() if v != getattr(default, k)}


def _schema(cls: type, limits: dict[str, tuple[float, float | None]],
           choices: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    """JSON schema of a config dataclass: types, ranges, choices, defaults; no unknown keys."""
    props: dict[str, Any] = {}
    for f in fields(cls):
        base, optional = _field_type(f)
        kind: Any = {"bool": "boolean", "float": "number", "str": "string"}.get(base, "integer")
        if optional:
            kind = [kind, "null"]
        prop: dict[str, Any] = {"type": kind, "default": f.default}
        if f.name in limits:
            lo, hi = limits[f.name]
            prop["minimum"] = lo
            if hi is not None:
                prop["maximum"] = hi
        if f.name in choices:
            prop["enum"] = list(choices[f.name])
        props[f.name] = prop
    return {"type": "object", "additionalProperties": False, "properties": props}


def json_schema() -> dict[str, Any]:
    """JSON schema of a ``lookahead`` config dict (types, ranges, choices, defaults; no unknown keys),
    generated from the dataclasses and ``LIMITS``/``CHOICES`` -- the chart's schema embeds it."""
    return _schema(LookaheadConfig, LIMITS, CHOICES)
