"""``lade2d.lade`` -- the 2D state the vLLM path runs -- checked on Hugging Face before vLLM sees it.

1. Every row of a ``LadePlan`` (vLLM row order: current, candidates, window) gets exactly the logits
   of its own causal context (the per-row oracle of test_ref_layout, on the permuted layout).
2. Driving ``LadeState`` step by step on HF (plan -> masked forward -> ``verify_greedy`` -> keep the
   winner's KV -> ``absorb``) reproduces ``lade_generate(prefill_window=False)`` exactly: the same
   tokens and the same tokens-per-forward, so the window, pool and verification logic are LADE's.
   The vLLM test (tests/lade2d/test_lade2d.py) then compares vLLM against the same reference.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DynamicCache

from vllm_lookahead.lade2d.lade import LadeState, verify_greedy
from vllm_lookahead.lade2d.reference import StepLayout, greedy_generate, lade_generate
from vllm_lookahead.lade2d.reference.model import forward_rows, keep_cache_rows

from .test_ref_layout import TOL, max_row_error

pytestmark = pytest.mark.unit
VOCAB = 48


def _prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    base = [rng.randrange(VOCAB) for _ in range(max(1, length // 2))]
    return (base * 3)[:length]


def as_layout(plan) -> StepLayout:
    return StepLayout(plan.tokens, [plan.position + int(r) for r in plan.rel_pos], plan.visible,
                      plan.level_rows, plan.guess_rows)


def drive_on_hf(model, prompt: list[int], max_new: int, w: int, n: int, g: int, seed: int):
    """The vLLM 2D path's algorithm, with HF as the engine: returns (tokens, committed per forward)."""
    state = LadeState(w, n, g, seed=seed)
    cache = DynamicCache()
    logits = forward_rows(model, cache, prompt)
    seq = prompt + [int(logits[-1].argmax())]
    committed = [1]
    state.observe(seq, len(seq), len(prompt))
    while len(seq) - len(prompt) < max_new:
        past = len(seq) - 1
        plan = state.plan(seq[-1], past)
        lay = as_layout(plan)
        logits = forward_rows(model, cache, lay.tokens, lay.positions, lay.attention_mask(past, model.dtype))
        argmax = logits.argmax(dim=-1).tolist()
        accepted, matched, winner = verify_greedy(argmax[0], plan.guesses, plan.guess_rows, argmax)
        keep = list(range(past + 1)) + ([past + r for r in plan.guess_rows[winner][:matched]] if matched else [])
        keep_cache_rows(cache, keep)
        state.absorb(plan, argmax, matched)
        accepted = accepted[: max_new - (len(seq) - len(prompt))]
        seq += accepted
        committed.append(len(accepted))
        state.observe(seq, len(seq), len(prompt))
    return seq[len(prompt):], committed


@settings(max_examples=30, deadline=None)
@given(w=st.integers(1, 5), n=st.integers(3, 5), g=st.integers(0, 5), seed=st.integers(0, 10_000),
       prompt_len=st.integers(1, 24), max_new=st.integers(1, 40))
def test_core_lade_equals_reference_step_for_step(tiny_llama, w, n, g, seed, prompt_len, max_new) -> None:
    prompt = _prompt(seed, prompt_len)
    tokens, committed = drive_on_hf(tiny_llama, prompt, max_new, w, n, g, seed)
    ref = lade_generate(tiny_llama, prompt, max_new, window=w, ngram=n, pool_size=g, seed=seed,
                        prefill_window=False)
    assert tokens == ref.tokens == greedy_generate(tiny_llama, prompt, max_new)
    assert committed == ref.accepted


@settings(max_examples=20, deadline=None)
@given(w=st.integers(1, 4), n=st.integers(3, 5), g=st.integers(1, 4), seed=st.integers(0, 10_000),
       steps=st.integers(0, 6), extra=st.lists(st.integers(0, VOCAB - 1), max_size=5))
def test_plan_rows_match_their_causal_context(tiny_llama, w, n, g, seed, steps, extra) -> None:
    """Warm-up and steady-state plans, candidates (and an extra context candidate of any length)
    included, in vLLM's row order."""
    rng = random.Random(seed)
    prompt = _prompt(seed, 16)
    state = LadeState(w, n, g, seed=seed)
    state.observe(prompt + [prompt[0]], len(prompt) + 1, len(prompt))
    for _ in range(steps):  # advance the window with arbitrary argmax: the layout rules must still hold
        plan = state.plan(prompt[0], len(prompt))
        state.absorb(plan, [rng.randrange(VOCAB) for _ in plan.tokens], 0)
    plan = state.plan(prompt[0], len(prompt), [extra])
    assert plan.tokens[0] == prompt[0] and len(plan.drafts) == len(plan.tokens) - 1
    if plan.guesses:  # candidate 0 right after the current token: its KV lands in the next step's slots
        assert plan.guess_rows[0] == list(range(1, len(plan.guesses[0]) + 1))
        assert plan.full or extra
    if extra:
        assert plan.guesses[0] == tuple(extra)
        assert all(gu != tuple(extra[: len(gu)]) for gu in plan.guesses[1:])  # no duplicate rows
    assert len(set(plan.guesses)) == len(plan.guesses)
    assert max_row_error(tiny_llama, prompt, as_layout(plan), list(range(len(plan.tokens)))) < TOL


def test_verify_greedy_picks_the_longest_earliest_candidate() -> None:
    # rows: 0 current | cand0 rows 1,2 | cand1 rows 3,4 | cand2 rows 5,6
    argmax = [7, 8, 0, 8, 9, 8, 9]
    guesses = [(7, 1), (7, 8), (7, 8)]
    rows = [[1, 2], [3, 4], [5, 6]]
    assert verify_greedy(argmax[0], guesses, rows, argmax) == ([7, 8, 9], 2, 1)  # tie -> earliest (1, not 2)
    assert verify_greedy(argmax[0], [(5, 1)], [[1, 2]], argmax) == ([7], 0, -1)
