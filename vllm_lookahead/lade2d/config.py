"""The 2D layout's configuration: ``additional_config["lookahead2d"]`` (the ``lookahead2d:`` decoder SPEC
writes it), validated as the ``lookahead`` section is (``core.config``'s helpers).  The chain settings of a
2D engine -- requests that do not run 2D draft a chain -- stay in ``additional_config["lookahead"]``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any

from vllm_lookahead.core.config import LookaheadConfigError, check_fields, floats

SECTION = "lookahead2d"
"""The ``additional_config`` key of this section."""
LIMITS: dict[str, tuple[float, float | None]] = {
    "window": (1, 64), "ngram": (3, 16), "candidates": (0, 64), "max_batch": (0, None),
    "context_candidate": (0, 32), "context_min_match": (1, 32), "chain_max_draft": (0, 128),
}
CHOICES: dict[str, tuple[str, ...]] = {"policy": ("measure", "always")}
NOTES = {"ngram": " (N=2 leaves no lookahead level)", "chain_max_draft": " (0 = k)"}
ALIASES: dict[str, str] = {"W": "window", "N": "ngram", "G": "candidates"}
"""W/N/G mean LADE's window, n-gram size and candidates (guess set) -- the 2D layout's shape -- in
every place they are accepted: this section, the ``lookahead2d`` SPEC string and a request's
``extra_args["lookahead"]``."""
MAX_ROWS = 129
"""vLLM's 128 draft tokens (MAX_SPEC_LEN) + 1: a 2D step's rows are its drafts plus the current token."""


@dataclass(frozen=True)
class Lade2DConfig:
    """Settings of LADE's 2D layout (``Lade2DProposer``)."""

    window: int = 5
    """W: columns of the Jacobi window; a request may ask for less (``extra_args``).  Default 5."""
    ngram: int = 3
    """N: n-gram length; the window holds N-1 levels.  Default 3."""
    candidates: int = 5
    """G: pool candidates verified per step.  Default 5."""
    max_batch: int = 1
    """2D steps run only while at most this many requests are in the batch (its rows are free only while
    a step is memory-bound).  Default 1."""
    context_candidate: int = 0
    """Up to this many tokens of a context match of at least ``context_min_match`` tokens become the first
    2D candidate (0 = pure LADE).  Adds up to this many rows; k must cover them too.  Default 0."""
    context_min_match: int = 2
    """Shortest context match that becomes a 2D candidate (with ``context_candidate``).  Default 2."""
    policy: str = "measure"
    """"measure": the engine times its own steps and, per batch size, uses whichever of 2D, chain or no
    drafts serves the most tokens/s; "always": 2D whenever it can.  Default "measure"."""
    seed: int = 0
    """Seed of the random prompt tokens that start a request's window.  Default 0."""
    chain_max_draft: int = 0
    """Longest chain draft of a 2D engine (0 = num_speculative_tokens, which is sized for the 2D rows).
    Default 0."""

    def __post_init__(self) -> None:
        check_fields(self, LIMITS, CHOICES, f"{SECTION}.", NOTES)
        if self.rows > MAX_ROWS:
            raise LookaheadConfigError(f"lookahead config: {SECTION}.window={self.window!r} is invalid; (N-1)(W+G) "
                                       f"= {self.rows} rows exceeds vLLM's 128 draft tokens + 1")

    @property
    def rows(self) -> int:
        """Most query rows of a 2D step: (N-1)(W+G) plus the context candidate; k must be >= rows - 1."""
        return (self.ngram - 1) * (self.window + self.candidates) + self.context_candidate

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> Lade2DConfig:
        if raw is not None and not isinstance(raw, dict):
            raise LookaheadConfigError(f'additional_config["{SECTION}"] must be a JSON object')
        raw = dict(raw or {})
        for short, long in ALIASES.items():
            if short in raw:
                if long in raw:
                    raise LookaheadConfigError(f"lookahead config: give {SECTION}.{short} or {SECTION}.{long}, not both")
                raw[long] = raw.pop(short)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise LookaheadConfigError(f"lookahead config: unknown {SECTION} key(s) {unknown}; known: {sorted(known)} "
                                       "(aliases W, N, G)")
        return cls(**floats(cls, raw))

    @classmethod
    def from_sources(cls, additional_config: dict[str, Any] | None) -> Lade2DConfig:
        """``additional_config["lookahead2d"]``, else the defaults."""
        return cls.from_dict((additional_config or {}).get(SECTION))

    def overrides(self) -> dict[str, Any]:
        """The settings that differ from the defaults, by canonical name (aliases resolved)."""
        default = Lade2DConfig()
        return {k: v for k, v in dataclasses.asdict(self).items() if v != getattr(default, k)}

