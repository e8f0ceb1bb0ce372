"""The vLLM tier: in-process vLLM on CPU with the trained demo model (float32; ``engine_factory`` in
tests/conftest.py)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@pytest.fixture
def rejection_sampler_calls(monkeypatch):
    """``{"n": calls}`` of vLLM's ``RejectionSampler.forward`` while the test runs (reset it freely)."""
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    calls = {"n": 0}
    forward = RejectionSampler.forward

    def counted(self, *args, **kwargs):
        calls["n"] += 1
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(RejectionSampler, "forward", counted)
    return calls
