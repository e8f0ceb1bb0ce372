"""Full-LADE reference decoder on a Hugging Face causal LM (the oracle for the vLLM proposer).

See docs/reference.md.  Greedy only, batch size 1, exact in float32.
"""

from vllm_lookahead.lade2d.lade_layout import StepLayout, build_step_layout
from vllm_lookahead.lade2d.lade_pool import LadeNGramPool as NGramPool

from .decoder import (
    LadeResult,
    greedy_generate,
    lade_generate,
    lookup_draft,
    prompt_lookup_generate,
)
from .model import load_model

__all__ = [
    "LadeResult",
    "NGramPool",
    "StepLayout",
    "build_step_layout",
    "greedy_generate",
    "lade_generate",
    "load_model",
    "lookup_draft",
    "prompt_lookup_generate",
]
