"""One chain drafter over every source, with a per-token acceptance estimate (policies "chain" and "cost").

Sources, each offering one candidate chain for the positions after the last committed token:
  * ``context``: prompt lookup over the request's prompt + output (longest suffix, up to ``max_match``;
    its evidence: the match length and whether the suffix's earlier occurrences agree on what follows);
  * ``memory``: the engine-wide memory of earlier outputs under the request's isolation key
    (``SuffixMemory``: longest suffix up to ``memory_depth``, most frequent continuation);
  * ``pool``: LADE's n-gram pool of the request (prompt, output and Jacobi-trajectory n-grams), the
    candidate agreeing with the Jacobi iterate first;
  * ``jacobi``: the Jacobi iterate itself.

Why estimates instead of a fixed k: a draft token is worth its row only if it is likely to be committed.
``AcceptanceTable`` learns, for each source, evidence bucket (match length, frequency, agreement with
the iterate) and draft position, P(token accepted | its predecessors were) from the verifications the
engine has already done -- Beta-smoothed towards a prior, so it is usable from the first step.  A
request's own history scales a candidate (``RequestState.hist_*``: accepted / expected, clipped).  The candidate
with the most expected committed tokens wins; how much of it is drafted is decided by its estimated
commit probability: policy "chain" drafts while it stays above a floor (suffix decoding's rule, on learned
estimates), policy "cost" cuts the whole batch's drafts with ``StepCostModel.allocate`` (long where the
estimate is high, nothing where it is low).
"""

from __future__ import annotations

import numpy as np

from .state import (
    HISTORY_PRIOR,
    SOURCE_CONTEXT,
    SOURCE_JACOBI,
    SOURCE_NONE,
    SOURCE_POOL,
    RequestState,
    _agreement,
)
from .suffix_memory import SuffixMemory

SOURCE_MEMORY = "memory"
DEPTHS = 4  # draft positions 1, 2, 3, 4+ have their own cells
# evidence buckets: context (the matched suffix occurred once / more often, always followed by the drafted
# token / more often, followed by different tokens: ``kernels.suffix_match_evidence``) x match length 1..4+;
# memory (matched length 1-2 / 3-5 / 6+) x (smoothed frequency <0.4 / <0.7 / <0.9 / >=0.9); pool (agrees
# with the Jacobi iterate or not); Jacobi
CTX0, MEM0, POOL0, JAC0, BUCKETS = 0, 12, 24, 26, 27
CTX_SINGLE, CTX_UNANIMOUS, CTX_SPLIT = 0, 1, 2  # as core/kernels.py numbers them
_PRIOR_CTX = [0.3, 0.5, 0.6, 0.7] + [0.5, 0.7, 0.8, 0.85] + [0.2, 0.3, 0.35, 0.4]
_PRIOR_MEM_FREQ = [0.3, 0.5, 0.7, 0.85]
_PRIOR = np.array(_PRIOR_CTX + [f for _ in range(3) for f in _PRIOR_MEM_FREQ] + [0.35, 0.2, 0.15])
_FREQ_EDGES = (0.4, 0.7, 0.9)
# agreement between the context and the memory candidates, per draft token (``agreement_offsets``): the table
# holds one block of BUCKETS x DEPTHS cells per state -- ALONE (the other source has no token there, or
# diverged earlier), AGREE (it drafts the same token after the same prefix), CONFLICT (it drafts a different
# one).  Why: replayed at batch 1 (demo model, 48 copy prompts, k=8), a memory draft's first token was
# accepted 0.418 of the time where the context draft had a different token there, 0.829 where it had the
# same, 0.654 where it had none (open prompts: 0.341 / 0.866 / 0.521) -- evidence neither source's own
# counts carry (benchmarks/results/draft_ranking_{copy,open}_48_agree.json, ``first_token_by_agreement``).
ALONE, AGREE, CONFLICT = 0, 1, 2  # as core/kernels.py numbers them
AGREE_STATES = 3
BLOCK = BUCKETS * DEPTHS
_PRIOR_ALL = np.concatenate([_PRIOR, 1.0 - 0.5 * (1.0 - _PRIOR), 0.6 * _PRIOR])


