"""The lookahead drafter: per-request drafting state in slot arrays, one compiled call per engine step.

Pure Python/numpy plus numba kernels (core/kernels.py), testable without vLLM;
``vllm_lookahead.vllm.proposer`` feeds it the runner's arrays each step (``step``).  Per step and request: the last
draft's verification is credited to the acceptance table and the request's history, the new output
enters the engine-wide output memory, and the best candidate of the two sources -- the context match
(prompt lookup over prompt + output) and the output memory -- is drafted while its estimated commit
probability stays above a floor (``chain_floor``) that rises with the batch, or is measured
(``DraftRowPrice``).  Above ``guard_batch_size`` running requests, and at any size for a batch with a
request sampling at T > 0, a guard per batch-size bucket (``ThroughputArbiter``) times the engine's steps
with drafts and without and runs the faster.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from .acceptance import CLASS_CELLS, CTX0, DEPTHS, MEM0, AcceptanceTable, sampler_class
from .arbiter import ThroughputArbiter
from .batch_rows import BatchRows
from .config import LookaheadConfig
from .jit import load_kernels
from .row_price import DraftRowPrice, batch_bucket, threshold_allocate
from .suffix_memory import SuffixMemory


@dataclass(slots=True)
class RowStep:
    """One running request after a forward pass, as a record: for callers that keep one record per request
    (an opt-in layout package), and the tests' way to write a batch for ``LookaheadDrafter.step``
    (tests/core/reference_drafter.py)."""

    req_id: str
    context: np.ndarray | list[int]  # committed tokens; at least num_tokens long
    num_tokens: int
    new_tokens: list[int]  # accepted drafts + bonus token this step; [] while still prefilling
    verified: int = 0  # draft tokens verified for this row this step
    prompt_len: int = 0
    isolation_key: Hashable = None  # whose outputs this request may draft from (LoRA, tenant); read once
    temperature: float = 0.0  # the request's sampling temperature (its acceptance estimates: sampler_class); read once


_NO_MEMORY = (np.zeros(1, dtype=np.uint64), np.zeros((4, 1), dtype=np.int32), np.zeros(1, dtype=np.uint64),
              np.zeros((3, 1), dtype=np.int32), np.zeros(3, dtype=np.int64))
"""``kernels.chain_step``'s memory tables when there is no memory (never read or written: room -1, kid -1)."""

_KERNELS_READY = False  # compile_kernels() ran in this process
MAX_MEASURED_FLOOR = 0.5
"""A measured floor (``measured_floor``) is capped here: a price above 0.5 -- drafting only tokens
committed more often than not -- is more likely a noisy fit than a row that dear."""
GUARD_MAX_RETRY_STEPS = 512
"""The busy-batch guard re-tries a losing mode every 64 steps; one that lost by 1.25x or more waits twice
as long before the next re-try, up to this many steps."""
MAX_DORMANT_REQUESTS = 256
"""Drafting state kept for requests absent from the batch (preempted), least recently used evicted beyond it."""


def compile_kernels() -> None:
    """Compile (or load from numba's cache) the drafter's kernels now, so that the first requests' steps do
    not pay it (tens of ms), nor does the busy-batch guard, which would measure drafting as slow while a
    kernel compiles.  Once per process.  Why a real drafter's steps: numba compiles one version per
    argument types, and these are the types the engine's steps pass."""
    global _KERNELS_READY
    if _KERNELS_READY:
        return
    _KERNELS_READY = True  # (the drafters below call this function again)
    try:
        # with the memory, with one so small that it evicts (the row-by-row memory path), without it
        for memory_tokens in (64, 8, 0):
            warm = LookaheadDrafter(LookaheadConfig(memory_tokens=memory_tokens), 2)
            ctx = [1, 2, 3, 1, 2, 3, 1, 2]
            tokens = np.asarray([ctx + [1, 2, 3], ctx + [1, 2, 3]], dtype=np.int32)
            for end, new in ((6, [3]), (9, [3]), (11, [1, 2])):
                warm.step(["a0", "a1"], tokens, np.array([end, end], dtype=np.int32), [new, new], [1, 1],
                                 np.array([2, 2], dtype=np.int32), lambda rid: None)
        load_kernels().drafted_surplus(np.zeros((1, 2)), np.zeros(1, dtype=np.int64), 0.0)
    except BaseException:  # e.g. numba missing: the next drafter reports it again
        _KERNELS_READY = False
        raise


