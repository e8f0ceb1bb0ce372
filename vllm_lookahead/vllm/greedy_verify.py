"""Greedy speculative steps verified from the proposer's numpy argmax.

Why: vLLM 0.32's ``RejectionSampler.forward`` on CPU clones the target logits, runs torch's argmax
over them (~10x numpy's time on this CPU: 0.93 ms vs 0.09 ms for 288 rows x 4096) and a bonus-token
sampler, even when every request is greedy and nothing changes the argmax.  Here the proposer takes a
numpy argmax of the same logits (``LookaheadProposer.capture_verification``) and gives the step's verdict
with ``core.verify.greedy_verify`` -- vLLM's greedy rule, token for token, in a fraction of the sampling
phase's time.

When (all must hold, else vLLM's rejection sampler runs as before): the logits are CPU float32; every
request is greedy; no logprobs of any kind are asked for; no penalties, bad words, allowed-token masks or
thinking budget; vLLM's built-in argmax-changing logits processors (``min_tokens``, ``logit_bias``)
hold no request and no other such processor is loaded; the rejection sampler is not in synthetic mode;
no async scheduling.  Those are exactly the cases where vLLM's rejection sampler and its bonus sampler
reduce to the plain argmax (``rejection_sample`` with ``all_greedy``; ``Sampler.sample`` greedy).
CUDA keeps vLLM's path (its argmax is no bottleneck there).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vllm_lookahead.core.verify import greedy_verify

# The argmax-changing logits processors whose idle state we can read (vLLM 0.32's builtins): the
# attribute that holds their per-request state, empty when they do nothing.
_IDLE_WHEN_EMPTY = {"MinTokensLogitsProcessor": "min_toks", "LogitBiasLogitsProcessor": "biases"}


def argmax_is_the_verdict(runner: Any, logits: Any, spec_decode_metadata: Any) -> bool:
    """Does vLLM's rejection sampler reduce to the plain argmax of ``logits`` for this step?"""
    if spec_decode_metadata is None or logits is None:
        return False
    import torch

    if not logits.is_cpu or logits.dtype != torch.float32 or getattr(runner, "use_async_scheduling", False):
        return False
    if getattr(getattr(runner, "rejection_sampler", None), "synthetic_mode", False):
        return False
    md = runner.input_batch.sampling_metadata
    if not md.all_greedy or md.max_num_logprobs is not None or md.logprob_token_ids:
        return False
    if not md.no_penalties or md.bad_words_token_ids or md.allowed_token_ids_mask is not None:
        return False
    holder = getattr(md, "thinking_budget_state_holder", None)
    if holder is not None and holder.has_tracked_requests():
        return False
    for processor in md.logitsprocs.non_argmax_invariant:
        state = _IDLE_WHEN_EMPTY.get(type(processor).__name__)
        if state is None or getattr(processor, state, True):
            return False  # a processor we cannot read, or one that holds a request
    return True


def sampler_output(argmax: np.ndarray, spec_decode_metadata: Any) -> Any:
    """vLLM's ``SamplerOutput`` for a greedy step whose target argmax (every verified row) is ``argmax``."""
    import torch
    from vllm.v1.outputs import SamplerOutput

    md = spec_decode_metadata
    tokens = torch.empty((len(md.num_draft_tokens), md.max_spec_len + 1), dtype=torch.int32)
    greedy_verify(argmax, md.draft_token_ids.numpy(), md.num_draft_tokens, md.max_spec_len, out=tokens.numpy())
    return SamplerOutput(sampled_token_ids=tokens, logprobs_tensors=None)
