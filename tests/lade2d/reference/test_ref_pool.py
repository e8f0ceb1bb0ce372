"""The n-gram pool keeps LADE's semantics: per-key LRU capped at G, N-1 token continuations."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_lookahead.lade2d.reference import NGramPool

pytestmark = pytest.mark.unit


def test_lru_refresh_and_eviction() -> None:
    pool = NGramPool(ngram=3, cap=2)
    pool.add(7, [1, 2])
    pool.add(7, [3, 4])
    pool.add(7, [1, 2])  # refresh: moves to the tail
    assert pool.candidates(7) == [(3, 4), (1, 2)]
    pool.add(7, [5, 6])  # full: evicts the least recent (3, 4)
    assert pool.candidates(7) == [(1, 2), (5, 6)]
    assert pool.candidates(8) == []


def test_window_harvest_follows_diagonal_columns() -> None:
    # N=4, W=3: level 0 has W-1 tokens, levels 1..2 have W; column i key = block-0 token i.
    pool = NGramPool(ngram=4, cap=5)
    levels = [[10, 11], [20, 21, 22], [30, 31, 32]]
    pool.add_window(current=99, levels=levels, new_results=[40, 41, 42])
    assert pool.candidates(99) == [(20, 30, 40)]
    assert pool.candidates(10) == [(21, 31, 41)]
    assert pool.candidates(11) == [(22, 32, 42)]


def test_prompt_ngrams_and_bad_input() -> None:
    pool = NGramPool(ngram=3, cap=4)
    pool.add_ngrams([1, 2, 3, 1, 2, 4])
    assert pool.candidates(1) == [(2, 3), (2, 4)]
    assert pool.candidates(2) == [(3, 1)]
    with pytest.raises(ValueError, match="2 tokens"):
        pool.add(1, [1, 2, 3])
    with pytest.raises(ValueError, match="cap"):
        NGramPool(ngram=3, cap=-1)


@settings(max_examples=60, deadline=None)
@given(
    ngram=st.integers(2, 5),
    cap=st.integers(0, 4),
    tokens=st.lists(st.integers(0, 5), min_size=0, max_size=60),
)
def test_pool_invariants(ngram: int, cap: int, tokens: list[int]) -> None:
    pool = NGramPool(ngram, cap)
    pool.add_ngrams(tokens)
    for key in pool.tracked_keys():
        cands = pool.candidates(key)
        assert len(cands) <= cap
        assert len(set(cands)) == len(cands)
        assert all(len(c) == ngram - 1 for c in cands)
    # the most recent n-gram is always present, at the tail of its key
    if cap and len(tokens) >= ngram:
        assert pool.candidates(tokens[-ngram])[-1] == tuple(tokens[-ngram + 1 :])