def _cells(bucket: int, n: int) -> list[int]:
    """Cells of an n-token draft whose tokens all fall in ``bucket`` (positions 1, 2, 3, 4+)."""
    return [bucket * DEPTHS + min(j, DEPTHS - 1) for j in range(n)]


_CELLS = [[_cells(b, n) for n in range(65)] for b in range(BUCKETS)]  # precomputed: no per-token work


def ctx_bucket(match_len: int, evidence: int = CTX_SINGLE) -> int:
    """The context bucket of a match of ``match_len`` tokens with evidence class ``evidence``."""
    return CTX0 + 4 * evidence + min(match_len, 4) - 1


def mem_cells(match_len: int, freqs: list[float], first: int = 0) -> list[int]:
    """Cells of memory draft tokens at positions ``first``, ``first`` + 1, ...: the bucket of (matched
    context length 1-2 / 3-5 / 6+) x (the token's smoothed frequency, ``_FREQ_EDGES``)."""
    base = MEM0 + 4 * (0 if match_len <= 2 else (1 if match_len <= 5 else 2))
    e0, e1, e2 = _FREQ_EDGES
    last = DEPTHS - 1
    return [(base + (0 if f < e0 else (1 if f < e1 else (2 if f < e2 else 3)))) * DEPTHS + (j if j < last else last)
            for j, f in enumerate(freqs, start=first)]


def agreement_offsets(cells: list[int], draft: list[int], other: list[int]) -> list[int]:
    """``cells`` moved to the AGREE block where ``other`` (the other source's candidate) drafts the same
    tokens as ``draft``, and to the CONFLICT block at the first token where it drafts a different one;
    the rest stay ALONE.  ``cells`` is changed in place and returned."""
    n = min(len(draft), len(other))
    j = 0
    while j < n and draft[j] == other[j]:
        cells[j] += AGREE * BLOCK
        j += 1
    if j < n:
        cells[j] += CONFLICT * BLOCK
    return cells


class AcceptanceTable:
    """P(draft token accepted | its predecessors were), per (evidence bucket, draft position).

    The counts and estimates live in numpy arrays (``evaluated``, ``accepted``, ``p_array``: rows of
    ``arrays``) that the compiled batch step updates in place (``kernels.observe_rows``); ``p`` is the same estimates as a
    Python list, which ``propose_chain`` reads element by element (a list index is ~5x faster than a
    numpy one) -- ``refresh()`` copies them over after a compiled update."""

    def __init__(self, prior_weight: float = 4.0, cap: float = 4096.0) -> None:
        # rows: evaluated, accepted, estimate, prior -- one array, one argument of the compiled batch step
        self.arrays = np.zeros((4, AGREE_STATES * BLOCK), dtype=np.float64)
        self.evaluated, self.accepted, self.p_array, self.prior_array = self.arrays
        self.prior_array[:] = np.repeat(_PRIOR_ALL, DEPTHS)
        self.p_array[:] = self.prior_array  # the estimates for the compiled proposer
        self.prior = self.prior_array.tolist()
        self.weight = prior_weight
        self.cap = cap  # a cell's counts are halved past this, so the table follows a changing workload
        self.p: list[float] = list(self.prior)

    def record(self, cells: list[int], verified: int, accepted: int) -> None:
        """The first ``verified`` tokens of a draft with these cells were verified, ``accepted`` of
        them accepted: tokens 1..accepted+1 were evaluated (each given its predecessors).  The touched
        cells' estimates are updated at once (a few floats; no per-step pass over the table)."""
        ev, acc, p, w, prior, arr = self.evaluated, self.accepted, self.p, self.weight, self.prior, self.p_array
        for j, c in enumerate(cells[: min(accepted + 1, verified)]):
            e, a = float(ev[c]) + 1.0, float(acc[c]) + (1.0 if j < accepted else 0.0)
            if e > self.cap:
                e, a = 0.5 * e, 0.5 * a
            ev[c], acc[c] = e, a
            p[c] = arr[c] = (a + w * prior[c]) / (e + w)

    def refresh(self) -> None:
        """``p`` from ``p_array``, after the compiled step updated the arrays."""
        self.p = self.p_array.tolist()

    def summary(self) -> dict[str, list[float]]:
        return {"p": [round(x, 3) for x in self.p_array.tolist()],
                "evaluated": [round(x, 1) for x in self.evaluated.tolist()]}


