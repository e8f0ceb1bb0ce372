"""LADE's 2D layout, opt-in and self-contained: LADE's own step -- G candidates and a W x (N-1) Jacobi
window in one forward with LADE's mask, verified by a multi-candidate verifier -- inside vLLM (CPU
backend; a FlexAttention path for CUDA, never run on a GPU).  Kept working and tested because on a
memory-bound GPU step its extra rows are nearly free; on a compute-bound CPU it has not beaten the
chain in a same-run comparison, so the default path (``core``, the ``vllm`` plugin) knows nothing of it.

Enabled by its own proposer class and configured by its own section (docs/lade2d.md)::

    speculative_config={"model": "vllm_lookahead.lade2d.Lade2DProposer", "num_speculative_tokens": 19},
    additional_config={"lookahead2d": {"W": 5, "N": 3, "G": 5}}      # decoder SPEC lookahead2d:W=5,N=3,G=5

  * ``config``: the ``lookahead2d`` section (``Lade2DConfig``);
  * ``proposer``: ``Lade2DProposer``, the chain proposer plus the 2D steps (``lade_steps``);
  * ``lade``: the pure part (window levels, n-gram pool, candidates, greedy and sampled verification);
  * ``lade_layout`` / ``lade_pool``: the step's row layout and mask, LADE's n-gram pool;
  * ``hooks``: the engine hooks (positions, mask, verifier, KV fix-up), declared in the patch registry
    and applied only by ``Lade2DProposer``;
  * ``masked_attention`` / ``flex_mask``: attention with LADE's mask on vLLM's CPU and flex backends;
  * ``reference``: a full LADE decoder on transformers, the oracle the engine path is checked against.

Importing this package imports neither vLLM nor torch: ``Lade2DProposer`` is resolved lazily.
"""

from __future__ import annotations

from typing import Any

PATCH_MODULES = ("vllm_lookahead.lade2d.hooks", "vllm_lookahead.lade2d.flex_mask")
"""The modules that declare this package's vLLM patches (``vllm_lookahead.extensions``)."""

__all__ = ["PATCH_MODULES", "Lade2DProposer"]


def __getattr__(name: str) -> Any:
    if name == "Lade2DProposer":
        from vllm_lookahead.lade2d.proposer import Lade2DProposer

        return Lade2DProposer
    raise AttributeError(f"module 'vllm_lookahead.lade2d' has no attribute {name!r}")
