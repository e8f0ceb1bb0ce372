"""On the trained demo model and >= 100 held-out prompts, the reference reproduces plain greedy.

float32, the model's own EOS id (so the stop point is part of the comparison), 50 open + 50 copy
prompts from the stdlib ``test/`` sources the model never saw.  Several W/N/G settings; the larger
ones on a subset to stay inside this suite's time budget.
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from vllm_lookahead.lade2d.reference import (
    greedy_generate,
    lade_generate,
    load_model,
    prompt_lookup_generate,
)
from vllm_lookahead.lade2d.reference.bench import model_eos
from vllm_lookahead.prompts import load_heldout_prompts

pytestmark = pytest.mark.slow
MAX_NEW = 48


@pytest.fixture(scope="module")
def demo(demo_model):
    model = load_model(demo_model, "float32")
    tok = AutoTokenizer.from_pretrained(demo_model)
    texts = load_heldout_prompts(50, "open") + load_heldout_prompts(50, "copy")
    prompts = [tok(t)["input_ids"] for t in texts]
    eos = model_eos(model)
    return model, prompts, eos


@pytest.fixture(scope="module")
def greedy_outputs(demo):
    model, prompts, eos = demo
    return [greedy_generate(model, p, MAX_NEW, eos) for p in prompts]


def _first_mismatch(got: list[int], want: list[int]) -> int:
    return next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))


@pytest.mark.parametrize(
    ("window", "ngram", "pool_size", "n_prompts"),
    [(5, 3, 5, 100), (7, 4, 7, 40), (15, 5, 15, 12)],
)
def test_lade_matches_greedy(demo, greedy_outputs, window, ngram, pool_size, n_prompts) -> None:
    model, prompts, eos = demo
    # spread the subset over both prompt kinds (open first half, copy second half)
    idx = list(range(0, 100, 100 // n_prompts))[:n_prompts] if n_prompts < 100 else list(range(100))
    multi = tokens = forwards = 0
    for i in idx:
        res = lade_generate(
            model, prompts[i], MAX_NEW, window=window, ngram=ngram, pool_size=pool_size, eos_token_id=eos
        )
        want = greedy_outputs[i]
        assert res.tokens == want, f"prompt {i}: first mismatch at token {_first_mismatch(res.tokens, want)}"
        multi += sum(a > 1 for a in res.accepted)
        tokens += len(res.tokens)
        forwards += res.forwards
    # the comparison exercised the acceptance + KV-copy path, and the decoder did save forwards
    assert multi > 0
    assert tokens / forwards > 1.0


def test_prompt_lookup_matches_greedy(demo, greedy_outputs) -> None:
    model, prompts, eos = demo
    for i in range(0, 100, 4):  # 25 prompts, both kinds
        res = prompt_lookup_generate(model, prompts[i], MAX_NEW, k=3, eos_token_id=eos)
        assert res.tokens == greedy_outputs[i], f"prompt {i}"
