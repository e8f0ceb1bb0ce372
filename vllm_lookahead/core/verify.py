"""Greedy verification of a speculative step from the target's argmax (one compiled loop over the batch).

Why here: at temperature 0 with nothing that moves the argmax (no penalties, bias, bad words, ...),
vLLM's rejection sampler reduces to "keep each draft token while it equals the target's argmax, then
emit the target's argmax at the first mismatch (or the bonus row's argmax when all matched)".  On CPU
vLLM computes that argmax with torch (several times numpy's time) after cloning the target logits.
A numpy argmax of the same logits and one compiled loop give the same verdict (``vllm/greedy_verify.py`` decides when it
applies).

The output has vLLM's shape and padding (``SamplerOutput.sampled_token_ids``): one row per request,
``max_spec_len + 1`` columns, the committed tokens first and -1 after them.
"""

from __future__ import annotations

import numpy as np

from .jit import load_kernels

PLACEHOLDER = -1
"""vLLM's ``PLACEHOLDER_TOKEN_ID``: fills the columns after a request's committed tokens."""


def greedy_verify(argmax: np.ndarray, draft_tokens: np.ndarray, num_draft: np.ndarray, max_spec_len: int,
                  out: np.ndarray | None = None) -> np.ndarray:
    """Committed tokens of one greedy speculative step, ``[batch, max_spec_len + 1]`` int32.

    ``argmax``: the target's argmax at every verified row, request by request, each request's
    ``num_draft[i]`` draft positions followed by its bonus row (vLLM's ``logits_indices`` order);
    ``draft_tokens``: all draft tokens, request by request.  Row i commits
    ``argmax[start_i : start_i + a_i + 1]`` where ``a_i`` is the number of leading draft tokens equal
    to the argmax at their position -- exactly vLLM's greedy rejection rule (its
    ``rejection_greedy_sample_kernel``), bonus token included.  ``out`` (int32, that shape): written in
    place (e.g. the numpy view of the tensor handed to vLLM), else allocated.  The loop is compiled
    (``kernels.greedy_verify_into``): a few microseconds per step, where a vectorised numpy version
    took ~90 us inside the engine at batch 1."""
    num_draft = np.asarray(num_draft, dtype=np.int64)
    batch = len(num_draft)
    total = int(num_draft.sum())
    if len(argmax) != total + batch or len(draft_tokens) != total:
        raise ValueError(f"greedy_verify: {len(argmax)} argmax rows and {len(draft_tokens)} draft tokens "
                         f"do not fit {batch} requests with {total} draft tokens")
    if batch and int(num_draft.max()) > max_spec_len:
        raise ValueError(f"greedy_verify: a request has {int(num_draft.max())} draft tokens > max_spec_len {max_spec_len}")
    if out is None:
        out = np.empty((batch, max_spec_len + 1), dtype=np.int32)
    out.fill(PLACEHOLDER)
    if batch:
        load_kernels().greedy_verify_into(argmax, draft_tokens, num_draft, out)
    return out
