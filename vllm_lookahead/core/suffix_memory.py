"""Engine-wide memory of earlier outputs: longest-suffix match with frequencies, bounded, isolated.

A model repeats its own output across requests (boilerplate, idioms, the answer to a popular prompt);
vLLM's suffix decoding (arctic-inference's ``SuffixDecodingCache``) exploits that with a suffix tree
over earlier responses, drafting the most frequent continuation of the longest matching suffix and
stopping where a token's estimated probability (child count / parent count) falls below a floor.
This is the same idea with flat hash tables:

* for every output token t and every context length m = 1..``depth``, the m tokens before t are a
  *context*; a node per context holds how often it was followed by anything (``total``) and its most
  frequent next token (``best``, with its count); a child entry per (context, next token) holds that
  pair's count -- a suffix-tree node and its children's counts;
* a lookup tries the longest context first (``depth`` down to 1), then walks greedily: the most
  frequent child, its probability count/(total+1), and on with the context shifted by that token;
* **bounded by tokens**: every output is stored once as a segment; when the stored tokens exceed
  ``max_tokens`` the oldest segments are evicted (their counts subtracted), FIFO like arctic's cache;
* **isolated**: every context is keyed by an isolation key (LoRA adapter, tenant, ...) -- a request
  only ever matches outputs stored under its own key, so one tenant's outputs never steer another
  tenant's drafts (and cannot leak through them).

Only outputs are stored (never prompts: they are the client's data, not the model's habits).

Why compiled (numba, core/kernels.py) open-addressing tables: the memory is extended with every committed token of
every request, ``depth`` contexts per token, on the proposer's per-step path.  As Python dicts keyed by
packed contexts that was the largest part of the proposer's time at batch 32 (a 128-bit
packed key per context is a big-int allocation per operation).  Keys here are 64-bit hashes of
(isolation key, context): two contexts colliding is ~n^2/2^64 unlikely, and would only cost a
rejected draft token -- verification, not the memory, decides what is committed.

Each node also lists its children (a linked list through the child table), so eviction stays exact:
when a node's most frequent child loses counts, the node's children are compared again.  Entries are
never removed from the tables (a context no output follows any more has a zero count and is treated as
unseen); when the tables fill they are rebuilt from the surviving segments, which drops the dead ones.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

import numpy as np

from .jit import load_kernels


class SuffixMemory:
    """Counts of next tokens after every context of up to ``depth`` output tokens, per isolation key."""

    _MIN_SLOTS = 1 << 10
    _MAX_FIRST_SLOTS = 1 << 16

    def __init__(self, max_tokens: int, depth: int = 6) -> None:
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        if not 1 <= depth <= 32:
            raise ValueError(f"depth must be in 1..32, got {depth}")
        self.max_tokens = max_tokens
        self.depth = depth
        self._kids: dict[Hashable, int] = {}  # isolation key -> the integer mixed into its hashes
        # segment id -> [isolation key, tokens]
        self._segments: OrderedDict[Hashable, list] = OrderedDict()
        self.tokens = 0
        # called with a segment's id when it is evicted or forgotten (the drafter keeps each running
        # request's segment length: core/batch_rows.py)
        self.on_evict: Callable[[Hashable], None] | None = None
        self._probs = np.empty(16, dtype=np.float64)  # lookup scratch: probabilities, context + draft
        self._scratch = np.empty(depth + 16, dtype=np.int32)
        # sized for about a quarter of a full memory's contexts (<= 64k slots, ~2.9 MB): a growing
        # memory is rebuilt a few times, not once per doubling from the smallest size
        slots = self._MIN_SLOTS
        while slots < min(depth * max_tokens // 4, self._MAX_FIRST_SLOTS):
            slots <<= 1
        self._alloc(slots)

    def _alloc(self, slots: int) -> None:
        i32 = np.int32  # counts stay below max_tokens (<= 1e8), slots and token ids below 2**31
        self._nk = np.zeros(slots, dtype=np.uint64)  # node keys (0 = empty slot)
        # node fields as the rows of one array (the kernels take it as one argument: kernels.chain_step)
        self._nodes = np.zeros((4, slots), dtype=i32)
        self._ntot = self._nodes[0]  # times the context was followed by a token
        self._nbest = self._nodes[1]  # its most frequent next token ...
        self._nbestc = self._nodes[2]  # ... and that token's count
        self._nfirst = self._nodes[3]  # its newest child's slot (-1: none)
        self._nfirst[:] = -1
        self._ck = np.zeros(slots, dtype=np.uint64)  # child keys: hash of (node key, next token)
        self._children = np.zeros((3, slots), dtype=i32)
        self._cc = self._children[0]  # child counts
        self._ctok = self._children[1]  # child tokens
        self._cnext = self._children[2]  # the next (older) child of the same node
        self._cnext[:] = -1
        self._meta = np.zeros(3, dtype=np.int64)  # live nodes, used node slots, used child slots
        self._used_bound = 0  # >= used node and child slots (meta[1:]), kept in Python: read meta rarely

    def __len__(self) -> int:
        """Stored output tokens (all keys)."""
        return self.tokens

    def num_contexts(self) -> int:
        """Stored contexts (suffix-tree nodes) that some stored output still follows, all keys."""
        return int(self._meta[0])

    def packed_tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The tables as the kernels take them (``kernels.memory_count``, ``kernels.chain_step``): node
        keys, node fields (4 rows), child keys, child fields (3 rows), meta; valid until the next rebuild."""
        return self._nk, self._nodes, self._ck, self._children, self._meta

    def _count_segment(self, key: Hashable, toks: list[int], sign: int) -> None:
        """Count (``sign`` +1) or uncount (-1) a whole stored segment: a rebuild, an eviction."""
        one, zero = np.ones(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
        load_kernels().memory_count(*self.packed_tables(), self._kids[key] * one, np.asarray([toks], dtype=np.int32),
                                    zero, zero, len(toks) * one, self.depth, sign)

    def _used_slots(self) -> int:
        """Node or child slots in use, whichever is more (the kernel's counts; entries are never freed
        before a rebuild)."""
        return int(max(self._meta[1], self._meta[2]))

    def _rebuild(self, room: int) -> None:
        """Fresh tables sized for the surviving segments plus ``room`` new entries (load <= 1/4),
        refilled from the segments: entries no stored output follows any more are dropped."""
        need = 4 * (self._used_slots() + room)  # used now >= live after the rebuild
        slots = self._MIN_SLOTS
        while slots < need:
            slots <<= 1
        self._alloc(slots)
        for key, toks in self._segments.values():
            self._count_segment(key, toks, 1)

    def add(self, seg_ids: Sequence[Hashable], keys: Sequence[Hashable], tokens: np.ndarray, los: Sequence[int],
            his: Sequence[int], floors: Sequence[int], news: Sequence[Sequence[int]] | None = None,
            counted: bool = False) -> None:
        """Store new output: entry ``i`` appends ``tokens[i, los[i]:his[i]]`` (nothing if empty) to the
        segment ``seg_ids[i]`` (created on first use) under the isolation key ``keys[i]``.  ``tokens[i]``
        holds the segment's earlier tokens right before ``los[i]``, from ``floors[i]`` on (a request's
        token row: its output follows its prompt), and the new tokens' contexts reach back over at most
        ``depth`` of them.  ``news[i]``: the same tokens as a list where it is as long (vLLM's sampled
        tokens: saves converting them).  ``counted``: ``kernels.chain_step`` counted them already (within
        ``room()``): into the segments and the token budget only.

        The memory's one way in.  The same counts, evictions and rebuilds as one entry at a time -- the
        tables grown before an entry that would fill them past half, the oldest segments evicted after
        one that takes the memory past ``max_tokens`` -- in one kernel call (``kernels.memory_count``)
        for the entries between two such points: once the memory is full an eviction comes every few
        steps (a whole segment at a time), so most steps are one call."""
        if self.max_tokens == 0:
            return
        depth = self.depth
        # the entries to count next (rows: key id, context base, from, to); none when counted already
        marks = None if counted else np.zeros((4, len(los)), dtype=np.int64)
        pending, room = 0, (float("inf") if counted else self.room())  # (pending: their new tokens)
        for i, (lo, hi) in enumerate(zip(los, his)):
            if hi <= lo:
                continue
            alone = pending + hi - lo > room  # this entry grows the tables first or evicts after it
            if alone:
                self._flush(marks, tokens, pending)  # (a rebuild reads the segments: counted first)
                pending = 0
                grow = depth * (hi - lo)  # at most this many new nodes, and as many new children
                if 2 * (self._used_bound + grow) > len(self._nk):  # keep the load <= 1/2
                    self._used_bound = self._used_slots()  # the bound drifts up: re-read
                    if 2 * (self._used_bound + grow) > len(self._nk):
                        self._rebuild(grow)
                        self._used_bound = self._used_slots()
            toks = self._segment(seg_ids[i], keys[i])
            if marks is not None:
                marks[:, i] = self.kid_for(keys[i]), lo - min(len(toks), depth, lo - floors[i]), lo, hi
            toks.extend(news[i] if news is not None and len(news[i]) == hi - lo else tokens[i, lo:hi].tolist())
            pending += hi - lo
            if alone:
                self._flush(marks, tokens, pending)
                pending = 0
                while self.tokens > self.max_tokens and self._segments:  # counted first: eviction subtracts it
                    self._evict_oldest()
                room = self.room()
        self._flush(marks, tokens, pending)

    def _flush(self, marks: np.ndarray | None, tokens: np.ndarray, new: int) -> None:
        """``add``: count the ``new`` tokens of the entries ``marks`` holds (None: counted already), book
        them, and unmark the entries."""
        if new:
            if marks is not None:
                load_kernels().memory_count(*self.packed_tables(), marks[0], tokens, marks[1], marks[2], marks[3],
                                            self.depth, 1)
                marks[3] = marks[2]
            self.tokens += new
            self._used_bound += self.depth * new

    def kid_for(self, key: Hashable) -> int:
        """The integer an isolation key's hashes mix in, assigned now if the key is new."""
        kid = self._kids.get(key)
        if kid is None:
            kid = self._kids[key] = len(self._kids)
        return kid

    def room(self) -> int:
        """How many more output tokens fit without an eviction or a table rebuild (``add``)."""
        return min(self.max_tokens - self.tokens, (len(self._nk) - 2 * self._used_bound) // (2 * self.depth))

    def segment_length(self, seg_id: Hashable) -> int:
        """Output tokens stored in segment ``seg_id`` (0: none)."""
        entry = self._segments.get(seg_id)
        return len(entry[1]) if entry is not None else 0

    def _segment(self, seg_id: Hashable, key: Hashable) -> list[int]:
        entry = self._segments.get(seg_id)
        if entry is None:
            entry = self._segments[seg_id] = [key, []]
        elif entry[0] != key:
            raise ValueError(f"segment {seg_id!r} was started under another isolation key")
        return entry[1]

    def _evict_oldest(self) -> None:
        seg_id, (key, toks) = self._segments.popitem(last=False)
        if self.on_evict is not None:
            self.on_evict(seg_id)
        self._count_segment(key, toks, -1)
        self.tokens -= len(toks)

    def lookup(self, key: Hashable, context: Sequence[int], max_tokens: int,
               min_prob: float = 0.0) -> tuple[list[int], list[float], int]:
        """Greedy walk from the longest suffix of ``context`` stored under ``key``.

        Returns (tokens, frequency of each token given the previous ones (count / (context total + 1)),
        matched context length); ([], [], 0) when no suffix of ``context`` was ever followed by output.
        Stops at ``max_tokens`` tokens or before a token whose probability is below ``min_prob``."""
        return self.lookup_from(key, np.asarray(list(context[-self.depth :]), dtype=np.int32), None, max_tokens,
                                min_prob)

    def lookup_from(self, key: Hashable, buf: np.ndarray, n: int | None, max_tokens: int,
                    min_prob: float = 0.0) -> tuple[list[int], list[float], int]:
        """``lookup`` of the context ``buf[:n]`` (int32; all of ``buf`` if ``n`` is None) -- a request's
        token buffer, read in place."""
        kid = self._kids.get(key)
        if max_tokens <= 0 or kid is None or not self.tokens:
            return [], [], 0
        if len(self._probs) < max_tokens:
            self._probs = np.empty(max_tokens, dtype=np.float64)
            self._scratch = np.empty(self.depth + max_tokens, dtype=np.int32)
        out, matched, at = load_kernels().memory_lookup(self._nk, self._ntot, self._nbest, self._nbestc, kid, buf,
                                   len(buf) if n is None else n, self.depth, max_tokens, min_prob,
                                   self._scratch, self._probs)
        if not out:
            return [], [], 0
        return self._scratch[at : at + out].tolist(), self._probs[:out].tolist(), int(matched)
