"""The drafter's algorithm in plain Python: the reference ``LookaheadDrafter`` (compiled kernels over slot
arrays) is twin-tested against (tests/core/test_chain.py).  One request at a time, no guard, no measured
floor: what a step drafts for every row, from the same inputs.  The output memory is ``SuffixMemory``
itself (its look-ups are checked against brute force in test_chain.py); everything else -- crediting a
verified draft to the acceptance table and the request's history, the context match with its evidence,
scoring and choosing a candidate, extending it from the memory, the floor cut and the batch budget -- is
written out here.  And ``step_rows``: the tests' batches, one ``RowStep`` per request, given to the compiled
drafter's ``step``."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

from vllm_lookahead.core.acceptance import (
    AGREE,
    BLOCK,
    CLASS_CELLS,
    CONFLICT,
    CTX0,
    DEPTHS,
    MEM0,
    AcceptanceTable,
    sampler_class,
)
from vllm_lookahead.core.config import LookaheadConfig
from vllm_lookahead.core.drafter import LookaheadDrafter, RowStep
from vllm_lookahead.core.kernels import HISTORY_PRIOR
from vllm_lookahead.core.suffix_memory import SuffixMemory


def step_rows(drafter: LookaheadDrafter, rows: list[RowStep]) -> list[list[int]]:
    """``drafter.step`` for one ``RowStep`` per running request: their contexts copied into one token array,
    as the engine's runner holds them."""
    n = len(rows)
    tokens = np.zeros((n, max([r.num_tokens for r in rows] + [1])), dtype=np.int32)
    for i, r in enumerate(rows):
        tokens[i, : r.num_tokens] = np.asarray(r.context[: r.num_tokens], dtype=np.int32)
    keys = {r.req_id: r.isolation_key for r in rows}
    temperatures = {r.req_id: r.temperature for r in rows}
    return drafter.step([r.req_id for r in rows], tokens, np.array([r.num_tokens for r in rows], dtype=np.int32),
                        [list(r.new_tokens) for r in rows], [r.verified for r in rows],
                        np.array([r.prompt_len for r in rows], dtype=np.int32), keys.__getitem__,
                        temperature_of=temperatures.__getitem__)


def suffix_match_evidence(toks: list[int], min_match: int, max_match: int) -> tuple[int, int, int]:
    """(end, length, evidence class) of the most recent earlier occurrence of the longest suffix of ``toks``
    (``min_match`` <= length <= ``max_match``); class 0: it occurred once, 1: more often and always followed
    by the same token, 2: followed by different tokens.  (-1, 0, 0) if none."""
    n = len(toks)
    best_end, best_len = -1, 0
    for length in range(min(max_match, n - 1), min_match - 1, -1):
        suffix = toks[n - length:]
        ends = [e for e in range(length, n) if toks[e - length:e] == suffix]
        if ends:
            best_end, best_len = ends[-1], length
            followers = [toks[e] for e in ends]
            if len(ends) == 1:
                return best_end, best_len, 0
            return best_end, best_len, 1 if all(t == toks[best_end] for t in followers) else 2
    return best_end, best_len, 0


def mem_cell(matched: int, freq: float, j: int) -> int:
    bucket = MEM0 + 4 * (0 if matched <= 2 else (1 if matched <= 5 else 2))
    bucket += 0 if freq < 0.4 else (1 if freq < 0.7 else (2 if freq < 0.9 else 3))
    return bucket * DEPTHS + min(j, DEPTHS - 1)


def agreement(cells: list[int], draft: list[int], other: list[int]) -> list[int]:
    """Cells of tokens the other source drafts too move to the AGREE block, the first it drafts differently
    to the CONFLICT block."""
    j = 0
    while j < min(len(draft), len(other)) and draft[j] == other[j]:
        cells[j] += AGREE * BLOCK
        j += 1
    if j < min(len(draft), len(other)):
        cells[j] += CONFLICT * BLOCK
    return cells


def p_cum(cells: list[int], p: list[float], rho: float) -> list[float]:
    out, acc = [], rho
    for c in cells:
        acc = min(acc * p[c], 0.98)
        out.append(acc)
    return out


@dataclass
class Request:
    start: int = 0  # where the request's scanned tokens begin (a long prompt's tail)
    seen: int = 0
    memory_seen: int = 0
    prompt_len: int = 0
    key: Hashable = None
    draft: list[int] = field(default_factory=list)  # what was drafted last step (before any room cut)
    cells: list[int] = field(default_factory=list)
    p: list[float] = field(default_factory=list)
    hist_accepted: float = 0.0
    hist_expected: float = 0.0
    offset: int = 0  # the request's sampler class's first cell in the acceptance table


