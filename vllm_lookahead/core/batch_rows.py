"""Policy "chain"'s per-request state above ``pool_max_batch`` rows, as arrays with one slot per request.

Why: at batch 32 the drafter's own drafting was already one compiled call per step
(``kernels.propose_rows``), but its upkeep around that call -- observing each row
(``RequestState.observe``), crediting the last draft to the acceptance table and to the request's
history, gathering the rows' tokens and the memory's new output, turning the outputs into lists -- was
Python per row: ~6 us per row warm and ~20 us inside the engine (cold caches), 8% of a batch-32 step on
an AVX-512 host.  Here the same state lives in numpy arrays indexed by a slot per request, the
engine's token rows are read in place, and a step is one compiled call (``kernels.chain_step``:
observe, count the new output into the memory, draft, keep the drafts) taking a few packed arrays --
right after a forward pass every call and numpy operation costs tens of microseconds on cold caches,
so their number, not the arithmetic, is the proposer's cost.  What is left per row in Python is
appending the new output to the memory's segment (the memory evicts whole segments: it keeps their
tokens) and slicing the draft list vLLM wants; a step whose output makes the memory evict or grow
goes on with ``SuffixMemory.extend_slots`` (the row-by-row semantics) and ``kernels.propose_slots``.

The slow path (``RequestState`` and ``propose_chain``, with LADE's pool and Jacobi iterate at batch
sizes up to ``pool_max_batch``) stays the reference: ``LookaheadDrafter.step_arrays`` drafts exactly
what ``LookaheadDrafter.step`` drafts for the same rows (tests/core/test_chain.py), and a request moves
between the two exactly -- ``export`` hands a slot's state to a ``RequestState`` when the batch shrinks,
``import_state`` takes it back when it grows.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable

import numpy as np

from .state import SOURCE_CONTEXT, SOURCE_JACOBI, SOURCE_NONE, SOURCE_POOL, RequestState

SOURCE_MEMORY = "memory"  # (core.chain's name; imported from there it would be a cycle)
# a slot's source as a number: the first three are kernels.SRC_NONE / SRC_CONTEXT / SRC_MEMORY; pool and
# Jacobi only arrive with a request whose last draft was made on the slow path
SOURCES = (SOURCE_NONE, SOURCE_CONTEXT, SOURCE_MEMORY, SOURCE_POOL, SOURCE_JACOBI)
SOURCE_INDEX = {name: i for i, name in enumerate(SOURCES)}


class BatchRows:
    """Slots of per-request arrays (``start`` .. ``stats``) for the requests policy "chain" drafts for
    above ``pool_max_batch`` rows; ``active`` maps the last step's request ids to their slots,
    ``dormant`` keeps the slots of requests that left the batch (finished or preempted), most recent
    last, up to the drafter's ``max_dormant_requests``."""

    def __init__(self, k: int, capacity: int = 64) -> None:
        self.k = k
        self.active: dict[str, int] = {}
        self.dormant: OrderedDict[str, int] = OrderedDict()
        self.keys: list[Hashable] = []  # isolation key per slot
        # the slow path's state of a request that moved here: kept for its pool and trajectories, and
        # handed back with the slot's state if the batch shrinks again
        self.parked: dict[str, RequestState] = {}
        self._free: list[int] = []
        self.capacity = 0
        self._grow(capacity)

    INTS = ("start", "seen", "memseen", "plen", "kid", "seglen", "last_len", "last_src")  # rows of `ints`

    def _grow(self, capacity: int) -> None:
        """Room for ``capacity`` slots.  The per-slot fields are rows of a few arrays (``ints``, ``floats``,
        ``lastk``: the kernel call takes 6 arrays, not 15) with a name per row (views)."""
        old, k = self.capacity, self.k

        def grown(name: str, shape: tuple[int, ...], dtype: type, axis: int) -> np.ndarray:
            new = np.zeros(shape, dtype=dtype)
            if old:
                index = (slice(None),) * axis + (slice(0, old),)
                new[index] = getattr(self, name)
            return new

        i64 = np.int64
        self.ints = grown("ints", (len(self.INTS), capacity), i64, 1)
        self.floats = grown("floats", (2, capacity), np.float64, 1)  # rows: hist_a, hist_e
        self.lastk = grown("lastk", (2, capacity, k), i64, 1)  # rows: last_tok, last_cells
        self.last_p = grown("last_p", (capacity, k), np.float64, 0)
        self.stats = grown("stats", (capacity, len(SOURCES), 2), i64, 0)  # drafted, accepted per source
        for i, name in enumerate(self.INTS):
            setattr(self, name, self.ints[i])
        self.hist_a, self.hist_e = self.floats
        self.last_tok, self.last_cells = self.lastk
        self.keys.extend([None] * (capacity - old))
        self._free.extend(range(capacity - 1, old - 1, -1))  # lowest slot first
        self.capacity = capacity

    def new_slot(self, key: Hashable, prompt_len: int, kid: int, seglen: int = 0) -> int:
        """A fresh slot: nothing seen yet (the first step indexes from the prompt's tail); ``seglen``: the
        request's output tokens the memory holds already (its segment, ``SuffixMemory.segment_length``)."""
        if not self._free:
            self._grow(2 * self.capacity)
        s = self._free.pop()
        self.start[s] = self.seen[s] = self.memseen[s] = self.last_len[s] = self.last_src[s] = 0
        self.hist_a[s] = self.hist_e[s] = 0.0
        self.stats[s] = 0
        self.plen[s], self.kid[s], self.seglen[s], self.keys[s] = prompt_len, kid, seglen, key
        return s

    def retire(self, req_ids: Iterable[str], limit: int) -> None:
        """``req_ids`` left the batch (finished or preempted): their slots become dormant, the most
        recent last; beyond ``limit`` dormant slots the oldest are released (with their parked state)."""
        for rid in req_ids:
            self.dormant[rid] = self.active.pop(rid)
        while len(self.dormant) > limit:
            rid, slot = self.dormant.popitem(last=False)
            self.parked.pop(rid, None)
            self.release(slot)

    def segment_gone(self, req_id: object) -> None:
        """The memory evicted (or forgot) ``req_id``'s output: its next output starts a new segment."""
        s = self.slot_of(req_id)  # type: ignore[arg-type]
        if s is not None:
            self.seglen[s] = 0

    def release(self, s: int) -> None:
        self.keys[s] = None
        self._free.append(s)

    def slot_of(self, req_id: str) -> int | None:
        s = self.active.get(req_id)
        return self.dormant.get(req_id) if s is None else s

    def pop(self, req_id: str) -> int | None:
        """Take ``req_id``'s slot out of ``active``/``dormant`` (not released: the caller decides)."""
        s = self.active.pop(req_id, None)
        return self.dormant.pop(req_id, None) if s is None else s

    def import_state(self, st: RequestState, kid: int, seglen: int) -> int:
        """A slot holding what ``st`` (the slow path's state of a request) knows: its committed tokens
        (the index covers ``seen - len(index) .. seen``), output already in the memory, history and last
        draft -- so that the next step credits that draft exactly as ``st.observe`` would have."""
        s = self.new_slot(st.isolation_key, st.prompt_len, kid, seglen)
        self.seen[s] = st.seen
        self.start[s] = st.seen - len(st.index.tokens)
        self.memseen[s] = st.memory_seen
        self.hist_a[s], self.hist_e[s] = st.hist_accepted, st.hist_expected
        n = len(st.last_draft)
        if n and st.last_source in SOURCE_INDEX and len(st.last_cells) == n:
            self.last_len[s], self.last_src[s] = n, SOURCE_INDEX[st.last_source]
            self.last_tok[s, :n], self.last_cells[s, :n], self.last_p[s, :n] = st.last_draft, st.last_cells, st.last_p
        return s

    def export(self, s: int, st: RequestState, context: np.ndarray) -> None:
        """Hand slot ``s``'s state to ``st`` (the slow path's state of the same request, new or parked):
        its index catches up to the slot's committed tokens (``context``: the request's token row), the
        history, memory position and last draft carry over, and the slot's counts join ``st.stats``."""
        seen = int(self.seen[s])
        if seen > st.seen:
            start = st.seen if st.seen else int(self.start[s])
            st.index.extend(np.asarray(context[start:seen]))
            st.seen = seen
        st.memory_seen = int(self.memseen[s])
        st.hist_accepted, st.hist_expected = float(self.hist_a[s]), float(self.hist_e[s])
        n = int(self.last_len[s])
        st.last_draft = self.last_tok[s, :n].tolist()
        st.last_cells, st.last_p = self.last_cells[s, :n].tolist(), self.last_p[s, :n].tolist()
        st.last_source = SOURCES[int(self.last_src[s])]
        st.jacobi = []
        for i, name in enumerate(SOURCES):
            drafted, accepted = (int(x) for x in self.stats[s, i])
            if drafted:
                tot = st.stats.by_source.setdefault(name, [0, 0])
                tot[0] += drafted
                tot[1] += accepted
                st.stats.drafted += drafted
                st.stats.accepted += accepted

    def by_source(self) -> dict[str, list[int]]:
        """Drafted and accepted tokens per source over the slots in use (active and dormant)."""
        used = list(self.active.values()) + list(self.dormant.values())
        tot = self.stats[used].sum(axis=0) if used else np.zeros((len(SOURCES), 2), dtype=np.int64)
        return {name: [int(d), int(a)] for name, (d, a) in zip(SOURCES, tot) if d}
