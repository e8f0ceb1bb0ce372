"""Engines for the vLLM tier: in-process vLLM on CPU with the trained demo model (float32)."""

from __future__ import annotations

import gc
import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@pytest.fixture(scope="session")
def engine_factory(demo_model):
    """Build an in-process engine for a decoder spec string; the caller deletes it."""
    from vllm_lookahead.decoders import parse_spec
    from vllm_lookahead.engine import make_llm

    def make(spec: str, **kw):
        kw.setdefault("max_model_len", 1024)
        kw.setdefault("max_num_seqs", 32)
        return make_llm(str(demo_model), parse_spec(spec), **kw)

    yield make
    gc.collect()


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
