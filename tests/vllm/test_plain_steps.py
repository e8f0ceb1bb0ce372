"""Steps without drafts take vLLM's plain path (``vllm/plain_steps.py``), and only where they may.

On real vLLM: lookahead that never drafts (its floor above any estimate) must not run vLLM's rejection
sampler at all, while vLLM's own ngram proposer (no patch: vLLM 0.32's behaviour) runs it on every
step, and the greedy outputs equal ``none``'s either way.  The rejection
sampler's ``forward`` is wrapped with a call counter for the test (instrumentation, not a mock).
Where the plain path must not be taken -- another proposer's runner, drafts scheduled, async
speculative decoding, recurrent models -- is checked on stand-in runner objects: those conditions
cannot all be produced by a real engine on this CPU (no async spec decode, no hybrid demo model).
"""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest
from lossless_support import heldout_prompts

from vllm_lookahead.vllm.plain_steps import takes_plain_path


def _runner(**kw):
    drafter = SimpleNamespace(capture_verification=lambda *a: None)
    base = dict(speculative_config=object(), drafter=drafter, use_async_spec_decode=False,
                model_config=SimpleNamespace(is_hybrid=False, has_inner_state=False))
    base.update(kw)
    return SimpleNamespace(**base)


@pytest.mark.unit
def test_only_lookahead_steps_without_drafts_take_the_plain_path() -> None:
    empty, drafts = SimpleNamespace(scheduled_spec_decode_tokens={}), SimpleNamespace(
        scheduled_spec_decode_tokens={"r0": [5, 6]})
    assert takes_plain_path(_runner(), empty)
    assert not takes_plain_path(_runner(), drafts)  # some request has drafts: vLLM's speculative path
    assert not takes_plain_path(_runner(drafter=SimpleNamespace()), empty)  # vLLM's own proposer
    assert not takes_plain_path(_runner(use_async_spec_decode=True), empty)
    assert not takes_plain_path(_runner(model_config=SimpleNamespace(is_hybrid=True)), empty)
    assert not takes_plain_path(_runner(speculative_config=None), empty)


@pytest.mark.vllm
@pytest.mark.slow
def test_steps_without_drafts_skip_the_rejection_sampler(engine_factory, rejection_sampler_calls) -> None:
    from vllm import SamplingParams

    calls = rejection_sampler_calls
    prompts = heldout_prompts()[:6]
    sp = SamplingParams(temperature=0.0, max_tokens=16)
    outputs, sampler_calls = {}, {}
    for spec in ("none", "lookahead:k=4,chain_min_p=1.0", "ngram:k=4"):
        llm = engine_factory(spec, max_num_seqs=2)
        calls["n"] = 0
        outputs[spec] = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, sp, use_tqdm=False)]
        sampler_calls[spec] = calls["n"]
        del llm
        gc.collect()
    assert all(out == outputs["none"] for out in outputs.values())
    assert sampler_calls["lookahead:k=4,chain_min_p=1.0"] == 0
    # vLLM's own proposer runs it on every decode step (vLLM 0.32), so the count above is not vacuous
    assert sampler_calls["ngram:k=4"] >= 16
