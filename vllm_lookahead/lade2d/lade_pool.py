"""LADE's n-gram pool ("token_map"): key token -> up to G continuations of N-1 tokens, per-key LRU.

Kept separate from the decoder so its invariants (cap, LRU order, tuple length) can be tested alone.
Semantics follow ``update_token_map`` / ``fill_pool_with_prompt`` / ``append_new_generated_pool`` in
hao-ai-lab/LookaheadDecoding (``lade/decoding.py``): adding a tuple that is already present moves it to
the tail (most recent); adding to a full key evicts the head (least recent).  Candidates are returned
oldest first, which is the order LADE verifies them in (ties go to the oldest).
"""

from __future__ import annotations

from collections.abc import Sequence


class LadeNGramPool:
    """Per-key LRU lists of (N-1)-token continuations, capped at ``cap`` entries per key."""

    def __init__(self, ngram: int, cap: int) -> None:
        if ngram < 2:
            raise ValueError(f"ngram must be >= 2, got {ngram}")
        if cap < 0:
            raise ValueError(f"pool cap (G) must be >= 0, got {cap}")
        self.ngram = ngram
        self.cap = cap
        self._map: dict[int, list[tuple[int, ...]]] = {}

    def add(self, key: int, continuation: Sequence[int]) -> None:
        """Insert (or refresh) one continuation of exactly N-1 tokens under ``key``."""
        tup = tuple(int(t) for t in continuation)
        if len(tup) != self.ngram - 1:
            raise ValueError(f"continuation must have {self.ngram - 1} tokens, got {len(tup)}")
        if self.cap == 0:
            return
        entries = self._map.setdefault(int(key), [])
        if tup in entries:
            entries.remove(tup)
        elif len(entries) >= self.cap:
            del entries[0]
        entries.append(tup)

    def add_ngrams(self, tokens: Sequence[int]) -> None:
        """Add every N-gram of ``tokens`` (LADE's prompt pool, ``fill_pool_with_prompt``)."""
        n = self.ngram
        for start in range(len(tokens) - n + 1):
            self.add(tokens[start], tokens[start + 1 : start + n])

    def add_window(self, current: int, levels: Sequence[Sequence[int]], new_results: Sequence[int]) -> None:
        """Harvest the W n-grams of a full lookahead window (LADE's ``update_token_map``).

        Column ``i`` of the window is a diagonal trajectory: its key is the block-0 token in that column
        (the current token for i=0, ``levels[0][i-1]`` otherwise), followed by column ``i`` of levels
        1..N-2 and the new prediction ``new_results[i]``.
        """
        width = len(new_results)
        for i in range(width):
            key = current if i == 0 else levels[0][i - 1]
            self.add(key, [lvl[i] for lvl in levels[1:]] + [new_results[i]])

    def candidates(self, key: int) -> list[tuple[int, ...]]:
        """The continuations stored under ``key``, oldest first (a copy)."""
        return list(self._map.get(int(key), ()))

    def __len__(self) -> int:
        return sum(len(v) for v in self._map.values())

    def tracked_keys(self) -> list[int]:
        """Keys that hold at least one entry (a key is created on first add)."""
        return list(self._map)
