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
        # called with a segment's id when it is evicted or forgotten (the drafter's batch path keeps
        # each running request's segment length: core/batch_rows.py)
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
        # node fields as the rows of one array (the batch step passes it as one argument: core/batch_rows.py)
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
        # the arguments every count passes to the kernel, bound once (17 attribute reads per call otherwise)
        self._tables = (self._nk, self._ntot, self._nbest, self._nbestc, self._nfirst, self._ck, self._cc,
                        self._ctok, self._cnext, self._meta)
        self._used_bound = 0  # >= used node and child slots (meta[1:]), kept in Python: read meta rarely

    def __len__(self) -> int:
        """Stored output tokens (all keys)."""
        return self.tokens

    def num_contexts(self) -> int:
        """Stored contexts (suffix-tree nodes) that some stored output still follows, all keys."""
        return int(self._meta[0])

    def lookup_tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
        """What a compiled look-up reads (``kernels.memory_lookup``): node keys, totals, most frequent next
        token and its count, and the depth.  Valid until the next extend (a rebuild replaces them)."""
        return self._nk, self._ntot, self._nbest, self._nbestc, self.depth

    def packed_tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The tables as ``kernels.chain_step`` takes them: node keys, node fields (4 rows), child keys,
        child fields (3 rows), meta; valid until the next rebuild."""
        return self._nk, self._nodes, self._ck, self._children, self._meta

    def _count(self, kid: int, arr: np.ndarray, base: int, start: int, end: int, sign: int) -> None:
        load_kernels().memory_add(*self._tables, kid, arr, base, start, end, self.depth, sign)

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
            self._count(self._kids[key], np.asarray(toks, dtype=np.int32), 0, 0, len(toks), 1)

    def extend(self, seg_id: Hashable, key: Hashable, new_tokens: Sequence[int]) -> None:
        """Append ``new_tokens`` to the output segment ``seg_id`` (created on first use) under ``key``."""
        if self.max_tokens == 0 or not len(new_tokens):
            return
        new = new_tokens if isinstance(new_tokens, list) else [int(t) for t in new_tokens]
        entry = self._segments.get(seg_id)
        prev = entry[1][-self.depth :] if entry else []
        seq = prev + new  # the segment's last `depth` tokens give the new tokens their contexts
        self._extend_row(np.asarray(seq, dtype=np.int32), seg_id, key, seq, 0, len(prev))

    def _extend_row(self, flat: np.ndarray, seg_id: Hashable, key: Hashable, tokens: list[int], off: int,
                    lo: int) -> None:
        """``extend(seg_id, key, tokens[lo:])``, where ``flat[off:off + len(tokens)]`` (int32) holds the same
        tokens as ``tokens`` and the segment so far ends with ``tokens[:lo]`` (e.g. a request's token row):
        counted straight from that array.  Tables grown before, the oldest segments evicted after, as the
        token budget requires (a rebuild reads the segments: their tokens are all counted by then)."""
        if self.max_tokens == 0 or lo >= len(tokens):
            return
        grow = self.depth * (len(tokens) - lo)  # at most this many new nodes, and as many new children
        if 2 * (self._used_bound + grow) > len(self._nk):  # keep the load <= 1/2
            self._used_bound = self._used_slots()  # the bound drifts up: re-read
            if 2 * (self._used_bound + grow) > len(self._nk):
                self._rebuild(grow)
                self._used_bound = self._used_slots()
        toks = self._segment(seg_id, key)
        row = np.array(((self.kid_for(key),), (off + lo - min(len(toks), self.depth, lo),), (off + lo,),
                        (off + len(tokens),)), dtype=np.int64)
        toks.extend(tokens[lo:])
        self._used_bound += grow
        self.tokens += len(tokens) - lo
        load_kernels().memory_add_rows(*self._tables, row[0], flat, row[1], row[2], row[3], self.depth, 1)
        while self.tokens > self.max_tokens and self._segments:  # counted first: eviction subtracts it
            self._evict_oldest()

    def kid_for(self, key: Hashable) -> int:
        """The integer an isolation key's hashes mix in, assigned now if the key is new."""
        kid = self._kids.get(key)
        if kid is None:
            kid = self._kids[key] = len(self._kids)
        return kid

    def extend_slots(self, tokens: np.ndarray, rows: np.ndarray, kids: np.ndarray, los: np.ndarray, his: np.ndarray,
                     floors: np.ndarray, seg_ids: list[Hashable], keys: list[Hashable],
                     news: list[list[int]]) -> None:
        """``extend`` for the engine's token rows (``core.batch_rows``), the drafter's path when the memory
        must evict or grow (``kernels.chain_step`` counts the other steps itself): entry ``i`` appends
        ``tokens[rows[i], los[i]:his[i]]`` (non-empty) to segment ``seg_ids[i]`` under ``keys[i]``
        (``kids[i]`` = ``kid_for(keys[i])``), contexts reaching no further back than ``floors[i]`` (where
        the request's tokens are read from); ``news[i]`` holds the same tokens as a list when it is
        as long (vLLM's sampled tokens), which saves converting them.

        The same counts, evictions and rebuilds as one ``extend`` per entry: the entries before the
        first one after which the memory must evict, or before which its tables must grow, are counted
        in one kernel call (found with a cumulative sum, not a Python loop); that entry goes through
        ``extend``'s own path; and on from the next.  Once the memory is full an eviction comes every
        few steps (a whole segment at a time), so most steps are one call."""
        if self.max_tokens == 0 or not len(rows):
            return
        depth = self.depth
        cum = np.cumsum(his - los)
        n, i = len(rows), 0
        while i < n:
            done = int(cum[i - 1]) if i else 0
            # entries up to `stop` need no growth (2 * (used + depth * new) <= slots) and no eviction
            room_g = (len(self._nk) - 2 * self._used_bound) // (2 * depth)
            room_e = self.max_tokens - self.tokens
            stop = int(min(np.searchsorted(cum, done + room_g, side="right"),
                           np.searchsorted(cum, done + room_e, side="right")))
            if stop > i:
                self._count_slots(tokens, rows, kids, los, his, floors, seg_ids, keys, news, i, stop)
                self._used_bound += depth * (int(cum[stop - 1]) - done)
                self.tokens += int(cum[stop - 1]) - done
                i = stop
            if i < n:  # entry i grows the tables first or evicts after it: the row-by-row path
                r, f = int(rows[i]), int(floors[i])
                self._extend_row(tokens[r], seg_ids[i], keys[i], tokens[r, f : int(his[i])].tolist(), f,
                                 int(los[i]) - f)
                i += 1

    def _count_slots(self, tokens: np.ndarray, rows: np.ndarray, kids: np.ndarray, los: np.ndarray, his: np.ndarray,
                     floors: np.ndarray, seg_ids: list[Hashable], keys: list[Hashable], news: list[list[int]],
                     i: int, stop: int) -> None:
        """Entries ``i:stop`` of ``extend_slots``: into their segments, and counted in one kernel call --
        each entry's contexts reaching back over at most ``depth`` of its segment's earlier tokens, not
        before ``floors[i]``."""
        depth, bases = self.depth, []
        for sid, key, new, r, lo, hi, f in zip(seg_ids[i:stop], keys[i:stop], news[i:stop], rows[i:stop].tolist(),
                                               los[i:stop].tolist(), his[i:stop].tolist(), floors[i:stop].tolist()):
            toks = self._segment(sid, key)
            bases.append(lo - min(len(toks), depth, lo - f))
            toks.extend(new if len(new) == hi - lo else tokens[r, lo:hi].tolist())
        load_kernels().memory_add_slots(*self._tables, kids[i:stop], tokens, rows[i:stop],
                                        np.array(bases, dtype=np.int64), los[i:stop], his[i:stop], self.depth, 1)

    def append_outputs(self, tokens: np.ndarray, seg_ids: list[Hashable], keys_by_slot: list[Hashable],
                       slots: list[int], news: list[list[int]], los: list[int], his: list[int]) -> None:
        """Append a whole batch's output that ``kernels.chain_step`` already counted in the tables (within
        the ``room()`` it was given): row ``r`` appends ``tokens[r, los[r]:his[r]]`` (nothing if empty;
        ``news[r]`` if it is as long) to segment ``seg_ids[r]`` under ``keys_by_slot[slots[r]]``, and the
        token budget books them.  Plain lists in, no numpy per row."""
        added = 0
        for r, (lo, hi) in enumerate(zip(los, his)):
            if hi > lo:
                new = news[r]
                self._segment(seg_ids[r], keys_by_slot[slots[r]]).extend(
                    new if len(new) == hi - lo else tokens[r, lo:hi].tolist())
                added += hi - lo
        self.tokens += added
        self._used_bound += self.depth * added

    def room(self) -> int:
        """How many more output tokens fit without an eviction or a table rebuild (``extend_slots``)."""
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
        self._count(self._kids[key], np.asarray(toks, dtype=np.int32), 0, 0, len(toks), -1)
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

    def forget(self, seg_id: Hashable) -> None:
        """Drop one segment now (e.g. an aborted request whose output should not be reused)."""
        if seg_id in self._segments:
            self._segments.move_to_end(seg_id, last=False)
            self._evict_oldest()
