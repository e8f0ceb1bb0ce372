"""numba for the proposer's hot loops, without importing numba before it is needed.

``compiled``: numba's ``njit``, cached on disk where possible.  Why a wrapper: with ``cache=True``
numba refuses to even decorate a function when it finds no writable cache location (a read-only file
system without ``NUMBA_CACHE_DIR`` or a writable ``HOME``) -- the import would fail.  Such a process
compiles at start instead (about a second, once per process).

``load_kernels``: core/kernels.py, imported on first use (why: that module's docstring).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

_kernels: ModuleType | None = None


def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    from numba import njit

    try:
        return njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return njit(cache=False, nogil=True)(fn)


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
