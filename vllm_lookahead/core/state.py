"""Per-request lookahead state: context index, n-gram pool, Jacobi iterate and trajectories.

One verification step of the chain design, for a request whose last committed token x sits at
position P and whose draft d_1..d_L was verified:
    inputs   x   d_1  d_2 ... d_L          (positions P .. P+L)
    argmax   t_1 t_2  t_3 ... t_{L+1}      (target's guess for positions P+1 .. P+L+1)
The first a drafts matched, so t_1..t_{a+1} are committed (t_{a+1} is the bonus token).  The argmax
past that point, t_{a+2}..t_{L+1}, was computed from a context that holds the wrong d_{a+1}: it is the
next *Jacobi iterate* for the positions after the new last token.  Following one position through
successive iterates gives LADE's trajectory n-grams (token at q, then the prediction made from it for
q+1, then the prediction made from *that* for q+2, ...), which feed the pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .config import LookaheadConfig
from .context_index import ContextIndex
from .pool import NGramPool

HISTORY_PRIOR = 8.0
"""Pseudo-tokens on both sides of a request's accepted / expected ratio (``chain.history_factor``): the
ratio moves off 1 only once the request has a few steps of history.  With +1 it swung on a step or
two and, applied to every token of a draft, overshot: replays at about equal draft tokens commit more
with 8 and the factor applied once (benchmarks/results/history_calibration_{open,copy}_48*.json against
draft_calibration_*; benchmarks/results/README.md, "the request's history factor")."""

SOURCE_NONE, SOURCE_CONTEXT, SOURCE_POOL, SOURCE_JACOBI = "none", "context", "pool", "jacobi"


@dataclass
class RequestStats:
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    by_source: dict[str, list[int]] = field(default_factory=dict)  # source -> [drafted, accepted]


class RequestState:
    def __init__(self, cfg: LookaheadConfig, k: int, prompt_len: int = 0, shared: NGramPool | None = None):
        self.cfg = cfg
        self.shared = shared  # the engine-wide pool of output n-grams (None = off)
        self.k = k
        self.window = cfg.window or k
        self.prompt_len = prompt_len
        self.index = ContextIndex(cfg.min_match, cfg.max_match)
        self.pool = NGramPool(cfg.ngram, cfg.pool_size, cfg.max_pool_keys)
        self.seen = 0  # committed tokens already indexed
        self.last_draft: list[int] = []
        self.last_source = SOURCE_NONE
        self.jacobi: list[int] = []  # current Jacobi iterate for the positions after the last token
        self._chains: list[tuple[int, list[int]]] = []  # (position of last token, tokens)
        self.ema = 0.5
        self.idle_steps = 0
        self.stats = RequestStats()
        # policy "cost": acceptance cells and estimates of the last draft, the outcome of its
        # verification (drafts verified, accepted) for the drafter's table, the request's own history
        self.last_cells: list[int] = []
        self.last_p: list[float] = []
        self.last_outcome: tuple[int, int] | None = None
        self.hist_accepted = 0.0
        self.hist_expected = 0.0
        self.isolation_key: object = None
        self.memory_seen = 0  # committed tokens already handed to the engine-wide memory
        self.use_pool = True  # policy "cost" turns the pool's upkeep off while the batch is large

    # ------------------------------------------------------------------ observe
    def observe(self, context: np.ndarray | list[int], num_tokens: int, new_tokens: list[int],
                verified: int, argmax: np.ndarray | list[int] | None) -> None:
        """Absorb one engine step: committed tokens (``context[:num_tokens]``), the accepted+bonus
        tokens of this step, how many draft tokens were verified, and the target argmax at the
        ``verified + 1`` verification rows (None when it was not captured)."""
        continuous = self.seen > 0 and num_tokens == self.seen + len(new_tokens)
        start_pos = self.seen - 1  # P: position of the last committed token before this step
        if self.seen == 0 or num_tokens < self.seen or not continuous:
            self._reset_transient()
        self._index_committed(context, num_tokens)
        if not new_tokens:
            return
        self.stats.steps += 1
        drafts = self.last_draft[:verified] if continuous else []
        self.last_draft = []
        if not drafts:
            self.jacobi = []
            return
        accepted = len(new_tokens) - 1
        self.last_outcome = (len(drafts), accepted)
        self.stats.drafted += len(drafts)
        self.stats.accepted += accepted
        src = self.stats.by_source.setdefault(self.last_source, [0, 0])
        src[0] += len(drafts)
        src[1] += accepted
        rate = accepted / len(drafts)
        self.ema = self.cfg.ema_decay * self.ema + (1.0 - self.cfg.ema_decay) * rate
        if argmax is None or len(argmax) != len(drafts) + 1 or not self.use_pool:
            self.jacobi = []
            return
        out = _ints(argmax)
        inp = [int(context[start_pos])] + drafts
        self.jacobi = out[accepted + 1 :][: self.window]
        self._update_trajectories(start_pos, inp, out, accepted)

    def _index_committed(self, context, num_tokens: int) -> None:
        if num_tokens <= self.seen:
            return
        start = self.seen
        if start == 0:  # first sight: bound the one-off indexing cost of a long prompt
            start = max(0, num_tokens - self.cfg.max_prompt_index_tokens)
        if not self.use_pool and self.shared is None:  # the context index alone (policy "chain", busy batch)
            self.index.extend(context[start:num_tokens])
            self.seen = num_tokens
            return
        # n-grams ending in the new tokens; without prompt seeding, only keys from the last prompt
        # token on (its continuation is output) enter the pool.
        key_floor = 0 if self.cfg.seed_from_prompt else max(self.prompt_len - 1, 0)
        lo = min(max(start - (self.cfg.ngram - 1), key_floor, 0), start)
        window = _ints(context[lo:num_tokens])  # one conversion to Python ints for both indexes
        self.index.extend(window[start - lo:])
        if self.use_pool:
            self.pool.add_sequence(window, start=max(key_floor - lo, 0))
        if self.shared is not None:  # output n-grams only: prompts are the client's, not the model's
            self.shared.add_sequence(window, start=max(self.prompt_len - 1 - lo, 0))
        self.seen = num_tokens

    def _update_trajectories(self, start_pos: int, inp: list[int], out: list[int], accepted: int) -> None:
        n = self.cfg.ngram
        lo, hi = start_pos, start_pos + len(inp) - 1
        kept: list[tuple[int, list[int]]] = []
        for pos, toks in self._chains:
            # The chain's last token was predicted for `pos`; it continues only if this step's input at
            # `pos` was that very token (the Jacobi iterate was carried into the draft).
            if lo <= pos <= hi and inp[pos - lo] == toks[-1]:
                toks = toks + [out[pos - lo]]
                if len(toks) >= n:
                    self.pool.add(toks[0], tuple(toks[1:n]))
                else:
                    kept.append((pos + 1, toks))
        for j in range(accepted + 1, len(inp)):
            toks = [inp[j], out[j]]
            if n == 2:
                self.pool.add(toks[0], (toks[1],))
            else:
                kept.append((start_pos + j + 1, toks))
        self._chains = kept[-4 * self.k :]

    def _reset_transient(self) -> None:
        self.last_draft = []
        self.jacobi = []
        self._chains = []

    # ------------------------------------------------------------------ propose
    def propose(self, budget: int, confident_only: bool = False) -> list[int]:
        """A draft of at most ``budget`` tokens for the positions after the last committed token.

        ``confident_only``: only a context match of >= ``cfg.confident_match`` tokens, no pool or
        Jacobi fill (the policy's fallback when speculative drafting does not pay)."""
        budget = min(budget, self.k)
        if budget <= 0 or self.seen == 0:
            self.last_draft, self.last_source = [], SOURCE_NONE
            return []
        toks = self.index.tokens
        cont, match_len = self.index.lookup(budget)
        if confident_only:
            draft = list(cont) if cont and match_len >= self.cfg.confident_match else []
            self.last_draft, self.last_source = draft, (SOURCE_CONTEXT if draft else SOURCE_NONE)
            return list(draft)
        jac = self.jacobi
        draft: list[int]
        if cont and (match_len >= 2 or (jac and cont[0] == jac[0])):
            draft, source = list(cont), SOURCE_CONTEXT
        else:
            cands = self.pool.get(toks[-1]) or self._shared_get(toks[-1])
            if cands:
                best = max(range(len(cands)), key=lambda i: (_agreement(cands[i], jac), -i))
                draft, source = list(cands[best]), SOURCE_POOL
                if jac and _agreement(cands[best], jac) == 0 and not cont:
                    draft, source = list(jac), SOURCE_JACOBI
            elif cont:
                draft, source = list(cont), SOURCE_CONTEXT
            elif jac:
                draft, source = list(jac), SOURCE_JACOBI
            else:
                draft, source = [], SOURCE_NONE
        draft = self._extend(draft, budget)
        self.last_draft, self.last_source = draft, source
        return list(draft)

    def _shared_get(self, key: int) -> list[tuple[int, ...]]:
        return self.shared.get(key) if self.shared is not None else []

    def _extend(self, draft: list[int], budget: int) -> list[int]:
        """Fill the remaining slots by chaining pool look-ups from the draft's last token (extra draft
        rows are nearly free to verify while decoding is memory-bound)."""
        draft = draft[:budget]
        while draft and len(draft) < budget:
            nxt = self.pool.get(draft[-1]) or self._shared_get(draft[-1])
            if not nxt:
                break
            draft.extend(nxt[0][: budget - len(draft)])
        return draft


def _ints(tokens: np.ndarray | list[int]) -> list[int]:
    """Python ints from a numpy row (``tolist`` is ~10x faster than ``int()`` per element)."""
    return tokens.tolist() if isinstance(tokens, np.ndarray) else [int(t) for t in tokens]


def _agreement(cand: tuple[int, ...] | list[int], ref: list[int]) -> int:
    n = 0
    for a, b in zip(cand, ref):
        if a != b:
            break
        n += 1
    return n
