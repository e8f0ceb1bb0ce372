"""Full log-prob rows of prompt positions from an in-process vLLM 0.32 engine (the gate's T>0 scorer).

Why: the release gate judges T>0 samples by the baseline model's own distribution (randomized PIT and
likelihood shift, ``quality_sidecar.detectors.conformance_scoring``), which needs, at every output position
of every sample, the model's whole log-softmax row.  vLLM can return it (``SamplingParams(
prompt_logprobs=-1)``) but only as one Python dict of ``vocab`` ``Logprob`` objects per position:
4096 objects x ~50 positions x hundreds of samples is minutes of object churn for a few MB of floats.

How: while ``scoring(want)`` is active, ``GPUModelRunner._get_prompt_logprobs_dict`` (inherited by
the CPU runner) is wrapped: for each request whose *whole* token tuple is a key of ``want`` (prompt +
sampled output, submitted as one prompt with ``prompt_logprobs=0`` so vLLM itself only gathers one
log-prob per position), the hidden states of its last ``want[key]`` prompt positions go through the
model's ``compute_logits`` and the sampler's own ``compute_logprobs`` (raw float32 log-softmax, T=1)
and land, as numpy, in the dict the context yields.  Chunked prefill is handled (rows fill as chunks
arrive).  Only in-process engines (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, uni executor) share this
module with the caller; the gate's engines are.  Outside the context the wrapper is one ``is None``
check.  Memory is the caller's: ``n_out x vocab x 4`` bytes per sample, so submit in chunks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from . import patches

_WANT: dict[tuple[int, ...], int] | None = None
_STASH: dict[tuple[int, ...], np.ndarray] | None = None


def _stash_rows(runner: Any, hidden_states: Any, num_scheduled_tokens: Mapping[str, int],
                want: Mapping[tuple[int, ...], int], stash: dict[tuple[int, ...], np.ndarray]) -> None:
    """Mirror vLLM's own slicing in ``_get_prompt_logprobs_dict``: row r of a request's chunk is the
    distribution of prompt token ``num_computed_tokens + 1 + r``."""
    for req_id in list(runner.num_prompt_logprobs):
        n_sched = num_scheduled_tokens.get(req_id)
        req = runner.requests.get(req_id)
        if n_sched is None or req is None or req.prompt_token_ids is None:
            continue
        ids = req.prompt_token_ids
        key = tuple(int(t) for t in ids)
        n_out = want.get(key)
        if not n_out:
            continue
        n_prompt = len(ids)
        start = int(req.num_computed_tokens)
        num_logits = min(int(n_sched), n_prompt - start - 1)
        first = n_prompt - n_out  # index of the first token to score
        lo, hi = max(start + 1, first), start + 1 + num_logits
        if hi <= lo:
            continue
        offset = int(runner.query_start_loc.np[runner.input_batch.req_id_to_index[req_id]])
        h = hidden_states[offset + (lo - start - 1): offset + (hi - start - 1)]
        rows = runner.sampler.compute_logprobs(runner.model.compute_logits(h)).float().cpu().numpy()
        buf = stash.get(key)
        if buf is None:
            buf = stash[key] = np.full((n_out, rows.shape[-1]), np.nan, np.float32)
        buf[lo - first: hi - first] = rows


@patches.declare("prompt_scores", "vllm.v1.worker.gpu_model_runner:GPUModelRunner._get_prompt_logprobs_dict",
                 "gate T>0 scorer: full log-prob rows of wanted prompt positions (inert outside scoring())",
                 "tool")
def _build_prompt_logprobs(orig: Any) -> Any:
    def _get_prompt_logprobs_dict(self: Any, hidden_states: Any, num_scheduled_tokens: dict[str, int]) -> Any:
        want, stash = _WANT, _STASH
        if want is not None and stash is not None and self.num_prompt_logprobs:
            _stash_rows(self, hidden_states, num_scheduled_tokens, want, stash)
        return orig(self, hidden_states, num_scheduled_tokens)

    return _get_prompt_logprobs_dict


def install() -> None:
    """Wrap ``_get_prompt_logprobs_dict`` once (idempotent); inert until ``scoring`` is entered."""
    patches.apply("prompt_scores")


@contextlib.contextmanager
def scoring(want: Mapping[tuple[int, ...], int]) -> Iterator[dict[tuple[int, ...], np.ndarray]]:
    """While active, requests whose token tuple is in ``want`` get their last ``want[key]`` prompt
    positions' full log-prob rows ([n, vocab] float32) stashed in the yielded dict, keyed alike."""
    global _WANT, _STASH
    install()
    if _WANT is not None:
        raise RuntimeError("prompt_scores.scoring is not re-entrant")
    stash: dict[tuple[int, ...], np.ndarray] = {}
    _WANT, _STASH = dict(want), stash
    try:
        yield stash
    finally:
        _WANT, _STASH = None, None
