"""The n-gram pool of one request: key token -> up to G continuations of N-1 tokens, most recent first.

Seeded from the prompt, the committed output and the Jacobi trajectories of verification passes
(LADE's pool).  Memory is bounded twice: G continuations per key (LRU) and ``max_keys`` keys per
request (LRU over keys), so a long request cannot grow without limit.
"""

from __future__ import annotations

from collections import OrderedDict


class NGramPool:
    def __init__(self, ngram: int, pool_size: int, max_keys: int):
        self.n = ngram
        self.g = pool_size
        self.max_keys = max_keys
        self._pool: OrderedDict[int, list[tuple[int, ...]]] = OrderedDict()

    def __len__(self) -> int:
        return sum(len(v) for v in self._pool.values())

    @property
    def num_keys(self) -> int:
        return len(self._pool)

    def add(self, key: int, cont: tuple[int, ...]) -> None:
        """Insert (or refresh) a continuation of exactly N-1 tokens for ``key``."""
        if len(cont) != self.n - 1:
            raise ValueError(f"continuation must have {self.n - 1} tokens, got {len(cont)}")
        self._add(key, cont)

    def _add(self, key: int, cont: tuple[int, ...]) -> None:
        pool = self._pool
        entries = pool.get(key)
        if entries is None:
            pool[key] = [cont]
            if len(pool) > self.max_keys:
                pool.popitem(last=False)
            return
        pool.move_to_end(key)
        if entries[0] == cont:  # already the most recent (repeated text): nothing moves
            return
        if cont in entries:
            entries.remove(cont)
        entries.insert(0, cont)
        del entries[self.g :]

    def add_sequence(self, tokens: list[int] | tuple[int, ...], start: int = 0) -> None:
        """Index every N-gram of ``tokens`` that ends at or after position ``start + N - 1``."""
        n = self.n
        toks = [int(t) for t in tokens] if not isinstance(tokens, list) else tokens
        add = self._add
        for i in range(max(0, start), len(toks) - n + 1):
            add(toks[i], tuple(toks[i + 1 : i + n]))

    def get(self, key: int) -> list[tuple[int, ...]]:
        """Continuations for ``key``, most recent first (empty list if none)."""
        return self._pool.get(key, [])
