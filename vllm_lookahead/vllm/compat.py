"""Fixes for vLLM 0.32 bugs that this project's own workloads hit (pinned; each says why).

``triton_utils.dispatcher._rebind_kernels`` scans every loaded module and calls
``vars(value).get("kernel")`` on any attribute that has a ``__dict__``.  llvmlite's FFI ``lib`` object
(imported with numba, e.g. by vLLM's own ``ngram`` proposer) answers *every* attribute lookup with a
function wrapper, ``__dict__`` included, so the scan raises ``AttributeError: '_lib_fn_wrapper' object has
no attribute 'get'`` and the engine dies -- whenever a second engine starts in a process that has
imported numba.  The release gate and the benchmark start several engines (baseline, candidate) in one
process, so we replace the scan with an identical one that skips non-dict namespaces.
"""

from __future__ import annotations

import sys
from typing import Any

_MARK = "_vllm_lookahead_safe_rebind"


def install_compat_patches() -> None:
    try:
        from vllm.triton_utils import dispatcher
    except ImportError:  # other vLLM layout: nothing to fix
        return
    if getattr(dispatcher._rebind_kernels, _MARK, False):
        return

    def _rebind_kernels(overrides: list[tuple[Any, Any]]) -> None:
        originals = {id(original): wrapper for original, wrapper in overrides}
        kept = {id(original): original for original, _ in overrides}

        def lookup(value: Any) -> Any:
            key = id(value)
            return originals[key] if key in originals and kept[key] is value else None

        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict) or not namespace:
                continue
            for attr, value in list(namespace.items()):
                wrapper = lookup(value)
                if wrapper is not None:
                    setattr(module, attr, wrapper)
                    continue
                try:
                    inner = object.__getattribute__(value, "__dict__")
                except AttributeError:
                    continue
                if not isinstance(inner, dict):
                    continue
                wrapper = lookup(inner.get("kernel"))
                if wrapper is None:
                    continue
                value.kernel = wrapper
                if not isinstance(value, type):
                    value.__dict__.pop("_kernel_arg_names", None)

    setattr(_rebind_kernels, _MARK, True)
    dispatcher._rebind_kernels = _rebind_kernels
