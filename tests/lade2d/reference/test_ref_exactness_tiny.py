"""Lookahead and prompt lookup reproduce plain greedy token for token (tiny random Llama, float32).

Property test over random W/N/G, prompts and lengths; plus the EOS stop point, input validation, and a
negative control that a decoder with a broken mask is caught by the same comparison.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_lookahead.lade2d.reference import decoder as decoder_mod
from vllm_lookahead.lade2d.reference import (
    greedy_generate,
    lade_generate,
    lookup_draft,
    prompt_lookup_generate,
)

pytestmark = pytest.mark.unit
VOCAB = 48


def _prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    base = [rng.randrange(VOCAB) for _ in range(max(1, length // 2))]
    return (base * 3)[:length]  # some repetition, so the prompt pool has something to offer


@settings(max_examples=60, deadline=None)
@given(
    window=st.integers(1, 6),
    ngram=st.integers(3, 5),
    pool_size=st.integers(0, 6),
    prompt_seed=st.integers(0, 10_000),
    prompt_len=st.integers(1, 24),
    max_new=st.integers(0, 40),
    prompt_pool=st.booleans(),
)
def test_lade_equals_greedy(
    tiny_llama, window, ngram, pool_size, prompt_seed, prompt_len, max_new, prompt_pool
) -> None:
    prompt = _prompt(prompt_seed, prompt_len)
    want = greedy_generate(tiny_llama, prompt, max_new)
    got = lade_generate(
        tiny_llama, prompt, max_new, window=window, ngram=ngram, pool_size=pool_size,
        prompt_pool=prompt_pool, seed=prompt_seed,
    )
    assert got.tokens == want
    assert len(got.tokens) == max_new
    assert sum(got.accepted) == len(got.tokens)
    assert got.forwards == len(got.accepted) if max_new else got.forwards == 0
    assert all(1 <= a <= ngram for a in got.accepted)
    # steady-state steps (after the prefill and N-3 warm-up steps) cost at most (N-1)(W+G) query rows
    assert all(r <= (ngram - 1) * (window + pool_size) for r in got.rows[ngram - 2 :])


def test_lade_accepts_multiple_tokens_and_stays_exact(tiny_llama) -> None:
    """Coverage guard: the exactness above means little unless candidates actually get accepted
    (the KV-copy path).  On repetitive prompts the tiny model must accept > 1 token per step."""
    total_tokens = total_forwards = 0
    for seed in range(6):
        prompt = _prompt(seed, 20)
        want = greedy_generate(tiny_llama, prompt, 48)
        got = lade_generate(tiny_llama, prompt, 48, window=4, ngram=4, pool_size=4, seed=seed)
        assert got.tokens == want
        total_tokens += len(got.tokens)
        total_forwards += got.forwards
        assert max(got.accepted) >= 2
    assert total_tokens / total_forwards > 1.2


@settings(max_examples=25, deadline=None)
@given(
    k=st.integers(1, 6),
    prompt_seed=st.integers(0, 10_000),
    prompt_len=st.integers(1, 24),
    max_new=st.integers(0, 40),
)
def test_prompt_lookup_equals_greedy(tiny_llama, k, prompt_seed, prompt_len, max_new) -> None:
    prompt = _prompt(prompt_seed, prompt_len)
    got = prompt_lookup_generate(tiny_llama, prompt, max_new, k=k)
    assert got.tokens == greedy_generate(tiny_llama, prompt, max_new)
    assert all(1 <= a <= k + 1 for a in got.accepted)


def test_lookup_draft_rule() -> None:
    seq = [1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3]
    # longest suffix match (3 tokens: 1 2 3), earliest occurrence -> continuation 9 1
    assert lookup_draft(seq, 2, 1, 3) == [9, 1]
    assert lookup_draft([4, 5, 6], 3, 1, 3) == []


def test_eos_stops_where_greedy_stops(tiny_llama) -> None:
    for seed in range(4):
        prompt = _prompt(seed, 16)
        free = greedy_generate(tiny_llama, prompt, 40)
        eos = free[len(free) // 2]  # a token greedy emits mid-way: must stop at its first occurrence
        want = greedy_generate(tiny_llama, prompt, 40, eos_token_id=eos)
        assert want == free[: free.index(eos) + 1]
        got = lade_generate(tiny_llama, prompt, 40, window=4, ngram=4, pool_size=4, eos_token_id=eos)
        assert got.tokens == want
        assert got.stop_reason == "eos"
        pl = prompt_lookup_generate(tiny_llama, prompt, 40, k=3, eos_token_id=eos)
        assert pl.tokens == want


def test_bad_input_is_rejected(tiny_llama) -> None:
    with pytest.raises(ValueError, match="empty"):
        lade_generate(tiny_llama, [], 4, window=3, ngram=3, pool_size=3)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        greedy_generate(tiny_llama, [1, VOCAB + 5], 4)
    with pytest.raises(ValueError, match="ngram"):
        lade_generate(tiny_llama, [1, 2], 4, window=3, ngram=2, pool_size=3)
    with pytest.raises(ValueError, match="window"):
        lade_generate(tiny_llama, [1, 2], 4, window=0, ngram=3, pool_size=3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        lade_generate(tiny_llama, [1, 2], -1, window=3, ngram=3, pool_size=3)


def test_broken_mask_breaks_exactness(tiny_llama, monkeypatch) -> None:
    """Negative control (fault injection, so a monkeypatch): if the step used a plain causal mask,
    candidates would see the window and each other; the greedy comparison must catch it."""
    real_build = decoder_mod.build_step_layout

    def broken_build(*args, **kwargs):
        layout = real_build(*args, **kwargs)
        layout.visible.copy_(layout.visible.new_ones(layout.visible.shape).tril())
        return layout

    prompts = [_prompt(seed, 20) for seed in range(6)]
    wants = [greedy_generate(tiny_llama, p, 48) for p in prompts]
    monkeypatch.setattr(decoder_mod, "build_step_layout", broken_build)
    gots = [lade_generate(tiny_llama, p, 48, window=4, ngram=4, pool_size=4).tokens for p in prompts]
    assert any(g != w for g, w in zip(gots, wants, strict=True))
