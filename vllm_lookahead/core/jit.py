"""``load_kernels``: core/kernels.py, imported on first use (why: that module's docstring), with a clear
error where numba is missing."""

from __future__ import annotations

from types import ModuleType

_kernels: ModuleType | None = None


def load_kernels() -> ModuleType:
    global _kernels
    if _kernels is None:
        try:
            from . import kernels
        except ModuleNotFoundError as e:
            if e.name not in ("numba", "llvmlite"):
                raise
            raise ModuleNotFoundError(
                "vllm-lookahead's drafter needs numba for its compiled kernels: pip install "
                "'vllm-lookahead[cpu]' (or [cuda]; vLLM brings numba too) or pip install numba", name=e.name) from e
        _kernels = kernels
    return _kernels