def history_factor(st: RequestState) -> float:
    """The request's accepted / expected tokens (decayed sums, ``HISTORY_PRIOR`` smoothing), clipped to
    [0.3, 1.6].  It scales a candidate's p_cum once (``_better``), not each token's estimate: the
    ratio is one of expected committed tokens, and compounded over eight positions it turned a ratio
    of 1.3 into a factor of 8."""
    h = HISTORY_PRIOR
    return min(max((st.hist_accepted + h) / (st.hist_expected + h), 0.3), 1.6)


def _better(best: tuple[float, list[int], list[int], list[float], str], draft: list[int], cells: list[int],
            source: str, p: list[float], rho: float) -> tuple[float, list[int], list[int], list[float], str]:
    """``best`` or the candidate (draft, cells, source), whichever has more expected committed tokens
    (p_cum: ``rho`` x the product of its tokens' estimates, at most 0.98)."""
    acc, pc, total = rho, [], 0.0
    for c in cells:
        acc = min(acc * p[c], 0.98)
        pc.append(acc)
        total += acc
    return (total, draft, cells, pc, source) if total > best[0] else best


def propose_chain(st: RequestState, k: int, table: AcceptanceTable, memory: SuffixMemory | None,
                  use_pool: bool) -> tuple[list[int], list[int], list[float], str]:
    """The best candidate of every source for ``st``: (tokens, cells, p_cum per token, source).

    ``p_cum`` is non-increasing: the estimated probability that the token *and* all before it are
    committed.  ``use_pool``: also consider the pool and the Jacobi iterate (skipped when the batch's
    threshold is out of their reach, to save proposer time)."""
    toks = st.index.tokens
    if not toks:
        return [], [], [], SOURCE_NONE
    p = table.p
    rho = history_factor(st)
    # the best so far: (expected committed tokens, tokens, cells, p_cum per token, source)
    best: tuple[float, list[int], list[int], list[float], str] = (0.0, [], [], [], SOURCE_NONE)
    cont, m, evidence = st.index.lookup_evidence(k)
    mt, mp, mm = memory.lookup_from(st.isolation_key, st.index.buf, len(toks), k) if memory is not None else ([], [], 0)
    if cont:
        cells = agreement_offsets(list(_CELLS[ctx_bucket(m, evidence)][len(cont)]), cont, mt)
        best = _better(best, cont, cells, SOURCE_CONTEXT, p, rho)
    if mt:
        best = _better(best, mt, agreement_offsets(mem_cells(mm, mp), mt, cont), SOURCE_MEMORY, p, rho)
    if use_pool:
        jac = st.jacobi
        cands = st.pool.get(toks[-1])
        if cands:
            i = max(range(len(cands)), key=lambda i: (_agreement(cands[i], jac), -i))
            agree = bool(jac) and cands[i][0] == jac[0]
            draft = list(cands[i])
            while len(draft) < k:  # chain pool look-ups from the draft's last token
                nxt = st.pool.get(draft[-1])
                if not nxt:
                    break
                draft.extend(nxt[0][: k - len(draft)])
            draft = draft[:k]
            best = _better(best, draft, list(_CELLS[POOL0 if agree else POOL0 + 1][len(draft)]), SOURCE_POOL, p, rho)
        if jac:
            jd = jac[:k]
            best = _better(best, list(jd), list(_CELLS[JAC0][len(jd)]), SOURCE_JACOBI, p, rho)
    _, draft, cells, pc, source = best
    if draft and len(draft) < k and memory is not None and source in (SOURCE_CONTEXT, SOURCE_MEMORY):
        # a short context/memory chain continues with what the memory says follows it
        tail = (toks[-memory.depth :] + draft)[-memory.depth :]
        mt, mp, mm = memory.lookup(st.isolation_key, tail, k - len(draft))
        acc = pc[-1]
        for t, c in zip(mt, mem_cells(mm, mp, len(draft))):
            acc = min(acc * p[c], 0.98)
            draft.append(t)
            cells.append(c)
            pc.append(acc)
    return draft, cells, pc, source