class ReferenceDrafter:
    def __init__(self, cfg: LookaheadConfig, k: int) -> None:
        self.cfg, self.k = cfg, k
        self.table = AcceptanceTable()
        self.p = self.table.p_array.tolist()
        self.memory = SuffixMemory(cfg.memory_tokens, cfg.memory_depth) if cfg.memory_tokens > 0 else None
        self.requests: dict[str, Request] = {}

    def floor(self, batch: int) -> float:
        lo, hi, top = self.cfg.chain_min_p, self.cfg.busy_floor(self.k), self.cfg.batch_size_threshold
        return hi if batch >= top else lo + (hi - lo) * max(0, batch - 1) / max(1, top - 1)

    def observe(self, rid: str, tokens: list[int], new: list[int], verified: int, prompt_len: int,
                key: Hashable, temperature: float = 0.0) -> Request:
        rq = self.requests.setdefault(rid, Request(prompt_len=prompt_len, key=key,
                                                   offset=sampler_class(temperature) * CLASS_CELLS))
        n = len(tokens)
        last = rq.draft if rq.seen > 0 and n == rq.seen + len(new) else []
        rq.draft = []
        if n > rq.seen:
            if rq.seen == 0:
                rq.start = max(0, n - self.cfg.max_prompt_index_tokens)
            rq.seen = n
        lo = max(rq.memory_seen if rq.memory_seen > rq.prompt_len else rq.prompt_len, rq.start)
        if self.memory is not None and n > lo:
            self.memory.add([rid], [rq.key], np.asarray([tokens[:n]], dtype=np.int32), [lo], [n], [rq.start])
        rq.memory_seen = n
        d = min(len(last), verified)
        if new and d:
            accepted = len(new) - 1
            w, prior, ev, acc = self.table.weight, self.table.prior_array, self.table.evaluated, self.table.accepted
            for j, c in enumerate(rq.cells[: min(accepted + 1, d)]):
                e, a = float(ev[c]) + 1.0, float(acc[c]) + (1.0 if j < accepted else 0.0)
                if e > self.table.cap:
                    e, a = 0.5 * e, 0.5 * a
                ev[c], acc[c] = e, a
                self.p[c] = (a + w * float(prior[c])) / (e + w)
            expected = 0.0
            for x in rq.p[:d]:
                expected += x
            rq.hist_accepted = 0.9 * rq.hist_accepted + accepted
            rq.hist_expected = 0.9 * rq.hist_expected + expected
        return rq

    def candidate(self, rq: Request, toks: list[int]) -> tuple[list[int], list[int], list[float]]:
        """The best candidate (tokens, cells, p_cum) for a request's scanned tokens ``toks``: cells within
        its sampler class (``Request.offset`` added by the caller)."""
        k, memory, cfg = self.k, self.memory, self.cfg
        p = self.p[rq.offset : rq.offset + CLASS_CELLS]
        rho = min(max((rq.hist_accepted + HISTORY_PRIOR) / (rq.hist_expected + HISTORY_PRIOR), 0.3), 1.6)
        mt, mp, mm = memory.lookup(rq.key, toks, k) if memory is not None else ([], [], 0)
        end, m, cls = suffix_match_evidence(toks, cfg.min_match, cfg.max_match)
        ct = toks[end:end + k] if end >= 0 else []
        best: tuple[float, list[int], list[int], list[float]] = (0.0, [], [], [])
        if ct:
            bucket = CTX0 + 4 * cls + min(m, 4) - 1
            cells = agreement([bucket * DEPTHS + min(j, DEPTHS - 1) for j in range(len(ct))], ct, mt)
            pc = p_cum(cells, p, rho)
            if sum(pc) > best[0]:
                best = (sum(pc), ct, cells, pc)
        if mt:
            cells = agreement([mem_cell(mm, f, j) for j, f in enumerate(mp)], mt, ct)
            pc = p_cum(cells, p, rho)
            if sum(pc) > best[0]:
                best = (sum(pc), mt, cells, pc)
        _, draft, cells, pc = best
        draft, cells, pc = list(draft), list(cells), list(pc)
        if memory is not None and 0 < len(draft) < k:  # a short chain continues with what the memory says
            tail = (toks + draft)[-memory.depth:]
            et, ep, em = memory.lookup(rq.key, tail, k - len(draft))
            acc = pc[-1]
            for t, f in zip(et, ep):
                c = mem_cell(em, f, len(draft))
                acc = min(acc * p[c], 0.98)
                draft.append(t)
                cells.append(c)
                pc.append(acc)
        return draft, cells, pc

    def step(self, rows: list[tuple[str, list[int], list[int], int, int, Hashable, float]]) -> list[list[int]]:
        """Rows of (request id, committed tokens, new tokens, verified drafts, prompt length, isolation key,
        temperature)."""
        floor = self.floor(len(rows))
        cands, counts = [], []
        # every row's verification is credited first (to the shared table), then every row drafts
        states = [self.observe(rid, list(tokens), list(new), verified, prompt_len, key, temperature)
                  for rid, tokens, new, verified, prompt_len, key, temperature in rows]
        for rq, (_, tokens, new, _, _, _, _) in zip(states, rows):
            draft, cells, pc = self.candidate(rq, list(tokens[rq.start:])) if new else ([], [], [])
            cand = (draft, [c + rq.offset for c in cells], pc)
            n = 0
            while n < len(cand[2]) and cand[2][n] >= floor:
                n += 1
            cands.append(cand)
            counts.append(n)
        if sum(counts) > self.cfg.max_batch_draft_tokens:  # the batch's most probable draft tokens
            flat = [(pc, r) for r, (_, _, pcs) in enumerate(cands) for pc in pcs if pc >= floor]
            order = sorted(range(len(flat)), key=lambda i: -flat[i][0])[: self.cfg.max_batch_draft_tokens]
            counts = [0] * len(rows)
            for i in order:
                counts[flat[i][1]] += 1
        out = []
        for rq, (draft, cells, pc), n in zip(states, cands, counts):
            rq.draft, rq.cells, rq.p = draft[:n], cells[:n], pc[:n]
            out.append(draft[:n])
        return out

    def forget(self, rid: str) -> None:
        self.requests.pop(rid, None)
