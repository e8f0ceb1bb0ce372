"""Prompt-lookup over a request's committed tokens: find the most recent earlier occurrence of the
longest suffix (``max_match`` down to ``min_match`` tokens) and return what followed it.

Kept incremental (a dict per suffix length: n-gram -> end position of its latest occurrence), so each
step costs O(new tokens x levels) instead of rescanning the whole context like a KMP search would.
"""

from __future__ import annotations


class ContextIndex:
    def __init__(self, min_match: int, max_match: int):
        self.min_match = min_match
        self.max_match = max_match
        self.tokens: list[int] = []
        # _last[n][ngram] = index just past the n-gram's most recent occurrence that is not the suffix
        self._last: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_match, max_match + 1)}
        self._pending: dict[int, tuple[tuple[int, ...], int] | None] = {n: None for n in self._last}

    def extend(self, new_tokens: list[int]) -> None:
        toks = self.tokens
        start = len(toks)
        toks.extend(new_tokens if isinstance(new_tokens, list) else [int(t) for t in new_tokens])
        end = len(toks)
        for n, table in self._last.items():  # levels outside, tokens inside: fewer dict look-ups
            pending = self._pending[n]
            for e in range(max(start + 1, n), end + 1):
                # Register the previous suffix only now, so that a lookup never matches the suffix itself.
                if pending is not None:
                    table[pending[0]] = pending[1]
                pending = (tuple(toks[e - n : e]), e)
            self._pending[n] = pending

    def lookup(self, max_tokens: int) -> tuple[list[int], int]:
        """(continuation of up to ``max_tokens`` tokens, matched suffix length); ([], 0) if no match."""
        toks = self.tokens
        n_tok = len(toks)
        hi = min(self.max_match, n_tok)
        if hi < self.min_match:
            return [], 0
        # An earlier occurrence of a suffix implies one of each shorter suffix: "matched" is monotone
        # in the length, so binary search (2 look-ups at max_match 4 instead of up to 4).
        tail = tuple(toks[n_tok - hi :])
        lo, best = self.min_match - 1, -1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            pos = self._last[mid].get(tail[len(tail) - mid :])
            if pos is not None and pos < n_tok:
                lo, best = mid, pos
            else:
                hi = mid - 1
        if best < 0:
            return [], 0
        return toks[best : best + max_tokens], lo
