"""The batch-level lookahead drafter: request states keyed by request id plus the adaptive policy.

Pure Python/numpy so that it is testable without vLLM; ``vllm_lookahead.vllm.proposer`` feeds it the
runner's rows each step.  Policies "chain" (the default) and "cost" (opt-in) draft every row's best candidate
from every source (core/chain.py, ``_step_cost``), cut by its estimated commit probability; "chain"
shares the measured throughput guard below.  Policy "ema" keeps lookahead from
making serving slower like this:
  * per request: an EMA of accepted tokens per drafted token; below ``min_acceptance`` the request
    stops drafting and only probes every ``probe_interval`` steps (not at batch sizes up to
    ``free_draft_batch_size`` (default 1), where draft rows are nearly free);
  * per batch: above ``batch_size_threshold`` running requests only requests whose EMA clears
    ``busy_min_acceptance`` draft freely, and all drafts together fit ``max_batch_draft_tokens`` (best
    first);
  * a request below the floor in force still drafts *confident* context matches (``confident_fallback``:
    a suffix of >= ``confident_match`` tokens seen before, no pool/Jacobi fill), because those are
    accepted often enough to pay for their rows even when rows cost compute;
  * above ``guard_batch_size`` a measured throughput guard (``core.arbiter.LayoutArbiter``, one per
    batch-size bucket) times the engine's own steps and picks the fastest of drafting as configured
    ("chain"), drafting at the higher ``chain_strict_min_p`` floor ("strict", policy "chain" only) and
    drafting nothing ("off").  Why measured: whether a busy batch's draft rows pay, and which of them,
    depends on the hardware and threading (on the 2-core CPU, same prompts and drafts: faster than
    `none` with one bound OMP thread, slower with two unbound threads), which no acceptance estimate
    can know.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from .arbiter import LayoutArbiter
from .batch_rows import BatchRows
from .chain import CTX0, DEPTHS, MEM0, SOURCE_MEMORY, AcceptanceTable, propose_chain
from .config import LookaheadConfig
from .context_index import ContextIndex
from .cost_model import DraftRowPrice, StepCostModel, batch_bucket, threshold_allocate
from .jit import load_kernels
from .pool import NGramPool
from .state import SOURCE_CONTEXT, SOURCE_NONE, RequestState
from .suffix_memory import SuffixMemory


@dataclass(slots=True)
class RowStep:
    """What the engine tells the drafter about one running request after a forward pass."""

    req_id: str
    context: np.ndarray | list[int]  # committed tokens; at least num_tokens long
    num_tokens: int
    new_tokens: list[int]  # accepted drafts + bonus token this step; [] while still prefilling
    verified: int = 0  # draft tokens verified for this row this step
    argmax: np.ndarray | list[int] | None = None  # target argmax at the verified + 1 rows
    prompt_len: int = 0
    isolation_key: Hashable = None  # whose outputs this request may draft from (LoRA, tenant); read once


_SOURCES = (SOURCE_NONE, SOURCE_CONTEXT, SOURCE_MEMORY)  # kernels.SRC_NONE, SRC_CONTEXT, SRC_MEMORY
_EMPTY = np.zeros(0, dtype=np.int32)
_NO_KEYS, _NO_COUNTS = np.zeros(1, dtype=np.uint64), np.zeros(1, dtype=np.int32)  # no memory: never read
# kernels.chain_step's memory tables when there is no memory (never read or written: room -1, kid -1)
_NO_MEMORY = (_NO_KEYS, np.zeros((4, 1), dtype=np.int32), _NO_KEYS, np.zeros((3, 1), dtype=np.int32),
              np.zeros(3, dtype=np.int64))

_KERNELS_READY = False  # compile_kernels() ran in this process
MAX_MEASURED_FLOOR = 0.5
"""A measured floor (``measured_floor``) is capped here: the highest price measured on this project's CPU
was 0.411 (batch 32, benchmarks/results/measured_k8_open_64_r5.json), and a price above 0.5 -- drafting
only tokens committed more often than not -- is more likely a noisy fit than a row that dear."""


def compile_kernels() -> None:
    """Compile (or load from numba's cache) the drafter's kernels now -- context scan, the output memory's
    count and look-up, the compiled rows -- so that the first requests' steps do not pay it (tens of ms),
    nor does the busy-batch guard, which would measure drafting as slow while a kernel compiles.  Once
    per process: the compiled code is shared.  Why a real drafter's steps: numba compiles one version
    per argument types, and these are the types the engine's steps pass."""
    global _KERNELS_READY
    if _KERNELS_READY:
        return
    _KERNELS_READY = True  # (the drafters below call this function again)
    try:
        index = ContextIndex(1, 4)
        index.extend([1, 2, 1])
        index.lookup(2)
        index.lookup_evidence(2)
        # with the memory, with one so small that it evicts (step_arrays' row-by-row path), without it
        for memory_tokens in (64, 8, 0):
            warm = LookaheadDrafter(LookaheadConfig(memory_tokens=memory_tokens, pool_max_batch=0), 2)
            ctx = [1, 2, 3, 1, 2, 3, 1, 2]
            warm.step([RowStep(f"r{i}", ctx[:6], 6, [3], prompt_len=2) for i in range(2)])
            warm.step([RowStep(f"r{i}", np.asarray(ctx, dtype=np.int32), 8, [1, 2], 1, prompt_len=2) for i in range(2)])
            # the engine's path (step_arrays) on the runner's types: int32 token rows and counts
            tokens = np.asarray([ctx + [1, 2, 3], ctx + [1, 2, 3]], dtype=np.int32)
            for end, new in ((9, [3]), (11, [1, 2])):
                warm.step_arrays(["a0", "a1"], tokens, np.array([end, end], dtype=np.int32), [new, new], [1, 1],
                                 np.array([2, 2], dtype=np.int32), lambda rid: None)
        memory = SuffixMemory(8, 2)
        memory.extend("warm-up", None, [1, 2, 1, 2])
        memory.lookup(None, [1], 2)
        memory.forget("warm-up")
    except BaseException:  # e.g. numba missing: the next drafter reports it again
        _KERNELS_READY = False
        raise


def _count_above(p_cum: list[float], floor: float) -> int:
    """How many leading entries of a non-increasing ``p_cum`` are >= ``floor``."""
    n = 0
    for x in p_cum:
        if x < floor:
            break
        n += 1
    return n


class LookaheadDrafter:
    def __init__(self, cfg: LookaheadConfig, num_speculative_tokens: int):
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        compile_kernels()
        self.cfg = cfg
        self.k = num_speculative_tokens
        self.states: dict[str, RequestState] = {}
        self.batch = BatchRows(self.k)  # policy "chain" above pool_max_batch rows: step_arrays' slots
        # step_arrays' last batch (request ids in row order, their set, slots) while no row changed
        self._batch_rows: tuple[list[str], set[str], list[int]] | None = None
        self._floors: dict[tuple[int, str], float] = {}  # (rows, guard mode) -> floor (step_arrays)
        self._floors_version = 0  # the row_price version the cached floors were made with
        # the engine-wide n-gram pool: the "ema" policy's fill and the 2D layout's shared candidates
        self.shared = (NGramPool(cfg.ngram, cfg.pool_size, cfg.shared_pool_keys)
                       if cfg.shared_pool_keys > 0 and (cfg.policy == "ema" or cfg.lade_shared_candidates)
                       else None)
        self._dormant: OrderedDict[str, RequestState] = OrderedDict()
        # policies "chain" and "cost": engine-wide output memory, acceptance table; "cost": step-time model
        self.memory = (SuffixMemory(cfg.memory_tokens, cfg.memory_depth)
                       if cfg.policy in ("chain", "cost") and cfg.memory_tokens > 0 else None)
        self.table = AcceptanceTable()
        self._table_fresh = True  # table.p holds table.p_array (the batch path updates the array only)
        if self.memory is not None:
            self.memory.on_evict = self.batch.segment_gone
        # without the pool, draft with kernels.propose_rows (one call per step; False: propose_chain per
        # row -- the same drafts, the reference the tests compare it with)
        self.compiled_rows = True
        self._outputs: tuple[np.ndarray, ...] | None = None  # kernels.propose_rows' outputs, reused
        depth, k = cfg.memory_depth, self.k
        # the kernels' scratch, by type (kernels.chain_step takes these three and slices them) ...
        self._scratch_packed = (np.zeros(2 * depth + 2 * k + 1, dtype=np.int32), np.zeros(k, dtype=np.int64),
                                np.zeros(2 * k + 1, dtype=np.float64))
        i32, i64, f64 = self._scratch_packed
        # ... and as kernels.propose_rows takes it: memory walk (context + draft, probabilities), tail, one
        # candidate (tokens, cells, p_cum)
        self._scratch = (i32[: depth + k + 1], f64[: k + 1], i32[depth + k + 1 : 2 * depth + k + 1],
                         i32[2 * depth + k + 1 :], i64, f64[k + 1 :])
        # kernels.chain_step's settings: max_prompt_index, depth, room (set per step), k, min_match, max_match,
        # max_total, ctx0, mem0, depths; weight, cap, floor (set per step)
        self._params = (np.array([cfg.max_prompt_index_tokens, depth, -1, k, cfg.min_match, cfg.max_match,
                                  cfg.max_batch_draft_tokens, CTX0, MEM0, DEPTHS], dtype=np.int64),
                        np.array([self.table.weight, self.table.cap, 0.0], dtype=np.float64))
        self.cost = StepCostModel(margin=cfg.cost_margin)
        self.clock = time.perf_counter  # replaceable in tests
        # policy "chain" with measured_floor: the price of a draft row per batch-size bucket, from the
        # engine's own steps; (rows, draft rows, ids, start) of the step being timed
        self.row_price = DraftRowPrice()
        self._measure_price = cfg.policy == "chain" and cfg.measured_floor
        self._price_last: tuple[int, int, set[str], float] | None = None
        self._last_step: tuple[set[str], int, int, float] | None = None  # ids, rows, drafts, start time
        self.last_budget = 0  # draft tokens given to the batch in the last step
        # policies "chain" and "ema" above guard_batch_size: the guard's mode, measured per batch-size bucket
        self.guards: dict[int, LayoutArbiter] = {}
        # (mode, bucket, start of the step, the ids of its rows)
        self._guard_last: tuple[str, int, float, set[str]] | None = None

    def _state(self, row: RowStep) -> RequestState:
        st = self.states.get(row.req_id)
        if st is None:
            st = self._dormant.pop(row.req_id, None) or RequestState(self.cfg, self.k, row.prompt_len, self.shared)
            st.isolation_key = row.isolation_key
            self.states[row.req_id] = st
        return st

    def step(self, rows: list[RowStep]) -> list[list[int]]:
        """Observe one engine step for every running request and return the next drafts, in row order."""
        live = {r.req_id for r in rows}
        self._retire_states(live)
        self._batch_rows = None
        if self.batch.active or self.batch.dormant:  # requests the batch path held: their state comes back
            self._export_rows(rows)
        if not self._table_fresh:
            self.table.refresh()
            self._table_fresh = True
        new_counts = [len(r.new_tokens) for r in rows]
        now = self._price_tick(live, new_counts)
        mode = self._guard(live, new_counts) if self.cfg.policy != "cost" else "chain"
        if mode == "off":
            self._price_mark(len(rows), 0, live, now)
            return self._off(rows)
        if self.cfg.policy in ("chain", "cost"):
            drafts = self._step_cost(rows, live, strict=mode == "strict")
            self._price_mark(len(rows), self.last_budget, live, now)
            return drafts
        states = []
        for row in rows:
            st = self._state(row)
            st.observe(row.context, row.num_tokens, row.new_tokens, row.verified, row.argmax)
            states.append(st)
        budgets, confident = self._budgets(rows, states)
        return [st.propose(b, confident_only=c) for st, b, c in zip(states, budgets, confident)]

    def _retire_states(self, live: set[str]) -> None:
        """The slow path's requests not in ``live`` (finished or preempted) become dormant states."""
        gone = self.states.keys() - live  # (a set operation: no per-row Python)
        for rid in [r for r in self.states if r in gone] if gone else ():
            self._dormant[rid] = self.states.pop(rid)
            while len(self._dormant) > self.cfg.max_dormant_requests:
                self._dormant.popitem(last=False)

    def batch_path(self, batch: int) -> bool:
        """Whether ``step_arrays`` serves a step of ``batch`` rows: policy "chain" above ``pool_max_batch``
        rows (without the pool and the Jacobi iterate, which need the argmax rows and Python per row)."""
        return self.cfg.policy == "chain" and batch > self.cfg.pool_max_batch and self.compiled_rows

    def step_arrays(self, req_ids: list[str], tokens: np.ndarray, num_tokens: np.ndarray,
                    new_tokens: list[list[int]], verified: Sequence[int] | np.ndarray, prompt_lens: np.ndarray,
                    key_of: Callable[[str], Hashable], room: Sequence[int] | None = None) -> list[list[int]]:
        """``step`` for the engine's batch as it holds it, without a ``RowStep`` per row (``batch_path``
        steps only): row ``i`` is request ``req_ids[i]`` with committed tokens ``tokens[i, :num_tokens[i]]``
        (the runner's token array, read in place), ``new_tokens[i]`` sampled this step (vLLM's list;
        [] while prefilling), ``verified[i]`` draft tokens verified, a prompt of ``prompt_lens[i]``
        tokens; ``key_of(req_id)`` gives a request's isolation key, asked once per request; ``room[i]``
        (optional) the most draft tokens row ``i`` can still use (its ``max_tokens`` is near: the proposer's
        ``draft_room``) -- a draft is cut there, and the step's measured rows count only what was drafted.
        The same drafts as ``step`` (tests/core/test_chain.py); why: core/batch_rows.py."""
        if not self.batch_path(len(req_ids)):
            raise ValueError(f"step_arrays serves policy 'chain' above pool_max_batch rows, not "
                             f"{len(req_ids)} rows of policy {self.cfg.policy!r}")
        b, n = self.batch, len(req_ids)
        new_counts = [len(t) for t in new_tokens]
        mode, slots_l, live = self._slots_for(req_ids, new_counts, prompt_lens, key_of)
        now = self._price_tick(live, new_counts)
        if mode == "off":
            self._price_mark(n, 0, live, now)
            self.last_budget = 0
            slots = np.array([x for x in slots_l if x >= 0], dtype=np.int64)
            b.last_len[slots] = 0
            b.last_src[slots] = 0
            return [[] for _ in req_ids]
        kern, table, memory, cfg, k = load_kernels(), self.table, self.memory, self.cfg, self.k
        rowdata = np.array((slots_l, new_counts, verified), dtype=np.int64)
        if self._floors_version != self.row_price.version:  # a bucket's measured price changed
            self._floors.clear()
            self._floors_version = self.row_price.version
        floor = self._floors.get((n, mode))
        if floor is None:
            floor = self._floors[(n, mode)] = (max(self.chain_floor(n), cfg.chain_strict_min_p) if mode == "strict"
                                               else self.chain_floor(n))
        out = self._outputs
        if out is None or len(out[0]) != n:
            out = self._outputs = (np.zeros((n, k), dtype=np.int32), np.zeros((n, k), dtype=np.int64),
                                   np.zeros((n, k), dtype=np.float64), np.zeros((5, n), dtype=np.int64))
        out_tok, out_cell, out_pc, out_meta = out  # out_meta: length, source, count, fresh output from, to
        params, fparams = self._params
        params[2] = memory.room() if memory is not None else -1
        fparams[2] = floor
        fresh, kept = kern.chain_step(tokens, num_tokens, rowdata, b.ints, b.floats, b.lastk, b.last_p, b.stats,
                                      table.arrays, *(memory.packed_tables() if memory is not None else _NO_MEMORY),
                                      params, fparams, *self._scratch_packed, out_tok, out_cell, out_pc, out_meta)
        meta = out_meta.tolist()
        if memory is not None and fresh > 0:  # counted in chain_step: into the segments only
            memory.append_outputs(tokens, req_ids, b.keys, slots_l, new_tokens, meta[3], meta[4])
            memory.counted(fresh)
        elif memory is not None and fresh < 0:  # an eviction or a rebuild on the way: row by row, then draft
            self._memory_rows(tokens, num_tokens, rowdata, req_ids, slots_l, new_tokens, meta, floor)
            meta = out_meta.tolist()
            kept = sum(meta[2]) <= cfg.max_batch_draft_tokens
            if kept:
                kern.keep_drafts(rowdata[0], out_meta[2], out_tok, out_cell, out_pc, out_meta[1], b.last_len,
                                 b.last_tok, b.last_cells, b.last_p, b.last_src)
        counts = meta[2] if kept else self._keep_within_budget(rowdata[0], floor)
        if room is not None:  # the verified counts tell the next step's bookkeeping what was really drafted
            counts = [min(c, r) for c, r in zip(counts, room)]
        self._table_fresh = False
        self.last_budget = sum(counts)
        self._price_mark(n, self.last_budget, live, now)
        return [t[:c] for t, c in zip(out_tok.tolist(), counts)]

    def _slots_for(self, req_ids: list[str], new_counts: list[int], prompt_lens: np.ndarray,
                   key_of: Callable[[str], Hashable]) -> tuple[str, list[int], set[str]]:
        """``step_arrays``' bookkeeping: the guard's mode for this step, each row's slot (-1: not taken in,
        in an "off" step) and the set of request ids.  A steady batch -- the same requests in the same rows
        as the last step -- reuses that step's slots; otherwise the requests that left are retired and the
        new rows admitted (``_admit``)."""
        b = self.batch
        same = self._batch_rows
        if same is not None and req_ids == same[0]:
            live, slots_l = same[1], same[2]
        else:
            self._batch_rows = None
            live, slots_l = set(req_ids), None
            if self.states:
                self._retire_states(live)
            b.retire(b.active.keys() - live, self.cfg.max_dormant_requests)
        mode = self._guard(live, new_counts)
        if slots_l is None:
            active = b.active
            slots_l = [active.get(rid, -1) for rid in req_ids]
            if -1 in slots_l and mode != "off":  # (in an "off" step requests not seen yet are not taken in)
                self._admit(req_ids, slots_l, prompt_lens, key_of)
            if -1 not in slots_l:
                self._batch_rows = (list(req_ids), live, slots_l)
        return mode, slots_l, live

    def _keep_within_budget(self, slots: np.ndarray, floor: float) -> list[int]:
        """``step_arrays`` when the drafts exceed ``max_batch_draft_tokens``: the most probable draft
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

    def _memory_rows(self, tokens: np.ndarray, num_tokens: np.ndarray, rowdata: np.ndarray, req_ids: list[str],
                     slots_l: list[int], new_tokens: list[list[int]], meta: list[list[int]], floor: float) -> None:
        """``step_arrays`` when the step's new output makes the memory evict or grow: counted with
        ``SuffixMemory.extend_slots`` (the row-by-row semantics), then every row drafted
        (``kernels.propose_slots``) -- ``chain_step`` stopped after observing."""
        b, memory, cfg, k = self.batch, self.memory, self.cfg, self.k
        assert memory is not None
        rl = [r for r, (lo, hi) in enumerate(zip(meta[3], meta[4])) if hi > lo]
        rows, slots = np.array(rl, dtype=np.int64), rowdata[0]
        memory.extend_slots(tokens, rows, b.kid[slots[rows]], np.array([meta[3][r] for r in rl], dtype=np.int64),
                            np.array([meta[4][r] for r in rl], dtype=np.int64), b.start[slots[rows]],
                            [req_ids[r] for r in rl], [b.keys[slots_l[r]] for r in rl], [new_tokens[r] for r in rl])
        for r in rl:
            b.seglen[slots_l[r]] = memory.segment_length(req_ids[r])
        out_tok, out_cell, out_pc, out_meta = self._outputs  # type: ignore[misc]
        sc = self._scratch
        load_kernels().propose_slots(tokens, slots, num_tokens, rowdata[1], b.start, b.kid, b.hist_a, b.hist_e,
                                     self.table.p_array, k, cfg.min_match, cfg.max_match, *memory.lookup_tables(),
                                     floor, CTX0, MEM0, DEPTHS, sc[0], sc[1], sc[2], sc[3], sc[4], sc[5], out_tok,
                                     out_cell, out_pc, out_meta[0], out_meta[1], out_meta[2])

    def _admit(self, req_ids: list[str], slots: list[int], prompt_lens: np.ndarray,
               key_of: Callable[[str], Hashable]) -> None:
        """Slots for the rows of ``req_ids`` without one (``slots[i]`` -1): a request back from the
        dormant slots, one the slow path held (its state imported, ``BatchRows.import_state``), or a
        new one."""
        b, memory = self.batch, self.memory
        for i, rid in enumerate(req_ids):
            if slots[i] >= 0:
                continue
            s = b.dormant.pop(rid, None)
            if s is None:
                st = self.states.pop(rid, None) or self._dormant.pop(rid, None)
                if st is not None:
                    s = b.import_state(st, memory.kid_for(st.isolation_key) if memory is not None else -1,
                                       memory.segment_length(rid) if memory is not None else 0)
                    b.parked[rid] = st
                else:
                    key = key_of(rid)
                    s = b.new_slot(key, int(prompt_lens[i]), memory.kid_for(key) if memory is not None else -1,
                                   memory.segment_length(rid) if memory is not None else 0)
            b.active[rid] = slots[i] = s

    def _export_rows(self, rows: list[RowStep]) -> None:
        """Before a slow-path step: the rows' requests that the batch path held get their state back
        (``BatchRows.export``), the batch path's other requests become dormant slots."""
        b = self.batch
        for row in rows:
            s = b.pop(row.req_id)
            if s is None:
                continue
            st = b.parked.pop(row.req_id, None) or RequestState(self.cfg, self.k, row.prompt_len, self.shared)
            st.isolation_key = b.keys[s]
            b.export(s, st, row.context)
            b.release(s)
            self.states[row.req_id] = st
        b.retire(list(b.active), self.cfg.max_dormant_requests)

    def _off(self, rows: list[RowStep]) -> list[list[int]]:
        """A step without drafts, at almost no cost: the rows are not even observed.  Why: a guard that
        switched drafting off because it does not pay must not keep paying the proposer's upkeep (at
        batch 32 on the 2-core CPU 5-10% of a step).  Nothing is lost: a request's next observation sees
        the gap (``RequestState.observe``: not continuous) and indexes the committed tokens it missed,
        as after a preemption; the output memory catches up the same way (``memory_seen``)."""
        self.last_budget = 0
        for row in rows:
            st = self.states.get(row.req_id)
            if st is not None:
                st.last_draft, st.last_cells, st.last_p, st.last_source = [], [], [], SOURCE_NONE
        return [[] for _ in rows]

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

    def _guard(self, live: set[str], new_counts: list[int]) -> str:
        """Policies "chain" and "ema": "chain" (draft as configured), "strict" (policy "chain": draft at the
        ``chain_strict_min_p`` floor) or "off" for the next step.  The step just done is credited to the
        mode that made its drafts (committed tokens / time between two calls); above
        ``guard_batch_size`` rows the arbiter of the batch's bucket (powers of two: 17-32 rows, 33-64, ...)
        decides: every mode is measured first (interleaved, 8 steps each, or 4 when the best is then
        ahead by 1.25x), then a loser is re-tried 2 steps in 64, in turn -- a loser that keeps losing by
        1.25x or more ever more rarely, down to 2 in ``guard_max_retry_steps``.  Only pure decode steps
        are credited -- the rows now all ran in the step measured and all committed tokens: a step that also prefilled a joining request (or a chunk of one) is
        slow for reasons neither mode controls."""
        if self._guard_last is None and len(new_counts) <= self.cfg.guard_batch_size:
            return "chain"  # (no step to credit, none to time: not even the clock is read)
        now = self.clock()
        last, self._guard_last = self._guard_last, None
        if last is not None and live <= last[3] and all(new_counts):
            self.guards[last[1]].observe(last[0], sum(new_counts), now - last[2])
        cfg = self.cfg
        if len(new_counts) <= cfg.guard_batch_size or not any(new_counts):
            return "chain"
        bucket = batch_bucket(len(new_counts))
        arbiter = self.guards.get(bucket)
        if arbiter is None:
            strict = cfg.policy == "chain" and cfg.chain_strict_min_p > self.chain_floor(bucket)
            modes = ("chain", "strict", "off") if strict else ("chain", "off")
            # backing off from a decisive loser: LookaheadConfig.guard_max_retry_steps says why
            arbiter = self.guards[bucket] = LayoutArbiter(modes, explore_every=64, explore_steps=2, warmup_steps=8,
                                                          max_explore_every=cfg.guard_max_retry_steps)
        mode = arbiter.choose()
        self._guard_last = (mode, bucket, now, live)
        return mode

    def _budgets(self, rows: list[RowStep], states: list[RequestState]) -> tuple[list[int], list[bool]]:
        """Draft budget per row, and whether the row may only draft confident context matches."""
        cfg = self.cfg
        busy = len(rows) > cfg.batch_size_threshold
        free = len(rows) <= cfg.free_draft_batch_size
        want, confident = [], []
        for row, st in zip(rows, states):
            if not row.new_tokens:  # still in prefill: nothing to draft from yet
                want.append(0)
                confident.append(False)
                continue
            floor = cfg.busy_min_acceptance if busy else (0.0 if free else cfg.min_acceptance)
            if st.ema >= floor:
                st.idle_steps = 0
                want.append(self.k)
                confident.append(False)
            else:
                st.idle_steps += 1
                probe = st.idle_steps % cfg.probe_interval == 0
                want.append(self.k if probe or cfg.confident_fallback else 0)
                confident.append(not probe)
        total = sum(want)
        if total <= cfg.max_batch_draft_tokens:
            return want, confident
        budgets = [0] * len(want)
        left = cfg.max_batch_draft_tokens
        for i in sorted(range(len(want)), key=lambda i: -states[i].ema):
            take = min(want[i], left)
            budgets[i] = take
            left -= take
        return budgets, confident

    def _step_cost(self, rows: list[RowStep], live: set[str], strict: bool = False) -> list[list[int]]:
        """Policies "chain" and "cost": observe, then every row's best candidate from every source
        (core/chain.py), cut where its estimated commit probability falls below ``chain_floor`` of the
        batch ("chain"; ``strict``: at least ``chain_strict_min_p``, the guard's choice) or for the
        whole batch by the step-time model ("cost", core/cost_model.py)."""
        chain = self.cfg.policy == "chain"
        now = 0.0 if chain else self.clock()  # the step-time model's clock (policy "cost" only)
        last = self._last_step
        if not chain and last is not None and live <= last[0] and all(r.new_tokens for r in rows):
            # the step just done ran last step's rows and drafts; no request joined (no prefill in it)
            self.cost.observe(last[1], last[2], now - last[3])
        table, memory = self.table, self.memory
        # LADE's pool and Jacobi iterate: their drafts are accepted least often, so they pay only where
        # rows are cheap; above `pool_max_batch` rows their upkeep (indexing, trajectories) is skipped
        use_pool = len(rows) <= self.cfg.pool_max_batch
        states: list[RequestState] = []
        # every row's committed tokens side by side (`flat`, row i at offs[i]): the memory counts them and
        # (without the pool) the compiled twin of propose_chain drafts from them, one kernel call each
        parts, offs, sizes, fresh = [], [], [], []  # sizes: 0 for a row still prefilling (no draft)
        off = 0
        known = self.states
        for row in rows:
            st = known.get(row.req_id) or self._state(row)
            st.use_pool = use_pool
            cells, probs = st.last_cells, st.last_p
            st.last_outcome = None
            st.observe(row.context, row.num_tokens, row.new_tokens, row.verified, row.argmax)
            if st.last_outcome is not None and cells:
                verified, accepted = st.last_outcome
                table.record(cells, verified, accepted)
                d = 0.9  # the request's own history: decayed accepted vs expected tokens
                st.hist_accepted = d * st.hist_accepted + accepted
                st.hist_expected = d * st.hist_expected + sum(probs[:verified])  # E[accepted] = sum p_cum
            st.last_cells, st.last_p = [], []
            states.append(st)
            n = len(st.index.tokens)
            parts.append(st.index.buf[:n])
            offs.append(off)
            sizes.append(n if row.new_tokens else 0)
            # the output tokens the memory has not seen (never the prompt), counted from `flat`
            start = st.memory_seen if st.memory_seen > row.prompt_len else row.prompt_len
            if row.num_tokens > start:
                fresh.append((row.req_id, st.isolation_key, st.index.tokens, off, n - (row.num_tokens - start)))
            st.memory_seen = row.num_tokens
            off += n
        flat = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else _EMPTY  # one row: no copy
        if memory is not None:
            memory.extend_rows(flat, fresh)
        floor = self.chain_floor(len(rows)) if chain else 0.0
        if strict:
            floor = max(floor, self.cfg.chain_strict_min_p)
        if use_pool or not self.compiled_rows:
            cands = []
            for row, st in zip(rows, states):
                if not row.new_tokens:  # still in prefill: nothing to draft from yet
                    cands.append(([], [], []))
                    continue
                draft, cells, pc, source = propose_chain(st, self.k, table, memory, use_pool)
                st.last_source = source
                cands.append((draft, cells, pc))
            # p_cum does not increase along a draft: each row's count is its prefix above the floor
            counts = [_count_above(pc, floor) for _, _, pc in cands]
        else:
            cands, counts = self._propose_rows(states, flat, offs, sizes, floor)
        if not chain:
            counts = self.cost.allocate(*self._flat(cands), len(rows), max_total=self.cfg.max_batch_draft_tokens).tolist()
        elif sum(counts) > self.cfg.max_batch_draft_tokens:  # over the batch's budget: the most probable
            counts = threshold_allocate(*self._flat(cands), len(rows), floor, self.cfg.max_batch_draft_tokens).tolist()
        out = []
        total = 0
        for st, (draft, cells, pc), n in zip(states, cands, counts):
            st.last_draft, st.last_cells, st.last_p = draft[:n], cells[:n], pc[:n]
            if not n:
                st.last_source = SOURCE_NONE
            total += n
            out.append(list(draft[:n]))
        self.last_budget = total
        if not chain:  # the step-time model's next observation (policy "cost")
            self._last_step = (live, len(rows) + total, total, now)
        return out

    def _propose_rows(self, states: list[RequestState], flat: np.ndarray, offs: list[int], sizes: list[int],
                      floor: float) -> tuple[list[tuple[list[int], list[int], list[float]]], list[int]]:
        """``propose_chain`` without pool and Jacobi for every row, in one compiled call
        (``kernels.propose_rows``, the same drafts): the candidates (tokens, cells, p_cum) and how many
        of each clear ``floor``.  Row i's tokens are ``flat[offs[i]:offs[i] + sizes[i]]`` (size 0: no
        draft).  Why: above ``pool_max_batch`` rows the proposer's cost was Python per row; here it is a
        few attribute reads per row and a fixed handful of array operations per step (each a
        microsecond or more: the outputs are reused while the batch keeps its size)."""
        n, k, memory = len(states), self.k, self.memory
        bounds = np.array((offs, sizes), dtype=np.int64)
        # the requests' decayed accepted and expected tokens, as two contiguous rows
        hist = np.array(([st.hist_accepted for st in states], [st.hist_expected for st in states]), dtype=np.float64)
        kid_of = memory.key_id if memory is not None else (lambda key: -1)
        kids = np.array([kid_of(st.isolation_key) for st in states], dtype=np.int64)
        out = self._outputs
        if out is None or len(out[0]) != n:
            out = self._outputs = (np.zeros((n, k), dtype=np.int32), np.zeros((n, k), dtype=np.int64),
                                   np.zeros((n, k), dtype=np.float64), np.zeros((5, n), dtype=np.int64))
        out_tok, out_cell, out_pc, out_meta = out  # out_meta: length, source, count above the floor (+ 2 rows: chain_step)
        s = self._scratch
        tables = memory.lookup_tables() if memory is not None else (_NO_KEYS, _NO_COUNTS, _NO_COUNTS, _NO_COUNTS, 1)
        load_kernels().propose_rows(
            flat, bounds[0], bounds[1], kids, hist[0], hist[1], self.table.p_array, k, self.cfg.min_match,
            self.cfg.max_match, *tables, floor, CTX0, MEM0, DEPTHS, s[0], s[1], s[2], s[3], s[4], s[5], out_tok,
            out_cell, out_pc, out_meta[0], out_meta[1], out_meta[2])
        tl, cl, pl, (ln, src, counts) = out_tok.tolist(), out_cell.tolist(), out_pc.tolist(), out_meta[:3].tolist()
        cands = []
        for i, st in enumerate(states):
            m = ln[i]
            st.last_source = _SOURCES[src[i]]
            cands.append((tl[i][:m], cl[i][:m], pl[i][:m]))
        return cands, counts

    @staticmethod
    def _flat(cands: list[tuple[list[int], list, list[float]]]) -> tuple[np.ndarray, np.ndarray]:
        """Every candidate token's commit probability and its row, flat (for the batch-wide cuts)."""
        flat_p = [x for _, _, pc in cands for x in pc]
        owner = [i for i, (_, _, pc) in enumerate(cands) for _ in pc]
        return np.asarray(flat_p, dtype=np.float64), np.asarray(owner, dtype=np.int64)

    def chain_floor(self, batch: int) -> float:
        """Policy "chain": the commit probability a draft token needs in a batch of ``batch`` rows --
        ``chain_min_p`` at one row, rising linearly to ``chain_busy_min_p`` at ``batch_size_threshold``
        rows and staying there.  Why it may rise: a draft token pays when its commit probability beats
        the tokens the step's time would serve otherwise (p >= cost of one row x tokens/s), and the
        batch's tokens/s grows with the batch.  On the 2-core CPU a step's time hardly grows with its
        draft rows at k <= 4, so the default keeps it flat there, and raises it with longer drafts
        (``LookaheadConfig.busy_floor``).  With ``measured_floor`` (the default) that rule is applied to
        the engine's own measurements once a batch-size bucket has them: the floor is the measured price
        of a draft row (``DraftRowPrice``) capped at ``MAX_MEASURED_FLOOR``, and never below ``chain_min_p``;
        the configured floors serve until then."""
        lo, hi, top = self.cfg.chain_min_p, self.cfg.busy_floor(self.k), self.cfg.batch_size_threshold
        if self._measure_price:
            price = self.row_price.price(batch)
            if price is not None:  # measured: capped at MAX_MEASURED_FLOOR, never below chain_min_p
                return max(min(price, MAX_MEASURED_FLOOR), lo)
        if batch >= top:
            return hi
        return lo + (hi - lo) * max(0, batch - 1) / max(1, top - 1)

    def forget(self, req_id: str) -> None:
        self._batch_rows = None
        self.states.pop(req_id, None)
        self._dormant.pop(req_id, None)
        self.batch.parked.pop(req_id, None)
        slot = self.batch.pop(req_id)
        if slot is not None:
            self.batch.release(slot)

    def summary(self) -> dict[str, object]:
        all_states = list(self.states.values()) + list(self._dormant.values())
        # a request the batch path holds: counts before it moved there (parked) plus its slot's
        by_source = {name: list(v) for name, v in self.batch.by_source().items()}
        for s in all_states + list(self.batch.parked.values()):
            for source, (d, a) in s.stats.by_source.items():
                tot = by_source.setdefault(source, [0, 0])
                tot[0] += d
                tot[1] += a
        drafted = sum(d for d, _ in by_source.values())
        accepted = sum(a for _, a in by_source.values())
        requests = len(all_states) + len(self.batch.active) + len(self.batch.dormant)
        return {"policy": self.cfg.policy, "requests": requests, "drafted": drafted, "accepted": accepted,
                "acceptance_rate": accepted / drafted if drafted else 0.0,
                "by_source": {k: {"drafted": d, "accepted": a} for k, (d, a) in sorted(by_source.items())},
                "memory_tokens": len(self.memory) if self.memory is not None else 0,
                "cost_model": self.cost.summary(),
                "row_price": self.row_price.summary() if self._measure_price else None,
                "guard": {str(b): a.summary() for b, a in self.guards.items()}}
