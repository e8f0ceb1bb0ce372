"""Build in-process vLLM engines for the bench and the demo, one decoder spec at a time.

In-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``distributed_executor_backend="uni"``) so that one
process owns the engine, start-up is faster, and forward passes can be counted by wrapping the model
runner (``StepCounter``).  Decoders are the SPEC strings of ``vllm_lookahead.decoders``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from vllm_lookahead.decoders import DecoderSpec


def make_llm(model: str, decoder: DecoderSpec, *, dtype: str = "float32", max_model_len: int = 2048,
             max_num_seqs: int = 32, seed: int = 0, enforce_eager: bool = True,
             extra: dict[str, Any] | None = None):
    """An in-process vLLM ``LLM`` for ``decoder`` (call from under ``if __name__ == "__main__"``)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    from vllm_lookahead.vllm.compat import install_compat_patches

    install_compat_patches()
    kwargs: dict[str, Any] = dict(
        model=model, dtype=dtype, max_model_len=max_model_len, max_num_seqs=max_num_seqs, seed=seed,
        enforce_eager=enforce_eager, distributed_executor_backend="uni", disable_log_stats=False,
        enable_prefix_caching=True,
    )
    kwargs.update(decoder.engine_kwargs())
    if decoder.speculative:
        kwargs["per_request_spec_decode_metrics"] = "summary"
    kwargs.update(extra or {})
    return LLM(**kwargs)


class StepCounter:
    """Counts target forward passes (and their wall time) of in-process engines by wrapping the model
    runner's ``execute_model``.  Used to report compression = generated tokens / forward passes."""

    def __init__(self) -> None:
        self.steps = 0
        self.seconds = 0.0
        self._orig = None

    def __enter__(self) -> StepCounter:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        self._orig = orig = GPUModelRunner.execute_model
        counter = self

        def execute_model(runner, *args, **kwargs):
            t = time.perf_counter()
            try:
                return orig(runner, *args, **kwargs)
            finally:
                counter.steps += 1
                counter.seconds += time.perf_counter() - t

        GPUModelRunner.execute_model = execute_model
        return self

    def __exit__(self, *exc) -> None:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        GPUModelRunner.execute_model = self._orig
