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

A context is one int: its tokens packed ``SHIFT`` bits each (the last token lowest) under a marker bit
that encodes its length, rolled forward token by token.  Why: the memory is extended with every
committed token of every request, ``depth`` contexts per token; as tuples that was a tuple per context
(allocated, hashed over m items, tracked by the garbage collector) and two thirds of policy "cost"'s
proposer time at batch 32 (benchmarks/proposer_cost.py).  Packing is exact -- no collisions -- for
token ids below 2**SHIFT (vLLM keeps them in int32), and each isolation key has its own dict.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

from .context_index import SHIFT  # one token-packing width for every packed key in core/


def _pack(tokens: Sequence[int]) -> int:
    """The tokens packed, the last lowest (without the length marker)."""
    v = 0
    for t in tokens:
        v = (v << SHIFT) | int(t)
    return v


class SuffixMemory:
    """Counts of next tokens after every context of up to ``depth`` output tokens, per isolation key."""

    def __init__(self, max_tokens: int, depth: int = 6) -> None:
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        if not 1 <= depth <= 32:
            raise ValueError(f"depth must be in 1..32, got {depth}")
        self.max_tokens = max_tokens
        self.depth = depth
        # key -> {packed context: {next token: count}}; the sum of the counts is kept under None and the
        # most frequent next token under -1 (token ids are >= 0), so a walk never scans a node's children
        self._children: dict[Hashable, dict[int, dict[int | None, int]]] = {}
        # segment id -> [key, tokens, packed last `depth` tokens]
        self._segments: OrderedDict[Hashable, list] = OrderedDict()
        self._masks = [0] + [(1 << (SHIFT * m)) - 1 for m in range(1, depth + 1)]
        self._marks = [1 << (SHIFT * m) for m in range(depth + 1)]  # length marker of an m-token context
        self.tokens = 0

    def __len__(self) -> int:
        """Stored output tokens (all keys)."""
        return self.tokens

    def num_contexts(self) -> int:
        """Stored contexts (suffix-tree nodes), all keys."""
        return sum(len(nodes) for nodes in self._children.values())

    def extend(self, seg_id: Hashable, key: Hashable, new_tokens: Sequence[int]) -> None:
        """Append ``new_tokens`` to the output segment ``seg_id`` (created on first use) under ``key``."""
        if self.max_tokens == 0 or not new_tokens:
            return
        entry = self._segments.get(seg_id)
        if entry is None:
            entry = self._segments[seg_id] = [key, [], 0]
        elif entry[0] != key:
            raise ValueError(f"segment {seg_id!r} was started under another isolation key")
        toks, roll = entry[1], entry[2]
        nodes = self._children.get(key)
        if nodes is None:
            nodes = self._children[key] = {}
        depth, masks, marks = self.depth, self._masks, self._marks
        for t in new_tokens:
            t = int(t)
            for m in range(1, min(len(toks), depth) + 1):  # the m tokens before t
                ctx = (roll & masks[m]) | marks[m]
                node = nodes.get(ctx)
                if node is None:
                    nodes[ctx] = {None: 1, -1: t, t: 1}
                    continue
                node[None] += 1
                c = node[t] = node.get(t, 0) + 1
                if c > node[node[-1]]:
                    node[-1] = t
            toks.append(t)
            roll = ((roll << SHIFT) | t) & masks[depth]
        entry[2] = roll
        self.tokens += len(new_tokens)
        while self.tokens > self.max_tokens and self._segments:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        _, (key, toks, _roll) = self._segments.popitem(last=False)
        nodes = self._children[key]
        depth, masks, marks = self.depth, self._masks, self._marks
        roll = 0
        for n, t in enumerate(toks):
            for m in range(1, min(depth, n) + 1):
                ctx = (roll & masks[m]) | marks[m]
                node = nodes[ctx]
                node[None] -= 1
                if not node[None]:
                    del nodes[ctx]
                    continue
                left = node[t] - 1
                if left:
                    node[t] = left
                else:
                    del node[t]
                if node[-1] == t:  # the most frequent child lost a count: find the new one (rare)
                    node[-1] = max((k for k in node if k is not None and k >= 0), key=node.__getitem__)
            roll = ((roll << SHIFT) | t) & masks[depth]
        if not nodes:
            del self._children[key]
        self.tokens -= len(toks)

    def lookup(self, key: Hashable, context: Sequence[int], max_tokens: int,
               min_prob: float = 0.0) -> tuple[list[int], list[float], int]:
        """Greedy walk from the longest suffix of ``context`` stored under ``key``.

        Returns (tokens, frequency of each token given the previous ones (count / (context total + 1)),
        matched context length); ([], [], 0) when no suffix of ``context`` was ever followed by output.
        Stops at ``max_tokens`` tokens or before a token whose probability is below ``min_prob``."""
        nodes = self._children.get(key)
        if max_tokens <= 0 or not nodes:
            return [], [], 0
        depth, masks, marks = self.depth, self._masks, self._marks
        n = len(context)
        tail = context[n - depth :] if n > depth else context
        roll = _pack(tail)
        # Every suffix of a stored context is stored too, so "stored" is monotone in the length:
        # binary search for the longest (3 look-ups at depth 8 instead of up to 8).
        lo, hi, node = 0, len(tail), None
        while lo < hi:
            mid = (lo + hi + 1) // 2
            found = nodes.get((roll & masks[mid]) | marks[mid])
            if found is not None:
                lo, node = mid, found
            else:
                hi = mid - 1
        if node is None:
            return [], [], 0
        matched = length = lo
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
            roll = ((roll << SHIFT) | best) & masks[depth]
            length = min(length + 1, depth)
            node = nodes.get((roll & masks[length]) | marks[length])
            while node is None and length > 1:  # shorten the context until it was seen
                length -= 1
                node = nodes.get((roll & masks[length]) | marks[length])
            if node is None:
                break
        return out, probs, matched

    def forget(self, seg_id: Hashable) -> None:
        """Drop one segment now (e.g. an aborted request whose output should not be reused)."""
        if seg_id in self._segments:
            self._segments.move_to_end(seg_id, last=False)
            self._evict_oldest()