class LookaheadDrafter:
    def __init__(self, cfg: LookaheadConfig, num_speculative_tokens: int):
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        compile_kernels()
        self.cfg = cfg
        self.k = num_speculative_tokens
        self.batch = BatchRows(self.k)  # per-request state, one slot per request
        # the last batch (request ids in row order, their set, slots, whether a row samples at T > 0) while
        # no row changed
        self._batch_rows: tuple[list[str], set[str], list[int], bool] | None = None
        self._floors: dict[tuple[int, str], float] = {}  # (rows, guard mode) -> floor
        self._floors_version = 0  # the row_price version the cached floors were made with
        self.memory = SuffixMemory(cfg.memory_tokens, cfg.memory_depth) if cfg.memory_tokens > 0 else None
        self.table = AcceptanceTable()
        if self.memory is not None:
            self.memory.on_evict = self.batch.segment_gone
        self._outputs: tuple[np.ndarray, ...] | None = None  # the kernels' outputs, reused while n is the same
        depth, k = cfg.memory_depth, self.k
        # the kernels' scratch, by type (kernels.chain_step takes these three and slices them)
        self._scratch = (np.zeros(2 * depth + 2 * k + 1, dtype=np.int32), np.zeros(k, dtype=np.int64),
                         np.zeros(2 * k + 1, dtype=np.float64))
        # kernels.chain_step's settings: max_prompt_index, depth, room, k, min_match, max_match, max_total, ctx0,
        # mem0, depths, class_cells, observe; weight, cap, floor (room, observe and floor set per step)
        self._params = (np.array([cfg.max_prompt_index_tokens, depth, -1, k, cfg.min_match, cfg.max_match,
                                  cfg.max_batch_draft_tokens, CTX0, MEM0, DEPTHS, CLASS_CELLS, 1], dtype=np.int64),
                        np.array([self.table.weight, self.table.cap, 0.0], dtype=np.float64))
        self.clock = time.perf_counter  # replaceable in tests
        # with measured_floor: the price of a draft row per batch-size bucket, from the engine's own steps;
        # (rows, draft rows, ids, start) of the step being timed
        self.row_price = DraftRowPrice()
        self._measure_price = cfg.measured_floor
        self._price_last: tuple[int, int, set[str], float] | None = None
        self.last_budget = 0  # draft tokens given to the batch in the last step
        # above guard_batch_size, and at any size for a batch with a row at T > 0: the guard's mode, measured
        # per (batch-size bucket, sampled)
        self.guards: dict[tuple[int, bool], ThroughputArbiter] = {}
        # (mode, guard key, start of the step, the ids of its rows)
        self._guard_last: tuple[str, tuple[int, bool], float, set[str]] | None = None

    def step(self, req_ids: list[str], tokens: np.ndarray, num_tokens: np.ndarray, new_tokens: list[list[int]],
             verified: Sequence[int] | np.ndarray, prompt_lens: np.ndarray, key_of: Callable[[str], Hashable],
             room: Sequence[int] | None = None,
             temperature_of: Callable[[str], float | None] | None = None) -> list[list[int]]:
        """The next drafts of the engine's batch, in row order, from the batch as the engine holds it: row
        ``i`` is request ``req_ids[i]`` with committed tokens ``tokens[i, :num_tokens[i]]``
        (the runner's token array, read in place), ``new_tokens[i]`` sampled this step (vLLM's list;
        [] while prefilling), ``verified[i]`` draft tokens verified, a prompt of ``prompt_lens[i]``
        tokens; ``key_of(req_id)`` gives a request's isolation key, asked once per request; ``room[i]``
        (optional) the most draft tokens row ``i`` can still use (its ``max_tokens`` is near: the proposer's
        ``draft_room``) -- a draft is cut there, and the step's measured rows count only what was drafted;
        ``temperature_of(req_id)`` (optional; else greedy) a request's sampling temperature, asked once per
        request: its drafts are estimated with its sampler class's cells of the acceptance table.
        Why arrays, and one compiled call (``kernels.chain_step``): core/batch_rows.py."""
        b, n = self.batch, len(req_ids)
        if n == 0:
            return []
        new_counts = [len(t) for t in new_tokens]
        mode, slots_l, live = self._slots_for(req_ids, new_counts, prompt_lens, key_of, temperature_of)
        now = self._price_tick(live, new_counts)
        if mode == "off":
            self._price_mark(n, 0, live, now)
            self.last_budget = 0
            slots = np.array([x for x in slots_l if x >= 0], dtype=np.int64)
            b.last_len[slots] = 0
            b.last_src[slots] = 0
            return [[] for _ in req_ids]
        kern, table, memory, k = load_kernels(), self.table, self.memory, self.k
        rowdata = np.array((slots_l, new_counts, verified), dtype=np.int64)
        if self._floors_version != self.row_price.version:  # a bucket's measured price changed
            self._floors.clear()
            self._floors_version = self.row_price.version
        floor = self._floors.get((n, mode))
        if floor is None:
            floor = self._floors[(n, mode)] = self.chain_floor(n)
        out = self._outputs
        if out is None or len(out[0]) != n:
            out = self._outputs = (np.zeros((n, k), dtype=np.int32), np.zeros((n, k), dtype=np.int64),
                                   np.zeros((n, k), dtype=np.float64), np.zeros((5, n), dtype=np.int64))
        out_tok, out_cell, out_pc, out_meta = out  # out_meta: length, source, count, fresh output from, to
        params, fparams = self._params
        params[2] = memory.room() if memory is not None else -1
        fparams[2] = floor
        tables = memory.packed_tables() if memory is not None else _NO_MEMORY
        fresh, kept = kern.chain_step(tokens, num_tokens, rowdata, b.ints, b.floats, b.lastk, b.last_p, b.stats,
                                      table.arrays, *tables, params, fparams, *self._scratch, out_tok, out_cell,
                                      out_pc, out_meta)
        meta = out_meta.tolist()
        if memory is not None and fresh != 0:
            # counted in chain_step: into the segments only; or an eviction or a rebuild on the way (-1): the
            # memory counts them, then chain_step drafts (not observing the step again)
            keys = [b.keys[s] for s in slots_l]
            memory.add(req_ids, keys, tokens, meta[3], meta[4], b.start[rowdata[0]], new_tokens, counted=fresh > 0)
            if fresh < 0:
                for r, (lo, hi) in enumerate(zip(meta[3], meta[4])):
                    if hi > lo:
                        b.seglen[slots_l[r]] = memory.segment_length(req_ids[r])
                params[2], params[11] = -1, 0
                _, kept = kern.chain_step(tokens, num_tokens, rowdata, b.ints, b.floats, b.lastk, b.last_p, b.stats,
                                          table.arrays, *memory.packed_tables(), params, fparams, *self._scratch,
                                          out_tok, out_cell, out_pc, out_meta)
                params[11] = 1
                meta = out_meta.tolist()
        counts = meta[2] if kept else self._keep_within_budget(rowdata[0], floor)
        if room is not None:  # the verified counts tell the next step's bookkeeping what was really drafted
            counts = [min(c, r) for c, r in zip(counts, room)]
        if self._measure_price and any(counts) and not self._drafting_pays(counts, floor):
            counts = [0] * n
            slots = np.asarray(slots_l, dtype=np.int64)
            b.last_len[slots] = 0
            b.last_src[slots] = 0
        self.last_budget = sum(counts)
        self._price_mark(n, self.last_budget, live, now)
        return [t[:c] for t, c in zip(out_tok.tolist(), counts)]

    def _slots_for(self, req_ids: list[str], new_counts: list[int], prompt_lens: np.ndarray,
                   key_of: Callable[[str], Hashable],
                   temperature_of: Callable[[str], float | None] | None) -> tuple[str, list[int], set[str]]:
        """``step``'s bookkeeping: the guard's mode for this step, each row's slot (-1: not taken in,
        in an "off" step) and the set of request ids.  A steady batch -- the same requests in the same rows
        as the last step -- reuses that step's slots; otherwise the requests that left are retired and the
        new rows admitted (``_admit``)."""
        b = self.batch
        same = self._batch_rows
        if same is not None and req_ids == same[0]:
            live, slots_l, sampled = same[1], same[2], same[3]
            classes = None  # (slots known: nothing to admit)
        else:
            self._batch_rows = None
            live, slots_l = set(req_ids), None
            b.retire(b.active.keys() - live, MAX_DORMANT_REQUESTS)
            classes = [sampler_class(temperature_of(rid)) for rid in req_ids] if temperature_of is not None else None
            sampled = bool(classes) and any(classes)
        mode = self._guard(live, new_counts, sampled)
        if slots_l is None:
            active = b.active
            slots_l = [active.get(rid, -1) for rid in req_ids]
            if -1 in slots_l and mode != "off":  # (in an "off" step requests not seen yet are not taken in)
                self._admit(req_ids, slots_l, prompt_lens, key_of, classes)
            if -1 not in slots_l:
                self._batch_rows = (list(req_ids), live, slots_l, sampled)
        return mode, slots_l, live

    def _drafting_pays(self, counts: list[int], floor: float) -> bool:
        """Do this step's drafts pay for the step drafting at all?  Their expected commits beyond what
        their rows cost (sum of p_cum - floor over the draft tokens: each token's surplus over its row's
        price) must cover the measured price of a drafting step (``DraftRowPrice.switch_price``).  At
        T > 0, where a draft token is committed with the target's probability of it, a step often
        expects a fraction of a token from its drafts: then it runs as a plain step."""
        switch = self.row_price.switch_price(len(counts))
        if switch <= 0.0:
            return True
        counts_a = np.asarray(counts, dtype=np.int64)
        return load_kernels().drafted_surplus(self._outputs[2], counts_a, floor) >= switch  # type: ignore[index]

    def _keep_within_budget(self, slots: np.ndarray, floor: float) -> list[int]:
        """``step`` when the drafts exceed ``max_batch_draft_tokens``: the most probable draft
        tokens of the whole batch (``threshold_allocate``), kept for the next step; returns each row's count."""
        b, k = self.batch, self.k
        out_tok, out_cell, out_pc, out_meta = self._outputs  # type: ignore[misc]
        n = len(slots)
        mask = np.arange(k) < out_meta[0][:, None]
        owner = np.broadcast_to(np.arange(n)[:, None], (n, k))[mask]
        alloc = threshold_allocate(out_pc[mask], owner, n, floor, self.cfg.max_batch_draft_tokens)
        load_kernels().keep_drafts(slots, alloc, out_tok, out_cell, out_pc, out_meta[1], b.last_len, b.last_tok,
                                   b.last_cells, b.last_p, b.last_src)
        return alloc.tolist()

    def _admit(self, req_ids: list[str], slots: list[int], prompt_lens: np.ndarray,
               key_of: Callable[[str], Hashable], classes: list[int] | None) -> None:
        """Slots for the rows of ``req_ids`` without one (``slots[i]`` -1): a request back from the
        dormant slots, or a new one (in sampler class ``classes[i]``; None: greedy)."""
        b, memory = self.batch, self.memory
        for i, rid in enumerate(req_ids):
            if slots[i] >= 0:
                continue
            s = b.dormant.pop(rid, None)
            if s is None:
                key = key_of(rid)
                cls = 0 if classes is None else classes[i]
                s = b.new_slot(key, int(prompt_lens[i]), memory.kid_for(key) if memory is not None else -1,
                               memory.segment_length(rid) if memory is not None else 0, cls * CLASS_CELLS)
            b.active[rid] = slots[i] = s

    def _price_tick(self, live: set[str], new_counts: list[int]) -> float:
        """With ``measured_floor``: credit the step just done to ``row_price`` (its rows, draft rows,
        committed tokens and time between two calls) and return the clock.  As for the guard, only pure
        decode steps count -- every row committed tokens and none joined (a joining request prefilled in
        the step, which costs time no draft row explains)."""
        if not self._measure_price:
            return 0.0
        now = self.clock()
        last = self._price_last
        if last is not None and live <= last[2] and all(new_counts):
            self.row_price.observe(last[0], last[1], sum(new_counts), now - last[3])
        return now

    def _price_mark(self, rows: int, drafts: int, live: set[str], now: float) -> None:
        """Start timing the step that runs these ``rows`` and ``drafts`` (``_price_tick`` credits it)."""
        if self._measure_price:
            self._price_last = (rows, drafts, live, now)

    def _guard(self, live: set[str], new_counts: list[int], sampled: bool = False) -> str:
        """The busy-batch guard: "chain" (draft as configured) or "off" for the next step.  The step just done is credited to the
        mode that made its drafts (committed tokens / time between two calls); above
        ``guard_batch_size`` rows -- and, with ``measured_floor``, at any batch size when a row samples at
        T > 0 (``sampled``) -- the arbiter of the batch's (bucket, sampled) key (powers of two: 17-32 rows,
        33-64, ...) decides: every mode is measured first (interleaved, 8 steps each, or 4 when the best is
        then ahead by 1.25x), then a loser is re-tried 2 steps in 64, in turn -- a loser that keeps losing by
        1.25x or more ever more rarely, down to 2 in ``GUARD_MAX_RETRY_STEPS``.  Greedy batches at or below
        ``guard_batch_size`` always draft.  Why at any size at T > 0: a sampled draft token is committed
        with the target's probability of it, often a fraction of what a greedy one earns, and whether a
        T > 0 step's drafts pay for their verification depends on the model, the sampler and the text,
        which estimates can misjudge; the arbiter measures it.  Only pure decode steps
        are credited -- the rows now all ran in the step measured and all committed tokens: a step that also prefilled a joining request (or a chunk of one) is
        slow for reasons neither mode controls."""
        guarded = (sampled and self._measure_price) or len(new_counts) > self.cfg.guard_batch_size
        if self._guard_last is None and not guarded:
            return "chain"  # (no step to credit, none to time: not even the clock is read)
        now = self.clock()
        last, self._guard_last = self._guard_last, None
        if last is not None and live <= last[3] and all(new_counts):
            self.guards[last[1]].observe(last[0], sum(new_counts), now - last[2])
        if not guarded or not any(new_counts):
            return "chain"
        key = (batch_bucket(len(new_counts)), sampled)
        arbiter = self.guards.get(key)
        if arbiter is None:
            arbiter = self.guards[key] = ThroughputArbiter(("chain", "off"), explore_every=64, explore_steps=2,
                                                           warmup_steps=8, max_explore_every=GUARD_MAX_RETRY_STEPS)
        mode = arbiter.choose()
        self._guard_last = (mode, key, now, live)
        return mode

    def chain_floor(self, batch: int) -> float:
        """The commit probability a draft token needs in a batch of ``batch`` rows --
        ``chain_min_p`` at one row, rising linearly to ``chain_busy_min_p`` at ``batch_size_threshold``
        rows and staying there.  Why it may rise: a draft token pays when its commit probability beats
        the tokens the step's time would serve otherwise (p >= cost of one row x tokens/s), and the
        batch's tokens/s grows with the batch.  The configured busy floor depends on k
        (``LookaheadConfig.busy_floor``).  With ``measured_floor`` (the default) that rule is applied to
        the engine's own measurements once a batch-size bucket has them: the floor is the measured price
        of a draft row (``DraftRowPrice``, a bucket without a row cost of its own priced with the nearest
        bucket's) capped at ``MAX_MEASURED_FLOOR``, and never below ``chain_min_p``; the configured floors
        serve until then."""
        lo, hi, top = self.cfg.chain_min_p, self.cfg.busy_floor(self.k), self.cfg.batch_size_threshold
        if self._measure_price:
            price = self.row_price.price(batch)
            if price is not None:  # measured: capped at MAX_MEASURED_FLOOR, never below chain_min_p
                return max(min(price, MAX_MEASURED_FLOOR), lo)
        if batch >= top:
            return hi
        return lo + (hi - lo) * max(0, batch - 1) / max(1, top - 1)

    def summary(self) -> dict[str, object]:
        by_source = self.batch.by_source()
        drafted = sum(d for d, _ in by_source.values())
        accepted = sum(a for _, a in by_source.values())
        return {"requests": len(self.batch.active) + len(self.batch.dormant), "drafted": drafted,
                "accepted": accepted, "acceptance_rate": accepted / drafted if drafted else 0.0,
                "by_source": {k: {"drafted": d, "accepted": a} for k, (d, a) in sorted(by_source.items())},
                "memory_tokens": len(self.memory) if self.memory is not None else 0,
                "row_price": self.row_price.summary() if self._measure_price else None,
                "guard": {f"{b}{' sampled' if s else ''}": a.summary() for (b, s), a in self.guards.items()}}
