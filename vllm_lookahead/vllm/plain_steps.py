"""Steps without drafts take vLLM's plain path (patch ``plain_steps``).

Why: with a speculative config, vLLM 0.32's ``GPUModelRunner._prepare_inputs`` builds spec-decode metadata
and ``_sample`` runs the rejection sampler for *every* step -- also when no request has a draft (the
metadata then says zero drafts per row).  That costs a step about as much as a few draft tokens do.  Lookahead drafts nothing on many
steps (a request with no candidate above its floor; every step while the busy-batch guard has drafting
off), and those steps should cost what ``none``'s do.

What: when the step's ``scheduled_spec_decode_tokens`` is empty, ``_prepare_inputs`` runs with the
runner's ``speculative_config`` hidden, so it takes its own non-speculative branch (logits at each
request's last position, ``spec_decode_metadata`` None); vLLM's ``_sample`` then uses its plain sampler,
and the bookkeeping and ``propose_draft_token_ids`` already accept a step without metadata (vLLM's own
drafters see such steps).  The config is back before anything else reads it.

When not: runners whose drafter is not lookahead's (a second engine in the process running ngram or
suffix keeps vLLM's behaviour), async speculative decoding (its optimistic token counts expect the
speculative path), and models with recurrent layers (vLLM counts a zero-draft decode as a speculative row there on purpose, see ``_prepare_inputs``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import patches


def takes_plain_path(runner: Any, scheduler_output: Any) -> bool:
    """Should this step skip the speculative path (see the module docstring)?"""
    if scheduler_output.scheduled_spec_decode_tokens or runner.speculative_config is None:
        return False
    if not hasattr(getattr(runner, "drafter", None), "capture_verification"):  # another proposer: vLLM's path
        return False
    if getattr(runner, "use_async_spec_decode", False):
        return False
    model_config = getattr(runner, "model_config", None)
    return not (getattr(model_config, "is_hybrid", False) or getattr(model_config, "has_inner_state", False))


@patches.declare("plain_steps", "vllm.v1.worker.gpu_model_runner:GPUModelRunner._prepare_inputs",
                 "a step in which no request has a draft takes vLLM's plain path, not the rejection sampler",
                 "worker")
def _build_prepare_inputs(original: Any) -> Any:
    def _prepare_inputs(self: Any, scheduler_output: Any, num_scheduled_tokens: np.ndarray) -> Any:
        if not takes_plain_path(self, scheduler_output):
            return original(self, scheduler_output, num_scheduled_tokens)
        spec = self.speculative_config
        self.speculative_config = None
        try:
            return original(self, scheduler_output, num_scheduled_tokens)
        finally:
            self.speculative_config = spec

    _prepare_inputs.__doc__ = original.__doc__
    return _prepare_inputs


def install_plain_steps() -> bool:
    """Patch ``GPUModelRunner._prepare_inputs`` once per process; True if this call installed it."""
    return patches.apply("plain_steps")
