"""Greedy steps verified from the proposer's argmax (vllm/greedy_verify.py) on
real vLLM (CPU, demo model, float32): outputs equal ``none``'s token for token with vLLM's rejection
sampler never called; and every sampling setting that moves the argmax (penalties,
min_tokens, bad words, logprobs) sends the step back to vLLM's rejection sampler, outputs still equal."""

from __future__ import annotations

import gc

import pytest
from lossless_support import heldout_prompts

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# the settings under which vLLM's verdict is not the plain argmax, each in its own generate() call
# (logit_bias and min_p: vLLM 0.32 refuses them with speculative decoding)
ARGMAX_MOVERS = {
    "presence_penalty": {"presence_penalty": 0.8},
    "repetition_penalty": {"repetition_penalty": 1.3},
    "min_tokens": {"min_tokens": 20},
    "bad_words": {"bad_words": ["return"]},
    "logprobs": {"logprobs": 2},
}


def test_argmax_verdict_is_vllms_and_yields_to_every_argmax_mover(engine_factory, rejection_sampler_calls):
    from vllm import SamplingParams

    calls = rejection_sampler_calls
    prompts = heldout_prompts()[:8]
    settings = {"greedy": {}, **ARGMAX_MOVERS}
    outputs: dict[str, dict[str, list]] = {}
    sampler_calls: dict[str, dict[str, int]] = {}
    accepted = 0
    for spec in ("none", "lookahead:k=8"):
        llm = engine_factory(spec, max_num_seqs=4)
        outputs[spec], sampler_calls[spec] = {}, {}
        for name, kw in settings.items():
            calls["n"] = 0
            outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=32, **kw), use_tqdm=False)
            outputs[spec][name] = [list(o.outputs[0].token_ids) for o in outs]
            sampler_calls[spec][name] = calls["n"]
            if spec != "none" and name == "greedy":
                accepted = sum(o.outputs[0].spec_decode_metrics.to_dict()["num_accepted_draft_tokens"] for o in outs)
        del llm
        gc.collect()
    for name in settings:
        assert outputs["lookahead:k=8"][name] == outputs["none"][name], name
    # the penalties and bad words really changed the outputs (else "identical under them" would test
    # little); logprobs change no token, and min_tokens only where a request would end before 20
    for name in ("presence_penalty", "repetition_penalty", "bad_words"):
        assert outputs["none"][name] != outputs["none"]["greedy"], name
    lookahead = sampler_calls["lookahead:k=8"]
    assert accepted > 20 and lookahead["greedy"] == 0, (accepted, lookahead)
    assert all(lookahead[name] > 0 for name in ARGMAX_MOVERS), lookahead
