"""Token layout, position ids and attention mask of one LADE decode step (both branches, one forward).

Why a separate module: the mask and positions are where a lookahead decoder silently goes wrong (a row
that sees a token it should not still produces plausible logits).  Building them as plain data makes
them testable row by row against an ordinary causal forward (tests/lade2d/reference/test_ref_layout.py).

Rows of a step, in order (p = position of the current token = number of tokens in the KV cache):

* block 0, ``C = len(levels[0]) + 1`` rows: the current token (column 0, position p) and level 0 of the
  lookahead window (column i at position p+i); causal among themselves.
* levels 1..F, ``C`` rows each: level l, column i sits at position p+l+i and sees block-0 columns 0..i
  plus column i of levels 1..l (itself included) -- LADE's ``j_make_causal_mask_multilevel``.  The
  tokens it sees therefore cover the positions p..p+l+i exactly once: a diagonal Jacobi trajectory.
* verification branch: each candidate n-gram g (tokens at positions p+1..p+len(g)) sees the current
  token and its own earlier tokens only.

Every row also sees the whole KV cache (the committed prefix).  The two branches never see each other,
and candidates never see each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class StepLayout:
    """One step's rows: ids, absolute positions, the in-step visibility matrix and row bookkeeping."""

    tokens: list[int]
    positions: list[int]
    visible: torch.Tensor  # bool [L, L]: visible[r, c] -> row r attends to in-step row c
    level_rows: list[list[int]]  # level_rows[0] = block 0 (current + level 0), then levels 1..F
    guess_rows: list[list[int]]  # rows of each verification candidate, in candidate order

    def __len__(self) -> int:
        return len(self.tokens)

    def attention_mask(self, past_len: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive float mask [1, 1, L, past_len + L]: 0 where visible, dtype-min elsewhere.

        A float mask works with both the eager and the SDPA attention of transformers; masked scores
        underflow to exactly zero weight after the softmax.
        """
        n = len(self.tokens)
        allowed = torch.ones(n, past_len + n, dtype=torch.bool)
        allowed[:, past_len:] = self.visible
        mask = torch.zeros(n, past_len + n, dtype=dtype)
        mask.masked_fill_(~allowed, torch.finfo(dtype).min)
        return mask[None, None]


def build_step_layout(
    current: int,
    position: int,
    levels: Sequence[Sequence[int]],
    guesses: Sequence[Sequence[int]] = (),
) -> StepLayout:
    """Lay out ``[current] + window + guesses`` for a step whose current token sits at ``position``.

    ``levels[0]`` is level 0 of the window (may be empty: then the step is verification only, as in
    prompt lookup); ``levels[1:]`` must each have ``len(levels[0]) + 1`` tokens (one per column).
    """
    if not levels:
        raise ValueError("levels must hold at least level 0 (possibly empty)")
    width = len(levels[0]) + 1
    for lvl_idx, lvl in enumerate(levels[1:], start=1):
        if len(lvl) != width:
            raise ValueError(f"level {lvl_idx} has {len(lvl)} tokens, expected {width} (= len(level 0) + 1)")
    for g in guesses:
        if len(g) == 0:
            raise ValueError("empty verification candidate")

    tokens: list[int] = [int(current)] + [int(t) for t in levels[0]]
    positions: list[int] = [position + i for i in range(width)]
    level_rows: list[list[int]] = [list(range(width))]
    for lvl_idx, lvl in enumerate(levels[1:], start=1):
        start = len(tokens)
        tokens += [int(t) for t in lvl]
        positions += [position + lvl_idx + i for i in range(width)]
        level_rows.append(list(range(start, start + width)))
    guess_rows: list[list[int]] = []
    for g in guesses:
        start = len(tokens)
        tokens += [int(t) for t in g]
        positions += [position + 1 + j for j in range(len(g))]
        guess_rows.append(list(range(start, start + len(g))))

    n = len(tokens)
    visible = np.zeros((n, n), dtype=bool)  # numpy, then one conversion: this runs every decode step
    block0 = level_rows[0]
    for i, row in enumerate(block0):
        visible[row, block0[: i + 1]] = True
    for lvl_idx in range(1, len(level_rows)):
        for i, row in enumerate(level_rows[lvl_idx]):
            visible[row, block0[: i + 1]] = True
            for lower in range(1, lvl_idx + 1):
                visible[row, level_rows[lower][i]] = True
    for rows in guess_rows:
        for j, row in enumerate(rows):
            visible[row, block0[0]] = True
            visible[row, rows[: j + 1]] = True
    return StepLayout(tokens, positions, torch.from_numpy(visible), level_rows, guess_rows)
