"""Engine-wide memory of earlier outputs: longest-suffix match with frequencies, bounded, isolated.

A model repeats its own output across requests (boilerplate, idioms, the answer to a popular prompt);
vLLM's suffix decoding (arctic-inference's ``SuffixDecodingCache``) exploits that with a suffix tree
over earlier responses, drafting the most frequent continuation of the longest matching suffix and
stopping where a token's estimated probability (child count / parent count) falls below a floor.
This is the same idea with a flat structure that is cheap in Python:

* for every output token t and every context length m = 1..``depth``, the m tokens before t are a
  *context*; ``counts[(key, ctx)]`` holds how often each next token followed it (a suffix-tree node and
  its children's counts, in one dict);
* a lookup tries the longest context first (``depth`` down to 1), then walks greedily: the most
  frequent child, its probability count/total, and on with the context shifted by that token;
* **bounded by tokens**: every output is stored once as a segment; when the stored tokens exceed
  ``max_tokens`` the oldest segments are evicted (their counts subtracted), FIFO like arctic's cache;
* **isolated**: every entry is keyed by an isolation key (LoRA adapter, tenant, ...) -- a request
  only ever matches outputs stored under its own key, so one tenant's outputs never steer another
  tenant's drafts (and cannot leak through them).

Only outputs are stored (never prompts: they are the client's data, not the model's habits).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence


class SuffixMemory:
    """Counts of next tokens after every context of up to ``depth`` output tokens, per isolation key."""

    def __init__(self, max_tokens: int, depth: int = 6) -> None:
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        if not 1 <= depth <= 32:
            raise ValueError(f"depth must be in 1..32, got {depth}")
        self.max_tokens = max_tokens
        self.depth = depth
        # (key, ctx tuple) -> {next token: count}; the sum of the counts is kept under None and the most
        # frequent next token under -1 (token ids are >= 0), so a walk never scans a node's children
        self._children: dict[tuple[Hashable, tuple[int, ...]], dict[int | None, int]] = {}
        self._segments: OrderedDict[Hashable, tuple[Hashable, list[int]]] = OrderedDict()  # id -> (key, toks)
        self.tokens = 0

    def __len__(self) -> int:
        """Stored output tokens (all keys)."""
        return self.tokens

    def extend(self, seg_id: Hashable, key: Hashable, new_tokens: Sequence[int]) -> None:
        """Append ``new_tokens`` to the output segment ``seg_id`` (created on first use) under ``key``."""
        if self.max_tokens == 0 or not new_tokens:
            return
        entry = self._segments.get(seg_id)
        if entry is None:
            entry = self._segments[seg_id] = (key, [])
        elif entry[0] != key:
            raise ValueError(f"segment {seg_id!r} was started under another isolation key")
        toks = entry[1]
        children, depth = self._children, self.depth
        for t in new_tokens:
            t = int(t)
            n = len(toks)
            tail = tuple(toks[n - depth :]) if n > depth else tuple(toks)
            for m in range(1, len(tail) + 1):
                ctx = (key, tail[-m:])
                node = children.get(ctx)
                if node is None:
                    children[ctx] = {None: 1, -1: t, t: 1}
                    continue
                node[None] += 1
                c = node[t] = node.get(t, 0) + 1
                if c > node[node[-1]]:
                    node[-1] = t
            toks.append(t)
        self.tokens += len(new_tokens)
        while self.tokens > self.max_tokens and self._segments:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        _, (key, toks) = self._segments.popitem(last=False)
        children, depth = self._children, self.depth
        for n, t in enumerate(toks):
            for m in range(1, min(depth, n) + 1):
                ctx = (key, tuple(toks[n - m : n]))
                node = children[ctx]
                node[None] -= 1
                if not node[None]:
                    del children[ctx]
                    continue
                left = node[t] - 1
                if left:
                    node[t] = left
                else:
                    del node[t]
                if node[-1] == t:  # the most frequent child lost a count: find the new one (rare)
                    node[-1] = max((k for k in node if k is not None and k >= 0), key=node.__getitem__)
        self.tokens -= len(toks)

    def lookup(self, key: Hashable, context: Sequence[int], max_tokens: int,
               min_prob: float = 0.0) -> tuple[list[int], list[float], int]:
        """Greedy walk from the longest suffix of ``context`` stored under ``key``.

        Returns (tokens, frequency of each token given the previous ones (count / (context total + 1)),
        matched context length); ([], [], 0) when no suffix of ``context`` was ever followed by output.
        Stops at ``max_tokens`` tokens or before a token whose probability is below ``min_prob``."""
        if max_tokens <= 0 or not self._children:
            return [], [], 0
        children = self._children
        n = len(context)
        tail = tuple(context[n - self.depth :]) if n > self.depth else tuple(context)
        # Every suffix of a stored context is stored too, so "stored" is monotone in the length:
        # binary search for the longest (3 look-ups at depth 8 instead of up to 8).
        lo, hi, node = 0, len(tail), None
        while lo < hi:
            mid = (lo + hi + 1) // 2
            found = children.get((key, tail[-mid:]))
            if found is not None:
                lo, node = mid, found
            else:
                hi = mid - 1
        if node is None:
            return [], [], 0
        ctx = tail[-lo:]
        matched = len(ctx)
        out: list[int] = []
        probs: list[float] = []
        while True:
            best = node[-1]
            p = node[best] / (node[None] + 1)  # +1: a continuation seen once is no certainty
            if p < min_prob:
                break
            out.append(best)
            probs.append(p)
            if len(out) >= max_tokens:
                break
            ctx = (ctx + (best,))[-self.depth :]
            node = children.get((key, ctx))
            while node is None and len(ctx) > 1:  # shorten the context until it was seen
                ctx = ctx[1:]
                node = children.get((key, ctx))
            if node is None:
                break
        return out, probs, matched

    def forget(self, seg_id: Hashable) -> None:
        """Drop one segment now (e.g. an aborted request whose output should not be reused)."""
        if seg_id in self._segments:
            self._segments.move_to_end(seg_id, last=False)
            self._evict_oldest()
