"""Build in-process vLLM engines for the bench, the demo and the release gate, one decoder spec at a time.

In-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``distributed_executor_backend="uni"``) so that one
process owns the engine, start-up is faster, and forward passes can be counted by wrapping the model
runner (``StepCounter``).  The ``decoder`` strings are the ones users type on the command line:
``none``, ``ngram[:k=4,min=1,max=4]``, ``lookahead[:k=4,ngram=4,pool_size=8,...]``,
``suffix[:k=4]`` and ``custom:pkg.module.Class[:k=4]``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any


class DecoderSpecError(ValueError):
    pass


@dataclass
class DecoderSpec:
    method: str
    k: int = 0
    params: dict[str, Any] = field(default_factory=dict)
    class_path: str | None = None

    @property
    def label(self) -> str:
        if self.method == "none":
            return "none"
        extra = ",".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.method}:k={self.k}" + (f",{extra}" if extra else "")

    def engine_kwargs(self) -> dict[str, Any]:
        if self.method == "none":
            return {}
        if self.method == "ngram":
            return {"speculative_config": {
                "method": "ngram", "num_speculative_tokens": self.k,
                "prompt_lookup_min": int(self.params.get("min", 1)),
                "prompt_lookup_max": int(self.params.get("max", 4))}}
        if self.method == "suffix":
            return {"speculative_config": {"method": "suffix", "num_speculative_tokens": self.k}}
        if self.method == "lookahead":
            return {"speculative_config": {"model": "vllm_lookahead.LookaheadProposer",
                                           "num_speculative_tokens": self.k},
                    "additional_config": {"lookahead": dict(self.params)}}
        if self.method == "custom":
            return {"speculative_config": {"model": self.class_path, "num_speculative_tokens": self.k},
                    "additional_config": {"lookahead": dict(self.params)} if self.params else {}}
        raise DecoderSpecError(f"unknown decoder method {self.method!r}")


def _parse_value(v: str) -> Any:
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


def parse_decoder(spec: str, default_k: int = 4) -> DecoderSpec:
    """Parse ``method[:key=value,...]`` (``custom:pkg.mod.Class[:...]``) with clear errors."""
    spec = spec.strip()
    if not spec:
        raise DecoderSpecError("empty decoder spec; use none, ngram, lookahead, suffix or custom:pkg.Class")
    method, _, rest = spec.partition(":")
    class_path = None
    if method == "custom":
        class_path, _, rest = rest.partition(":")
        if "." not in class_path:
            raise DecoderSpecError(f"{spec!r}: custom needs a dotted class path, e.g. custom:pkg.module.Class:k=4")
    if method not in ("none", "ngram", "lookahead", "suffix", "custom"):
        raise DecoderSpecError(f"{spec!r}: unknown method {method!r}; use none, ngram, lookahead, suffix or custom")
    params: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise DecoderSpecError(f"{spec!r}: expected key=value, got {item!r}")
        params[key.strip()] = _parse_value(value.strip())
    if method == "none":
        if params:
            raise DecoderSpecError(f"{spec!r}: 'none' takes no parameters")
        return DecoderSpec("none")
    k = params.pop("k", default_k)
    if not isinstance(k, int) or not 1 <= k <= 32:
        raise DecoderSpecError(f"{spec!r}: k must be an integer in 1..32")
    if method == "lookahead":
        from vllm_lookahead.core import LookaheadConfig, LookaheadConfigError

        try:
            LookaheadConfig.from_dict(params)
        except LookaheadConfigError as e:
            raise DecoderSpecError(f"{spec!r}: {e}") from None
    if method == "ngram" and set(params) - {"min", "max"}:
        raise DecoderSpecError(f"{spec!r}: ngram takes k, min, max")
    return DecoderSpec(method, k, params, class_path)


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
    if decoder.method != "none":
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
