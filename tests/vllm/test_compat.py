"""The vLLM CPU fixes in vllm_lookahead/vllm/fixes.py: each test shows the upstream defect the patch
exists for (the probe that decides whether to apply it) and that the replacement is right."""

from __future__ import annotations

import os

import pytest
import torch

from vllm_lookahead.vllm import fixes

pytestmark = pytest.mark.unit


def reference_expand(x, cu, replace_from, replace_to, total):
    out, start = [], 0
    for v, end in zip(x.tolist(), cu.tolist()):
        v = replace_to if v == replace_from else v
        out += [v] * (end - start)
        start = end
    return out[:total]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_expand_kernel_torch_matches_the_triton_semantics(dtype):
    x = torch.tensor([0.7, 0.0, 1.3, 0.5], dtype=torch.float32).to(dtype) if dtype == torch.float32 \
        else torch.tensor([5, 0, 7, 2], dtype=dtype)
    cu = torch.tensor([2, 2, 5, 6], dtype=torch.int32)
    out = torch.full((6,), -9, dtype=dtype)
    fixes.expand_kernel_torch(out, x, cu, 0, 1)
    assert out.tolist() == pytest.approx(reference_expand(x, cu, 0, 1, 6))


def _import_vllm_cpu_kernels() -> None:
    """Register torch.ops._C as the CPU worker does: through the platform, which picks the library this
    CPU can run (``vllm._C`` needs AVX-512 with bf16, ``vllm._C_AVX2`` runs on AVX2 only; importing
    ``vllm._C`` directly kills the process with an illegal instruction on an AVX2-only machine)."""
    from vllm.platforms.cpu import CpuPlatform

    CpuPlatform.import_kernels()


def test_stock_cpu_expand_leaves_float_output_unwritten_and_the_probe_sees_it():
    """Why the fix exists: vllm-cpu 0.32's C++ expand writes into an int64 *copy* of a float32
    output, so per-token temperatures stay uninitialised.  The probe decides on this, not a version."""
    _import_vllm_cpu_kernels()
    from vllm.utils import cpu_triton_utils

    original = cpu_triton_utils._expand_kernel_impl
    assert original is not fixes.expand_kernel_torch, "fixes.py must never replace vLLM's table entry"
    x = torch.tensor([0.5, 2.0], dtype=torch.float32)
    cu = torch.tensor([2, 3], dtype=torch.int32)
    out = torch.full((3,), -7.0, dtype=torch.float32)
    original(out, x, cu, 0, 1)
    assert out.tolist() != [0.5, 0.5, 2.0], "vLLM fixed its CPU expand kernel: the probe now leaves it alone"
    assert fixes.expand_kernel_broken(original) is True
    assert fixes.expand_kernel_broken(fixes.expand_kernel_torch) is False


def test_fix_targets_the_live_override_only_when_the_probe_fails():
    """After vLLM registered its CPU kernel table (as a worker does), the fix replaces the live
    override's implementation, is recorded in the patch registry, and re-applying is a no-op."""
    _import_vllm_cpu_kernels()
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.sample import rejection_sampler as rs

    from vllm_lookahead.vllm import patches

    # as every engine of this project starts: the rebind scan fix first (vLLM's own scan dies once
    # llvmlite is imported, e.g. by the numba kernels of an earlier test in this process)
    rebind_was = "safe_rebind_kernels" in patches.applied()
    fixes.apply_tool_fixes()
    CpuPlatform.register_triton_kernel_overrides()
    if not rebind_was:
        patches.revert("safe_rebind_kernels")
    kernel = fixes.live_expand_override()
    assert kernel is not None and kernel is rs._expand.kernel  # the launcher holds the same object
    found = fixes.fix_cpu_expand_if_broken()
    assert "replaced by expand_kernel_torch" in found or found == "fixed already", found
    assert kernel._impl is fixes.expand_kernel_torch and "cpu_expand_kernel" in patches.applied()
    assert fixes.fix_cpu_expand_if_broken() == "fixed already"
    assert not patches.apply("cpu_expand_kernel")
    patches.revert("cpu_expand_kernel")
    assert kernel._impl is not fixes.expand_kernel_torch and "cpu_expand_kernel" not in patches.applied()


def test_rebind_probe_sees_the_scan_break():
    """vLLM 0.32's `_rebind_kernels` dies on an object whose __dict__ is not a dict (llvmlite's FFI
    lib); the probe reproduces it and the fixed scan survives it."""
    from vllm_lookahead.vllm import patches

    # An earlier in-process engine of this test session (make_llm, the gate) may have applied the fix
    # already: take it off to probe vLLM's own scan, and leave the process as it was found.
    was_applied = "safe_rebind_kernels" in patches.applied()
    if was_applied:
        assert patches.revert("safe_rebind_kernels")
    try:
        assert fixes.rebind_scan_breaks() is True, "vLLM fixed the rebind scan: apply_tool_fixes now skips it"
        done = fixes.apply_tool_fixes()
        assert "safe_rebind_kernels" in done
        for name in set(done) - {"safe_rebind_kernels"}:  # the tools' other fixes: leave the process as found
            patches.revert(name)
        assert fixes.rebind_scan_breaks() is False
    finally:
        if not was_applied:
            patches.revert("safe_rebind_kernels")


def test_aot_cache_probe_sees_the_load_break_and_the_fix_only_sets_a_default(monkeypatch):
    """vLLM 0.32 calls ``finalize_loading`` on every AOT-loaded function; on CPU torch wraps Inductor's
    result in a class without it, so each compiled start compiles again.  The fix is an environment
    default for vLLM's pre-AOT cache: set only where the probe sees the break, never over the user's."""
    from vllm import envs

    assert fixes.aot_cache_load_breaks() is True, "torch or vLLM fixed the AOT cache load: the default is now skipped"
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    assert fixes.use_loadable_compile_cache() is False and envs.VLLM_USE_AOT_COMPILE is True
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE")
    envs.enable_envs_cache()  # as after an engine's start-up in this process
    try:
        assert fixes.use_loadable_compile_cache() is True
        assert envs.VLLM_USE_AOT_COMPILE is False  # vLLM's frozen view was refreshed
    finally:
        envs.disable_envs_cache()
    monkeypatch.setattr(fixes, "aot_cache_load_breaks", lambda: False)
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE")
    assert fixes.use_loadable_compile_cache() is False and "VLLM_USE_AOT_COMPILE" not in os.environ
