"""Prompt-lookup over a request's committed tokens: find the most recent earlier occurrence of the
longest suffix (``max_match`` down to ``min_match`` tokens) and return what followed it.

Kept incremental (a dict per suffix length: n-gram -> end position of its latest occurrence), so each
step costs O(new tokens x levels) instead of rescanning the whole context like a KMP search would.

An n-gram's key is its tokens packed into one int (``SHIFT`` bits per token, the last token lowest),
rolled forward one token at a time.  Why not tuples: a tuple per token and level is an allocation the
garbage collector tracks and a hash over n items, on the proposer's per-step path for every request;
an int key is one shift-or-mask and is exact -- no collisions -- for token ids below 2**SHIFT (vLLM
keeps token ids in int32).
"""

from __future__ import annotations

SHIFT = 32


class ContextIndex:
    def __init__(self, min_match: int, max_match: int):
        self.min_match = min_match
        self.max_match = max_match
        self.tokens: list[int] = []
        levels = range(min_match, max_match + 1)
        # _last[j][key] = index just past the most recent occurrence (not the suffix) of the n-gram of
        # level n = min_match + j
        self._last: list[dict[int, int]] = [{} for _ in levels]
        self._masks = [(1 << (SHIFT * n)) - 1 for n in levels]
        self._pending_key = [0 for _ in levels]  # the suffix, registered only once a token follows it
        self._pending_end = [-1 for _ in levels]
        self._roll = 0  # the last max_match tokens, packed

    def extend(self, new_tokens: list[int]) -> None:
        toks = self.tokens
        start = len(toks)
        toks.extend(new_tokens if isinstance(new_tokens, list) else [int(t) for t in new_tokens])
        end = len(toks)
        lo_n = self.min_match
        tables, masks = self._last, self._masks
        pkey, pend = self._pending_key, self._pending_end
        full = masks[-1]
        roll = self._roll
        for e in range(start + 1, end + 1):
            roll = ((roll << SHIFT) | toks[e - 1]) & full
            for j in range(min(e - lo_n + 1, len(tables))):  # levels whose n-gram fits in e tokens
                # Register the previous suffix only now, so that a lookup never matches the suffix itself.
                if pend[j] >= 0:
                    tables[j][pkey[j]] = pend[j]
                pkey[j] = roll & masks[j]
                pend[j] = e
        self._roll = roll

    def lookup(self, max_tokens: int) -> tuple[list[int], int]:
        """(continuation of up to ``max_tokens`` tokens, matched suffix length); ([], 0) if no match."""
        toks = self.tokens
        n_tok = len(toks)
        hi = min(self.max_match, n_tok)
        if hi < self.min_match:
            return [], 0
        # An earlier occurrence of a suffix implies one of each shorter suffix: "matched" is monotone
        # in the length, so binary search (2 look-ups at max_match 4 instead of up to 4).
        roll, base = self._roll, self.min_match
        lo, best = base - 1, -1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            pos = self._last[mid - base].get(roll & self._masks[mid - base])
            if pos is not None and pos < n_tok:
                lo, best = mid, pos
            else:
                hi = mid - 1
        if best < 0:
            return [], 0
        return toks[best : best + max_tokens], lo
