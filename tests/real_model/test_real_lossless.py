"""Greedy exactness on a real instruction-tuned model (SmolLM2-135M-Instruct, 30 layers, 49k vocabulary)
through ``vllm.LLM``: the README's default lookahead against no speculation, float32, chat-formatted
prompts (``LLM.chat`` applies the model's own template), token for token at batch 1 and 8.
"""

from __future__ import annotations

import gc

import pytest
from real_model_support import CHAT_PROMPTS, chat_messages

from vllm_lookahead.decoders import DEFAULT_DECODER

pytestmark = [pytest.mark.real_model]

MAX_TOKENS = 64
BATCH_SIZES = (1, 8)


@pytest.fixture(scope="module")
def greedy_runs(real_model):
    """{spec: {bs: [token ids]}, spec + "/metrics": [spec-decode metrics at batch 1], "prompt_ids": ...}."""
    from vllm import SamplingParams

    from vllm_lookahead.decoders import parse_spec
    from vllm_lookahead.engine import make_llm

    convs = [chat_messages(p) for p in CHAT_PROMPTS]
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    runs: dict = {}
    for spec in ("none", DEFAULT_DECODER):
        llm = make_llm(str(real_model), parse_spec(spec), max_model_len=1024, max_num_seqs=8)
        runs[spec] = {}
        for bs in BATCH_SIZES:
            outs = []
            for i in range(0, len(convs), bs):
                outs.extend(llm.chat(convs[i : i + bs], sp, use_tqdm=False))
            runs[spec][bs] = [list(o.outputs[0].token_ids) for o in outs]
            runs[spec][f"prompt_ids{bs}"] = [list(o.prompt_token_ids) for o in outs]
            runs[spec][f"metrics{bs}"] = [o.outputs[0].spec_decode_metrics for o in outs]
            runs[spec][f"text{bs}"] = [o.outputs[0].text for o in outs]
        del llm
        gc.collect()
    return runs


@pytest.mark.parametrize("bs", BATCH_SIZES)
def test_real_model_greedy_float32_identical(greedy_runs, bs):
    base, cand = greedy_runs["none"][bs], greedy_runs[DEFAULT_DECODER][bs]
    assert greedy_runs["none"][f"prompt_ids{bs}"] == greedy_runs[DEFAULT_DECODER][f"prompt_ids{bs}"]
    mismatched = [i for i, (a, b) in enumerate(zip(base, cand, strict=True)) if a != b]
    firsts = {i: next((j for j, (x, y) in enumerate(zip(base[i], cand[i])) if x != y), min(len(base[i]), len(cand[i])))
              for i in mismatched}
    assert not mismatched, f"{len(mismatched)}/{len(base)} outputs differ at batch {bs}; first divergence: {firsts}"


def test_real_model_prompts_are_chat_formatted_and_answered(greedy_runs, real_model):
    """The comparison is on the model's chat template and on real answers, not on empty outputs."""
    from transformers import AutoTokenizer

    prompt_ids = greedy_runs["none"]["prompt_ids1"]
    tok = AutoTokenizer.from_pretrained(str(real_model))
    text = tok.decode(prompt_ids[0])
    assert "<|im_start|>user\n" in text and text.endswith("<|im_start|>assistant\n"), text
    outs = greedy_runs["none"]["text1"]
    assert all(len(t.strip()) > 0 for t in outs)
    assert "Paris" in outs[0], outs[0]


def test_real_model_lookahead_really_speculated(greedy_runs):
    """Exactness would be vacuous if no draft were ever proposed or accepted."""
    drafted = accepted = 0
    for m in greedy_runs[DEFAULT_DECODER]["metrics1"]:
        d = m.to_dict()
        drafted += d["num_draft_tokens"]
        accepted += d["num_accepted_draft_tokens"]
    assert drafted > 0 and accepted > 0, (drafted, accepted)
