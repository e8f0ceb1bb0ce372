"""``compiled``: numba's ``njit`` for the proposer's hot loops, cached on disk where that is possible.

Why a wrapper: with ``cache=True`` numba refuses to even decorate a function when it finds no writable
cache location (a read-only file system without ``NUMBA_CACHE_DIR`` or a writable ``HOME``) -- the
import would fail.  Such a process compiles at start instead (about a second, once per process).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from numba import njit


def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    try:
        return njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return njit(cache=False, nogil=True)(fn)
