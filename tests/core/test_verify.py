"""``core.verify.greedy_verify`` against a transcription of vLLM 0.32's greedy rejection kernel
(``rejection_greedy_sample_kernel``) on random steps: ragged drafts, rows without drafts, all accepted."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_lookahead.core.verify import PLACEHOLDER, greedy_verify


def vllm_greedy_rule(argmax, drafts, num_draft, max_spec_len):
    """vLLM's kernel, row by row: keep the target argmax while the draft matched; bonus if all did."""
    out = np.full((len(num_draft), max_spec_len + 1), PLACEHOLDER, dtype=np.int32)
    row = d = 0
    for i, nd in enumerate(num_draft):
        rejected = False
        for pos in range(nd):
            if not rejected:
                out[i, pos] = argmax[row + pos]
                rejected = drafts[d + pos] != argmax[row + pos]
        if not rejected:
            out[i, nd] = argmax[row + nd]  # the bonus row's argmax
        row += nd + 1
        d += nd
    return out


@pytest.mark.parametrize("seed", range(40))
def test_matches_vllms_greedy_rule(seed):
    rng = np.random.default_rng(seed)
    batch, k = int(rng.integers(1, 40)), int(rng.integers(1, 12))
    num_draft = rng.integers(0, k + 1, size=batch)
    num_draft[rng.integers(batch)] = k  # vLLM's max_spec_len is the longest draft of the step
    vocab = int(rng.choice([3, 50, 4096]))  # a small vocabulary makes long accepted runs likely
    argmax = rng.integers(0, vocab, size=int(num_draft.sum()) + batch)
    # drafts: copy the argmax at their position with probability 0.7, else a random token
    rows = np.concatenate([np.arange(s, s + n) for s, n in zip(np.cumsum(num_draft + 1) - num_draft - 1, num_draft)]
                          or [np.zeros(0, dtype=np.int64)]).astype(np.int64)
    drafts = np.where(rng.random(len(rows)) < 0.7, argmax[rows], rng.integers(0, vocab, size=len(rows)))
    got = greedy_verify(argmax, drafts, num_draft, k)
    assert got.dtype == np.int32 and got.shape == (batch, k + 1)
    np.testing.assert_array_equal(got, vllm_greedy_rule(argmax, drafts, num_draft, k))


def test_every_outcome_of_one_request():
    argmax = np.array([5, 6, 7, 8])  # three draft positions and the bonus row
    assert greedy_verify(argmax, np.array([5, 6, 7]), [3], 3).tolist() == [[5, 6, 7, 8]]  # all + bonus
    assert greedy_verify(argmax, np.array([5, 9, 7]), [3], 3).tolist() == [[5, 6, -1, -1]]  # 1 accepted
    assert greedy_verify(argmax, np.array([1, 6, 7]), [3], 3).tolist() == [[5, -1, -1, -1]]  # none
    # a row without drafts in a speculative step commits its bonus token only; padding to max_spec_len
    assert greedy_verify(np.array([4, 5, 6]), np.array([5]), [0, 1], 1).tolist() == [[4, -1], [5, 6]]


def test_inconsistent_shapes_are_refused():
    with pytest.raises(ValueError, match="do not fit"):
        greedy_verify(np.array([1, 2, 3]), np.array([1]), [1], 1)
    with pytest.raises(ValueError, match="max_spec_len"):
        greedy_verify(np.array([1, 2, 3]), np.array([1, 2]), [2], 1)
