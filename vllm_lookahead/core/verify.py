"""Greedy verification of a speculative step from the target's argmax, vectorised over the batch.

Why here: at temperature 0 with nothing that moves the argmax (no penalties, bias, bad words, ...),
vLLM's rejection sampler reduces to "keep each draft token while it equals the target's argmax, then
emit the target's argmax at the first mismatch (or the bonus row's argmax when all matched)".  On CPU
vLLM computes that argmax with torch (10x numpy's time at batch 32 here) after cloning the target
logits, which made its sampler ~7% of a speculative step at batch 1 and 32.  The proposer computes a
numpy argmax of the same logits anyway (its Jacobi iterate), so the verdict is a few array operations
(``vllm/greedy_verify.py`` decides when it applies).

The output has vLLM's shape and padding (``SamplerOutput.sampled_token_ids``): one row per request,
``max_spec_len + 1`` columns, the committed tokens first and -1 after them.
"""

from __future__ import annotations

import numpy as np

PLACEHOLDER = -1
"""vLLM's ``PLACEHOLDER_TOKEN_ID``: fills the columns after a request's committed tokens."""


def greedy_verify(argmax: np.ndarray, draft_tokens: np.ndarray, num_draft: np.ndarray,
                  max_spec_len: int) -> np.ndarray:
    """Committed tokens of one greedy speculative step, ``[batch, max_spec_len + 1]`` int32.

    ``argmax``: the target's argmax at every verified row, request by request, each request's
    ``num_draft[i]`` draft positions followed by its bonus row (vLLM's ``logits_indices`` order);
    ``draft_tokens``: all draft tokens, request by request.  Row i commits
    ``argmax[start_i : start_i + a_i + 1]`` where ``a_i`` is the number of leading draft tokens equal
    to the argmax at their position -- exactly vLLM's greedy rejection rule (its
    ``rejection_greedy_sample_kernel``), bonus token included."""
    num_draft = np.asarray(num_draft, dtype=np.int64)
    batch = len(num_draft)
    out = np.full((batch, max_spec_len + 1), PLACEHOLDER, dtype=np.int32)
    if batch == 0:
        return out
    if len(argmax) != int(num_draft.sum()) + batch or len(draft_tokens) != int(num_draft.sum()):
        raise ValueError(f"greedy_verify: {len(argmax)} argmax rows and {len(draft_tokens)} draft tokens "
                         f"do not fit {batch} requests with {int(num_draft.sum())} draft tokens")
    if int(num_draft.max()) > max_spec_len:
        raise ValueError(f"greedy_verify: a request has {int(num_draft.max())} draft tokens > max_spec_len {max_spec_len}")
    row_start = np.cumsum(num_draft + 1) - (num_draft + 1)  # first verified row of each request
    draft_start = row_start - np.arange(batch)  # its first draft token (one bonus row fewer per request)
    pos = np.arange(max_spec_len)
    in_draft = pos[None, :] < num_draft[:, None]
    last_row, last_draft = len(argmax) - 1, max(len(draft_tokens) - 1, 0)
    target = argmax[np.minimum(row_start[:, None] + pos, last_row)]
    if len(draft_tokens):
        drafted = draft_tokens[np.minimum(draft_start[:, None] + pos, last_draft)]
        stop = (target != drafted) | ~in_draft
    else:
        stop = ~in_draft
    # accepted draft tokens = position of the first stop (a column of stops closes every row)
    accepted = np.argmax(np.concatenate([stop, np.ones((batch, 1), dtype=bool)], axis=1), axis=1)
    cols = np.arange(max_spec_len + 1)
    committed = argmax[np.minimum(row_start[:, None] + cols, last_row)]
    np.copyto(out, committed, where=cols[None, :] <= accepted[:, None], casting="unsafe")
    return out
