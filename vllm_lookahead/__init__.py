"""vllm-lookahead: lookahead decoding as a vLLM speculative proposer, plus the telemetry that shows
whether outputs stay right.

Importing this package does not import vLLM: ``LookaheadProposer`` is resolved lazily so that the
quality sidecar, the core algorithm and the CLI work without the engine installed.  vLLM loads it as
``speculative_config={"model": "vllm_lookahead.LookaheadProposer", "num_speculative_tokens": k}``.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["LookaheadProposer", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "LookaheadProposer":
        from vllm_lookahead.vllm.proposer import LookaheadProposer

        return LookaheadProposer
    raise AttributeError(f"module 'vllm_lookahead' has no attribute {name!r}")
