"""LADE's 2D lookahead for one request, laid out for vLLM: window levels, n-gram pool, G candidates.

The chain design (``state.py``) fits vLLM's single draft chain.  This is the other design, the paper's
own: every step runs ``[current] + G candidates + the W x (N-1) Jacobi window`` in one forward with
LADE's mask (``lade_layout``), verifies all candidates at once (``verify_greedy``) and shifts the window
one level (LADE's update rule, as in ``reference.decoder.lade_generate``).  vLLM runs it through
``vllm_lookahead.lade2d.hooks`` (positions, mask, verifier, KV fix-up); this module is the pure part.

Row order (``LadePlan``): row 0 is the current token, then candidate 0, candidate 1, ..., then the
window (level 0, then levels 1..).  Candidate 0 first means its KV already sits in the slots right
after the prefix -- the ones the next step reads -- so the KV fix-up is needed only when a later
candidate wins; and if the engine cannot run a plan as 2D (truncation), vLLM verifies the same
drafts as a chain, which is still lossless and still accepts candidate 0.

vLLM cannot put level 0 into the prefill as LADE does, so level 0 enters at the first decode step
(``reference.decoder.lade_generate(prefill_window=False)`` is the same variant on Hugging Face).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .lade_layout import build_step_layout
from .lade_pool import LadeNGramPool


def verify_greedy(first: int, guesses: Sequence[Sequence[int]], guess_rows: Sequence[Sequence[int]],
                  argmax: Sequence[int]) -> tuple[list[int], int, int]:
    """Longest-prefix greedy verification over all candidates (LADE's loop, plus the bonus token).

    ``first``: the target's argmax at the current token's row; ``argmax[r]``: at row r.  Returns
    (accepted tokens, matched length m, index of the winning candidate or -1).  The accepted tokens
    are ``first`` followed by the argmax after each matched candidate token -- exactly what plain
    greedy would emit.  Ties go to the earliest candidate, as in LADE.
    """
    best_len, best_idx, accepted = 0, -1, [int(first)]
    for idx, (guess, rows) in enumerate(zip(guesses, guess_rows, strict=True)):
        correct = [int(first)] + [int(argmax[r]) for r in rows]
        m = 0
        while m < len(guess) and guess[m] == correct[m]:
            m += 1
        if m > best_len:
            best_len, best_idx, accepted = m, idx, correct[: m + 1]
    return accepted, best_len, best_idx


def verify_sampled(probs: np.ndarray, guesses: Sequence[Sequence[int]], guess_rows: Sequence[Sequence[int]],
                   rng: np.random.Generator) -> tuple[list[int], int, int]:
    """Lossless multi-candidate verification when sampling (LADE's / SpecInfer's rule for one-hot drafts).

    ``probs[r]``: the target's (processed: temperature, top-k, top-p) next-token distribution at row r.
    At each depth the distinct next tokens of the surviving candidates are tried in candidate order:
    token t is accepted with probability P(t); on rejection P(t) is set to 0 and P renormalised (the
    residual), so a rejected token can never come back through a later candidate.  After an
    acceptance only candidates carrying t continue, and P becomes the distribution at t's row.  When
    nothing is accepted (or no candidate is left) one token is sampled from P and the step ends.  Each
    emitted token is therefore distributed exactly as the target's P given the tokens before it.
    Returns (accepted tokens, matched length m, winning candidate or -1), as ``verify_greedy``.
    """
    alive = list(range(len(guesses)))
    p = probs[0].astype(np.float64)
    out: list[int] = []
    winner = -1
    depth = 0
    while True:
        tried: set[int] = set()
        token = -1
        for c in alive:
            if len(guesses[c]) <= depth or guesses[c][depth] in tried:
                continue
            t = int(guesses[c][depth])
            tried.add(t)
            total = p.sum()
            if rng.random() * total < p[t]:
                token = t
                break
            p[t] = 0.0
        if token < 0:  # all rejected, or no candidate left: sample from the residual and stop
            p = np.clip(p, 0.0, None)
            out.append(int(rng.choice(len(p), p=p / p.sum())))
            return out, depth, winner
        out.append(token)
        alive = [c for c in alive if len(guesses[c]) > depth and guesses[c][depth] == token]
        winner = alive[0]
        p = probs[guess_rows[winner][depth]].astype(np.float64)
        depth += 1


@dataclass(frozen=True)
class LadePlan:
    """One request's rows for one step, in vLLM order (current, candidates, window)."""

    position: int  # p: position of the current token (= tokens already in the KV cache)
    tokens: list[int]  # rows; tokens[1:] are what the proposer hands vLLM as drafts
    rel_pos: np.ndarray  # int64 [L]: position of each row minus p
    visible: torch.Tensor  # bool [L, L]: row r attends to step row c (the prefix is always visible)
    guesses: list[tuple[int, ...]]
    guess_rows: list[list[int]]
    level_rows: list[list[int]]  # block 0 (current + level 0), then levels 1..
    levels: list[list[int]]  # the window this step ran with
    full: bool  # the window has all N-1 levels (steady state: harvest, then shift)

    @property
    def drafts(self) -> list[int]:
        return self.tokens[1:]


class LadeState:
    """Window, pool and step planning of one request (LADE W/N/G).  The window follows the target's
    argmax in greedy and sampling mode alike; the pool holds at most G continuations per key and one
    key per distinct committed token (LADE's pool has no key bound either)."""

    def __init__(self, window: int, ngram: int, candidates: int, seed: int = 0):
        if window < 1 or ngram < 3 or candidates < 0:
            raise ValueError(f"need W >= 1, N >= 3, G >= 0; got W={window} N={ngram} G={candidates}")
        self.window, self.ngram, self.candidates = window, ngram, candidates
        self.pool = LadeNGramPool(ngram, candidates)
        self._rng = random.Random(seed)
        self.levels: list[list[int]] = []
        self.seen = 0  # committed tokens whose n-grams are in the pool
        self.steps = 0  # 2D steps absorbed
        self.accepted = 0  # candidate tokens accepted over those steps

    def observe(self, context: Sequence[int] | np.ndarray, num_tokens: int, prompt_len: int) -> None:
        """Add the n-gram ending at every newly committed token (LADE's prompt + output pool); at first
        sight also draw level 0 of the window from the prompt, as LADE initialises it."""
        if not self.levels:
            prompt = context[: max(prompt_len, 1)]
            prompt = prompt.tolist() if isinstance(prompt, np.ndarray) else [int(t) for t in prompt]
            self.levels = [[self._rng.choice(prompt) for _ in range(self.window + self.ngram - 3)]]
        if num_tokens <= self.seen:
            return
        n = self.ngram
        lo = max(self.seen - n + 1, 0)
        toks = context[lo:num_tokens]
        toks = toks.tolist() if isinstance(toks, np.ndarray) else [int(t) for t in toks]
        for end in range(max(self.seen, n - 1), num_tokens):
            e = end - lo
            self.pool.add(toks[e - n + 1], toks[e - n + 2 : e + 1])
        self.seen = num_tokens

    def plan(self, current: int, position: int, extra: Sequence[Sequence[int]] = ()) -> LadePlan:
        """The rows of the next step for a request whose current token ``current`` sits at ``position``.

        ``extra``: candidates from elsewhere (a context match, the engine-wide pool; any length),
        verified first, in order; LADE's pool candidates follow.  A candidate that is a prefix of an
        earlier one adds no information and is dropped.
        """
        full = len(self.levels) == self.ngram - 1
        guesses: list[tuple[int, ...]] = []
        for cand in [tuple(int(t) for t in e) for e in extra if len(e)] + (self.pool.candidates(current) if full else []):
            if not any(g[: len(cand)] == cand for g in guesses):
                guesses.append(cand)
        lay = build_step_layout(current, position, self.levels, guesses)
        order = [0] + [r for rows in lay.guess_rows for r in rows] + lay.level_rows[0][1:] \
            + [r for rows in lay.level_rows[1:] for r in rows]
        where = {old: new for new, old in enumerate(order)}
        perm = torch.tensor(order)
        return LadePlan(
            position=position,
            tokens=[lay.tokens[r] for r in order],
            rel_pos=np.array([lay.positions[r] - position for r in order], dtype=np.int64),
            visible=lay.visible[perm][:, perm].contiguous(),
            guesses=guesses,
            guess_rows=[[where[r] for r in rows] for rows in lay.guess_rows],
            level_rows=[[where[r] for r in rows] for rows in lay.level_rows],
            levels=[list(lvl) for lvl in self.levels],
            full=full,
        )

    def absorb(self, plan: LadePlan, argmax: Sequence[int], matched: int) -> None:
        """LADE's window update from the argmax at every row of a step that ran ``plan`` as 2D."""
        top = [int(argmax[r]) for r in plan.level_rows[-1]]
        levels = plan.levels
        if plan.full:  # harvest W n-grams, then shift the window by one level
            self.pool.add_window(plan.tokens[0], levels, top)
            self.levels = [levels[1][1:]] + [list(lvl) for lvl in levels[2:]] + [top]
        else:  # warm-up: every level loses column 0, a new top level appears
            self.levels = [lvl[1:] for lvl in levels] + [top[1:]]
        self.steps += 1
        self.accepted += matched
