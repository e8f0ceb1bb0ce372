"""The drafter's per-request state as arrays with one slot per request.

Why arrays: right after a forward pass every call and numpy operation costs tens of microseconds on cold
caches, so the number of calls, not the arithmetic, is the proposer's cost; per-request Python objects
cost microseconds per row per step.  Here the state lives in numpy arrays indexed by a slot per request,
the engine's token rows are read in place, and a step is one compiled call (``kernels.chain_step``:
observe, count the new output into the memory, draft, keep the drafts) taking a few packed arrays.
What is left per row in Python is appending the new output to the memory's segment (the memory evicts
whole segments: it keeps their tokens) and slicing the draft list vLLM wants; a step whose output makes
the memory evict or grow has the memory count it (``SuffixMemory.add``) and ``chain_step`` called again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable

import numpy as np

SOURCES = ("none", "context", "memory")  # a slot's source as a number: kernels.SRC_NONE / SRC_CONTEXT / SRC_MEMORY


class BatchRows:
    """Slots of per-request arrays (``start`` .. ``stats``); ``active`` maps the last step's request ids to their slots,
    ``dormant`` keeps the slots of requests that left the batch (finished or preempted), most recent
    last, up to the drafter's ``MAX_DORMANT_REQUESTS``."""

    def __init__(self, k: int, capacity: int = 64) -> None:
        self.k = k
        self.active: dict[str, int] = {}
        self.dormant: OrderedDict[str, int] = OrderedDict()
        self.keys: list[Hashable] = []  # isolation key per slot
        self._free: list[int] = []
        self.capacity = 0
        self._grow(capacity)

    # rows of `ints`; toff: where the request's sampler class's cells start in the acceptance table
    INTS = ("start", "seen", "memseen", "plen", "kid", "seglen", "last_len", "last_src", "toff")

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

    def new_slot(self, key: Hashable, prompt_len: int, kid: int, seglen: int = 0, toff: int = 0) -> int:
        """A fresh slot: nothing seen yet (the first step indexes from the prompt's tail); ``seglen``: the
        request's output tokens the memory holds already (its segment, ``SuffixMemory.segment_length``);
        ``toff``: its sampler class's first cell in the acceptance table."""
        if not self._free:
            self._grow(2 * self.capacity)
        s = self._free.pop()
        self.start[s] = self.seen[s] = self.memseen[s] = self.last_len[s] = self.last_src[s] = 0
        self.hist_a[s] = self.hist_e[s] = 0.0
        self.stats[s] = 0
        self.plen[s], self.kid[s], self.seglen[s], self.keys[s], self.toff[s] = prompt_len, kid, seglen, key, toff
        return s

    def retire(self, req_ids: Iterable[str], limit: int) -> None:
        """``req_ids`` left the batch (finished or preempted): their slots become dormant, the most
        recent last; beyond ``limit`` dormant slots the oldest are released."""
        for rid in req_ids:
            self.dormant[rid] = self.active.pop(rid)
        while len(self.dormant) > limit:
            _, slot = self.dormant.popitem(last=False)
            self.release(slot)

    def segment_gone(self, req_id: object) -> None:
        """The memory evicted ``req_id``'s output: its next output starts a new segment."""
        s = self.slot_of(req_id)  # type: ignore[arg-type]
        if s is not None:
            self.seglen[s] = 0

    def release(self, s: int) -> None:
        self.keys[s] = None
        self._free.append(s)

    def slot_of(self, req_id: str) -> int | None:
        s = self.active.get(req_id)
        return self.dormant.get(req_id) if s is None else s

    def by_source(self) -> dict[str, list[int]]:
        """Drafted and accepted tokens per source over the slots in use (active and dormant)."""
        used = list(self.active.values()) + list(self.dormant.values())
        tot = self.stats[used].sum(axis=0) if used else np.zeros((len(SOURCES), 2), dtype=np.int64)
        return {name: [int(d), int(a)] for name, (d, a) in zip(SOURCES, tot) if d}
