"""LADE's mask and position ids, checked row by row against an ordinary causal forward.

For every row of a step, the tokens it may see (prefix + visible in-step rows) must sit at the
contiguous positions ``0..pos(row)``; running exactly that sequence through the model with a plain
causal mask must give the same logits as the row gets inside the packed lookahead step.  This is the
exactness argument of lookahead decoding, made executable -- and it fails for a broken mask.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DynamicCache

from vllm_lookahead.lade2d.reference import StepLayout, build_step_layout
from vllm_lookahead.lade2d.reference.model import forward_rows

pytestmark = pytest.mark.unit
TOL = 1e-4


def row_context(layout: StepLayout, row: int, past: int) -> list[int]:
    """The in-step tokens ``row`` sees, in position order; asserts they fill past..pos(row) once."""
    seen = [c for c in range(len(layout)) if layout.visible[row, c]]
    seen.sort(key=lambda c: layout.positions[c])
    positions = [layout.positions[c] for c in seen]
    assert positions == list(range(past, layout.positions[row] + 1)), (row, positions)
    assert seen[-1] == row
    return [layout.tokens[c] for c in seen]


def step_logits(model, prefix: list[int], layout: StepLayout) -> torch.Tensor:
    cache = DynamicCache()
    forward_rows(model, cache, prefix)
    past = len(prefix)
    return forward_rows(model, cache, layout.tokens, layout.positions, layout.attention_mask(past, model.dtype))


def oracle_logits(model, prefix: list[int], context: list[int]) -> torch.Tensor:
    return forward_rows(model, DynamicCache(), prefix + context)[-1]


def max_row_error(model, prefix: list[int], layout: StepLayout, rows: list[int]) -> float:
    got = step_logits(model, prefix, layout)
    worst = 0.0
    for r in rows:
        want = oracle_logits(model, prefix, row_context(layout, r, len(prefix)))
        worst = max(worst, float((got[r] - want).abs().max()))
    return worst


@st.composite
def layouts(draw):
    """Steady-state and warm-up shaped windows, with 0..3 candidates of 1..N-1 tokens."""
    vocab = 48
    tok = st.integers(0, vocab - 1)
    width = draw(st.integers(1, 5))  # columns (W in steady state)
    n_levels = draw(st.integers(0, 3))  # levels above level 0
    levels = [draw(st.lists(tok, min_size=width - 1, max_size=width - 1))]
    levels += [draw(st.lists(tok, min_size=width, max_size=width)) for _ in range(n_levels)]
    guess_len = n_levels + 1
    guesses = draw(st.lists(st.lists(tok, min_size=1, max_size=guess_len), max_size=3))
    prefix = draw(st.lists(tok, min_size=1, max_size=10))
    current = draw(tok)
    return prefix, build_step_layout(current, len(prefix), levels, guesses)


@settings(max_examples=25, deadline=None)
@given(case=layouts())
def test_every_row_matches_its_causal_context(tiny_llama, case) -> None:
    prefix, layout = case
    assert max_row_error(tiny_llama, prefix, layout, list(range(len(layout)))) < TOL


def test_positions_follow_lade_diagonals() -> None:
    layout = build_step_layout(5, 100, [[1, 2], [3, 4, 6], [7, 8, 9]], [[10, 11]])
    # block 0: p..p+2; level 1: p+1..p+3; level 2: p+2..p+4; candidate: p+1..p+2
    assert layout.positions == [100, 101, 102, 101, 102, 103, 102, 103, 104, 101, 102]
    assert layout.level_rows == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert layout.guess_rows == [[9, 10]]
    # branches never see each other
    window = [r for rows in layout.level_rows for r in rows]
    assert not layout.visible[9:, window[1:]].any()
    assert not layout.visible[:9, 9:].any()


def test_bad_layout_is_rejected() -> None:
    with pytest.raises(ValueError, match="level 1 has 2 tokens"):
        build_step_layout(1, 0, [[1, 2], [3, 4]])
    with pytest.raises(ValueError, match="empty verification candidate"):
        build_step_layout(1, 0, [[1]], [[]])


def test_broken_mask_is_detected(tiny_llama) -> None:
    """Negative control: a plain causal mask over the packed step (candidates then see the window and
    each other) must make the candidate rows disagree with their causal context."""
    rng = random.Random(1)
    prefix = [rng.randrange(48) for _ in range(6)]
    good = build_step_layout(3, len(prefix), [[4, 5], [6, 7, 8]], [[9, 10], [11, 12]])
    candidate_rows = [r for rows in good.guess_rows for r in rows]
    assert max_row_error(tiny_llama, prefix, good, candidate_rows) < TOL
    n = len(good)
    broken = dataclasses.replace(good, visible=torch.ones(n, n, dtype=torch.bool).tril())
    got = step_logits(tiny_llama, prefix, broken)
    errors = [
        float((got[r] - oracle_logits(tiny_llama, prefix, row_context(good, r, len(prefix)))).abs().max())
        for r in candidate_rows
    ]
    assert max(errors) > 100 * TOL, errors
