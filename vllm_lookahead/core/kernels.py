"""The compiled kernels of the drafter (core/drafter.py): the context match, the output memory
(core/suffix_memory.py) and the whole per-step work on the slot arrays (core/batch_rows.py), in one
module that is imported on first use (``jit.load_kernels``).

Why a separate, lazily imported module: importing numba loads llvmlite, and vLLM 0.32's kernel-override
scan (``triton_utils.dispatcher._rebind_kernels``, run when a worker starts) crashes on llvmlite's FFI
object (vllm/fixes.py, ``safe_rebind_kernels``).  Importing ``vllm_lookahead.core`` -- which any of the
plugin's modules does -- must therefore not import numba: the kernels load when a drafter starts, inside
an engine that has already run its scan, and the proposer applies the scan fix for later engines first.

Memory hash tables: 64-bit keys (splitmix64 over the isolation key id and the context tokens, never 0:
0 marks an empty slot), linear probing; see core/suffix_memory.py for the layout.
"""

from __future__ import annotations

import numpy as np
from numba import njit


def compiled(fn):
    """numba's ``njit``, cached on disk where possible.  Why a wrapper: with ``cache=True`` numba refuses to
    even decorate a function when it finds no writable cache location (a read-only file system without
    ``NUMBA_CACHE_DIR`` or a writable ``HOME``) -- the import would fail.  Such a process compiles at
    start instead (about a second, once per process)."""
    try:
        return njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return njit(cache=False, nogil=True)(fn)


HISTORY_PRIOR = 8.0
"""Pseudo-tokens on both sides of a request's accepted / expected ratio (the history factor in
``_propose_one``): the ratio moves off 1 only once the request has a few steps of history."""

CTX_SINGLE, CTX_UNANIMOUS, CTX_SPLIT = 0, 1, 2  # core.acceptance's context evidence classes (see below)


@compiled
def suffix_match_evidence(toks: np.ndarray, n: int, min_match: int, max_match: int) -> tuple[int, int, int]:
    """The most recent earlier occurrence of the longest suffix of ``toks[:n]`` with ``min_match <= length
    <= max_match`` ("earlier": it ends before ``n``, so ``toks[end]`` is the first token that followed it),
    and how much the context agrees with that answer: (end, length, class); (-1, 0, ``CTX_SINGLE``) if none.

    ``class`` looks at every earlier occurrence of the matched suffix (``length`` tokens), not only the
    latest one: ``CTX_SINGLE`` -- it occurred once; ``CTX_UNANIMOUS`` -- more than once, always followed
    by ``toks[end]``; ``CTX_SPLIT`` -- more than once, followed by different tokens.  Why: the match length
    alone misjudges a draft whose suffix was followed by different tokens before (its first token is
    accepted far less often than after a unanimous one).  Suffix decoding's prompt tree weighs the
    same counts.  One backward pass: per occurrence, the counts of every length up to its match length
    (``max_match`` is small); it does not stop at the first longest match."""
    hi = min(max_match, n - 1)
    best_end, best_len = -1, 0
    if hi < min_match:
        return best_end, best_len, CTX_SINGLE
    cnt = np.zeros(hi + 1, dtype=np.int64)  # occurrences matching at least L tokens
    nxt = np.full(hi + 1, -1, dtype=np.int64)  # the token after the latest of them
    same = np.zeros(hi + 1, dtype=np.int64)  # how many of them were followed by that token
    last = toks[n - 1]
    for e in range(n - 1, min_match - 1, -1):  # the latest occurrence first: ties go to it
        if toks[e - 1] != last:
            continue
        m = 1
        top = min(hi, e)
        while m < top and toks[e - 1 - m] == toks[n - 1 - m]:
            m += 1
        t = toks[e]
        for L in range(1, m + 1):
            if cnt[L] == 0:
                nxt[L] = t
            cnt[L] += 1
            if t == nxt[L]:
                same[L] += 1
        if m > best_len and m >= min_match:
            best_end, best_len = e, m
    if best_end < 0:
        return best_end, best_len, CTX_SINGLE
    if cnt[best_len] == 1:
        return best_end, best_len, CTX_SINGLE
    return best_end, best_len, (CTX_UNANIMOUS if same[best_len] == cnt[best_len] else CTX_SPLIT)


_SEED = np.uint64(0x5DEECE66D)
_GOLD = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_TWO = np.uint64(2)
_EMPTY = np.uint64(0)


@njit(inline="always")
def _mix(h, t):
    """splitmix64 of ``h`` combined with the non-negative integer ``t``."""
    z = h + _GOLD + np.uint64(t)
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@njit(inline="always")
def _slot(keys, h):
    """Linear probing: the slot holding ``h``, or the empty slot where it would go."""
    mask = np.uint64(len(keys) - 1)
    i = h & mask
    while keys[i] != h and keys[i] != _EMPTY:
        i = (i + np.uint64(1)) & mask
    return i


@compiled
def memory_count(nk, nodes, ck, children, meta, kids, tokens, bases, los, his, depth, sign):
    """Count (``sign`` +1) or uncount (-1) every (context, next token) pair of the output memory's new
    tokens (core/suffix_memory.py): entry ``i`` the tokens ``tokens[i, los[i]:his[i]]`` (none if empty)
    under the isolation key id ``kids[i]``, ``tokens[i, bases[i]:los[i]]`` being its segment's tokens
    before them (contexts never reach before ``bases[i]``).  The tables as ``SuffixMemory.packed_tables``
    gives them; ``meta``: [live nodes, used node slots, used child slots].  The memory's one counting
    kernel: ``SuffixMemory.add`` and its evictions and rebuilds call it, ``chain_step`` inside its call
    (why one call for many entries: a call unboxes its arguments every time, a few microseconds)."""
    ntot, nbest, nbestc, nfirst = nodes[0], nodes[1], nodes[2], nodes[3]
    cc, ctok, cnext = children[0], children[1], children[2]
    for r in range(len(kids)):
        arr, base = tokens[r], bases[r]
        for i in range(los[r], his[r]):
            t = arr[i]
            h = _mix(_SEED, kids[r])
            for m in range(1, min(i - base, depth) + 1):
                h = _mix(h, arr[i - m])
                key = h | _TWO  # never 0 (the empty marker)
                s = _slot(nk, key)
                if nk[s] == _EMPTY:
                    nk[s] = key
                    ntot[s] = 0
                    nbest[s] = t
                    nbestc[s] = 0
                    nfirst[s] = -1
                    meta[1] += 1
                if ntot[s] == 0 and sign > 0:
                    meta[0] += 1
                ntot[s] += sign
                if ntot[s] == 0:
                    meta[0] -= 1
                ckey = _mix(key, t) | _TWO
                j = _slot(ck, ckey)
                if ck[j] == _EMPTY:
                    ck[j] = ckey
                    cc[j] = 0
                    ctok[j] = t
                    cnext[j] = nfirst[s]  # the node's children, newest first
                    nfirst[s] = j
                    meta[2] += 1
                cc[j] += sign
                if sign > 0:
                    if cc[j] > nbestc[s]:
                        nbest[s] = t
                        nbestc[s] = cc[j]
                elif nbest[s] == t:  # the most frequent child lost a count: compare the children again
                    nbestc[s] = cc[j]
                    c = nfirst[s]
                    while c >= 0:
                        if cc[c] >= nbestc[s]:  # ties: the oldest child (the list runs newest first)
                            nbest[s] = ctok[c]
                            nbestc[s] = cc[c]
                        c = cnext[c]


@compiled
def memory_find(nk, ntot, kid, buf, end, length):
    """Slot of the node for the ``length`` tokens before ``buf[end]``, or -1 if unseen (or dead)."""
    h = _mix(_SEED, kid)
    for m in range(1, length + 1):
        h = _mix(h, buf[end - m])
    key = h | _TWO
    s = _slot(nk, key)
    if nk[s] == _EMPTY or ntot[s] <= 0:
        return -1
    return np.int64(s)


@compiled
def memory_lookup(nk, ntot, nbest, nbestc, kid, ctx, n_ctx, depth, max_tokens, min_prob, buf, out_p):
    """Greedy walk from the longest stored suffix of ``ctx[:n_ctx]``: its last ``depth`` tokens are
    copied to ``buf``, the drafted tokens written after them, their probabilities to ``out_p``.
    Returns (tokens drafted, matched length, where the drafted tokens start in ``buf``)."""
    n = min(n_ctx, depth)
    for j in range(n):
        buf[j] = ctx[n_ctx - n + j]
    lo, hi, node = 0, n, -1
    # every suffix of a stored context is stored too: "stored" is monotone in the length
    while lo < hi:
        mid = (lo + hi + 1) // 2
        s = memory_find(nk, ntot, kid, buf, n, mid)
        if s >= 0:
            lo, node = mid, s
        else:
            hi = mid - 1
    if node < 0:
        return 0, 0, n
    matched = length = lo
    out = 0
    end = n
    while True:
        p = nbestc[node] / (ntot[node] + 1.0)  # +1: a continuation seen once is no certainty
        if p < min_prob:
            break
        buf[end] = nbest[node]
        out_p[out] = p
        out += 1
        end += 1
        if out >= max_tokens:
            break
        length = min(length + 1, depth)
        node = memory_find(nk, ntot, kid, buf, end, length)
        while node < 0 and length > 1:  # shorten the context until it was seen
            length -= 1
            node = memory_find(nk, ntot, kid, buf, end, length)
        if node < 0:
            break
    return out, matched, n


# the sources and agreement blocks as numbers (core/acceptance.py defines the buckets; the reference drafter
# in tests/core/reference_drafter.py is checked against these kernels).  Why copies and not an import of
# acceptance.py's constants: numba freezes a global into the compiled code, and its on-disk cache is keyed
# on this file alone -- a change to a constant in another module would keep serving the stale kernel.
SRC_NONE, SRC_CONTEXT, SRC_MEMORY = 0, 1, 2
AGREE, CONFLICT, AGREE_STATES = 1, 2, 3  # core.acceptance's agreement blocks of the acceptance table


@njit(inline="always")
def _agreement(cand_c, length, toks, t0, other, o0, n_other, block):
    """The candidate ``toks[t0:t0 + length]``'s cells moved to the AGREE
    block while ``other[o0:o0 + n_other]`` drafts the same tokens, to the CONFLICT block at the first
    token where it drafts a different one."""
    n = min(length, n_other)
    j = 0
    while j < n and toks[t0 + j] == other[o0 + j]:
        cand_c[j] += AGREE * block
        j += 1
    if j < n:
        cand_c[j] += CONFLICT * block


@njit(inline="always")
def _mem_cell(matched, f, j, mem0, depths):
    base = mem0 + 4 * (0 if matched <= 2 else (1 if matched <= 5 else 2))
    b = base + (0 if f < 0.4 else (1 if f < 0.7 else (2 if f < 0.9 else 3)))
    return b * depths + min(j, depths - 1)


@njit(inline="always")
def _score(cells, length, p, rho, p_cum):
    """A candidate's p_cum per token (into ``p_cum``: ``rho`` x the product of its cells' estimates,
    at most 0.98) and their sum, the expected committed tokens."""
    acc = rho
    total = 0.0
    for j in range(length):
        acc = min(acc * p[cells[j]], 0.98)
        p_cum[j] = acc
        total += acc
    return total


@njit(inline="always")
def _keep(r, length, toks, cells, p_cum, out_tok, out_cell, out_pc):
    """Row ``r``'s best candidate so far: copy it to the outputs."""
    for j in range(length):
        out_tok[r, j], out_cell[r, j], out_pc[r, j] = toks[j], cells[j], p_cum[j]


@njit(cache=True)
def _propose_one(r, ctx, n, kid, h_a, h_e, p, k, min_match, max_match, nk, ntot, nbest, nbestc, depth, floor, ctx0,
                 mem0, depths, scratch, probs, tail, cand_t, cand_c, cand_p, out_tok, out_cell, out_pc, out_len, out_src,
                 out_count):
    """One row's draft: the candidate for the committed tokens ``ctx[:n]`` into output row ``r``.

    ``kid`` is the request's isolation key's id in the memory (-1: nothing stored under it, or no memory).
    The context match and the memory's longest match are each scored by expected committed tokens (sum of
    p_cum, p_cum = min(rho x prod of p[cell], 0.98), rho the request's history factor); the better one, if
    short, continues with what the memory says follows it; then how many leading tokens have p_cum >=
    ``floor``.  Writes the full candidate (``out_tok``/``out_cell``/``out_pc``, ``out_len`` tokens, source
    ``out_src``) and the count above the floor (``out_count``)."""
    out_len[r] = 0
    out_src[r] = SRC_NONE
    out_count[r] = 0
    if n == 0:
        return
    # the request's accepted / expected tokens, clipped: it scales a candidate's p_cum once (compounded over
    # every position it would overshoot)
    rho = min(max((h_a + HISTORY_PRIOR) / (h_e + HISTORY_PRIOR), 0.3), 1.6)
    best_total = 0.0
    best_len = 0
    block = len(p) // AGREE_STATES  # the cells of one agreement state
    got, matched, at = 0, 0, 0
    if kid >= 0:
        got, matched, at = memory_lookup(nk, ntot, nbest, nbestc, kid, ctx, n, depth, k, 0.0, scratch, probs)
    end, m, cls = suffix_match_evidence(ctx, n, min_match, max_match)
    length = min(k, n - end) if end >= 0 else 0
    if end >= 0:
        bucket = ctx0 + 4 * cls + min(m, 4) - 1
        for j in range(length):
            cand_t[j] = ctx[end + j]
            cand_c[j] = bucket * depths + min(j, depths - 1)
        _agreement(cand_c, length, ctx, end, scratch, at, got, block)
        total = _score(cand_c, length, p, rho, cand_p)
        if total > best_total:
            best_total, best_len = total, length
            out_src[r] = SRC_CONTEXT
            _keep(r, length, cand_t, cand_c, cand_p, out_tok, out_cell, out_pc)
    if kid >= 0:
        if got > 0:
            for j in range(got):
                cand_t[j] = scratch[at + j]
                cand_c[j] = _mem_cell(matched, probs[j], j, mem0, depths)
            _agreement(cand_c, got, scratch, at, ctx, end, length, block)
            total = _score(cand_c, got, p, rho, cand_p)
            if total > best_total:
                best_total, best_len = total, got
                out_src[r] = SRC_MEMORY
                _keep(r, got, cand_t, cand_c, cand_p, out_tok, out_cell, out_pc)
        if 0 < best_len < k:
            # a short chain continues with what the memory says follows (context tail + draft)
            t = min(depth, n + best_len)
            for j in range(t):
                q = n + best_len - t + j  # position in context + draft
                tail[j] = ctx[q] if q < n else out_tok[r, q - n]
            got, matched, at = memory_lookup(nk, ntot, nbest, nbestc, kid, tail, t, depth, k - best_len, 0.0,
                                             scratch, probs)
            acc = out_pc[r, best_len - 1]
            for j in range(got):
                c = _mem_cell(matched, probs[j], best_len + j, mem0, depths)
                acc = min(acc * p[c], 0.98)
                out_tok[r, best_len + j], out_cell[r, best_len + j], out_pc[r, best_len + j] = scratch[at + j], c, acc
            best_len += got
    out_len[r] = best_len
    cnt = 0
    while cnt < best_len and out_pc[r, cnt] >= floor:
        cnt += 1
    out_count[r] = cnt


# ---------------------------------------------------------------- the engine's batch, in slot arrays
# ``core.batch_rows.BatchRows`` keeps the drafter's per-request state in arrays indexed by a slot per
# request; ``chain_step`` does a whole step's per-row work on them in one call (``LookaheadDrafter.step``),
# the others are its parts.  The reference drafter of the tests (tests/core/reference_drafter.py) does the
# same in plain Python.


@compiled
def observe_rows(slots, num_tokens, n_new, verified, max_prompt_index, s_start, s_seen, s_memseen, s_plen, s_last_len,
                 s_last_cells, s_last_p, s_last_src, s_hist_a, s_hist_e, s_stats, ev, acc, p, prior, weight, cap,
                 fresh_lo, fresh_hi):
    """Absorb one engine step for every row: row ``r`` is the request in slot ``slots[r]``, with
    ``num_tokens[r]`` committed tokens of which ``n_new[r]`` came this step (0: still prefilling) and
    ``verified[r]`` draft tokens verified.  The last draft's outcome updates the acceptance table
    (``ev``/``acc``/``p``), the request's history and its per-source counts (``s_stats[slot, source]`` =
    drafted, accepted); ``fresh_lo[r]:fresh_hi[r]`` are the output tokens the output memory has
    not counted yet (empty: none)."""
    for r in range(len(slots)):
        s = slots[r]
        nt = num_tokens[r]
        nn = n_new[r]
        seen = s_seen[s]
        continuous = seen > 0 and nt == seen + nn
        last = s_last_len[s] if continuous else 0
        s_last_len[s] = 0
        if nt > seen:
            if seen == 0:  # first sight: a long prompt is scanned from its last `max_prompt_index` tokens
                s_start[s] = max(0, nt - max_prompt_index)
            s_seen[s] = nt
        start_m = s_memseen[s] if s_memseen[s] > s_plen[s] else s_plen[s]
        fresh_lo[r] = max(start_m, s_start[s])
        fresh_hi[r] = nt if nt > fresh_lo[r] else fresh_lo[r]
        s_memseen[s] = nt
        if nn == 0:
            continue
        d = min(last, verified[r])
        if d == 0:
            continue
        accepted = nn - 1
        src = s_last_src[s]
        s_stats[s, src, 0] += d
        s_stats[s, src, 1] += accepted
        expected = 0.0
        for j in range(d):
            expected += s_last_p[s, j]
        for j in range(min(accepted + 1, d)):
            c = s_last_cells[s, j]
            e = ev[c] + 1.0
            a = acc[c] + (1.0 if j < accepted else 0.0)
            if e > cap:
                e, a = 0.5 * e, 0.5 * a
            ev[c] = e
            acc[c] = a
            p[c] = (a + weight * prior[c]) / (e + weight)
        s_hist_a[s] = 0.9 * s_hist_a[s] + accepted
        s_hist_e[s] = 0.9 * s_hist_e[s] + expected


@compiled
def propose_slots(tokens, slots, num_tokens, n_new, s_start, s_kid, s_hist_a, s_hist_e, s_toff, p, class_cells, k,
                  min_match, max_match, nk, ntot, nbest, nbestc, depth, floor, ctx0, mem0, depths, scratch, probs, tail,
                  cand_t, cand_c, cand_p, out_tok, out_cell, out_pc, out_len, out_src, out_count):
    """``_propose_one`` for row ``r`` = the engine's token row ``tokens[r]``, the request in slot
    ``slots[r]``: its committed tokens from its slot's start (``s_start``) to ``num_tokens[r]``; no
    draft for a row still prefilling (``n_new[r]`` 0).  A row reads the ``class_cells`` cells of its
    sampler class, from ``s_toff[s]`` on, and its output cells are table-wide (offset added)."""
    for r in range(len(slots)):
        s = slots[r]
        lo = s_start[s]
        off = s_toff[s]
        n = num_tokens[r] - lo if n_new[r] > 0 else 0
        _propose_one(r, tokens[r, lo:], n, s_kid[s], s_hist_a[s], s_hist_e[s], p[off : off + class_cells], k,
                     min_match, max_match, nk, ntot, nbest, nbestc, depth, floor, ctx0, mem0, depths, scratch, probs,
                     tail, cand_t, cand_c, cand_p, out_tok, out_cell, out_pc, out_len, out_src, out_count)
        for j in range(out_len[r]):
            out_cell[r, j] += off


@compiled
def drafted_surplus(out_pc, counts, floor):
    """Expected commits of the draft tokens kept (``counts[r]`` leading tokens of row ``r``'s candidate)
    beyond what their rows cost: the sum of ``out_pc - floor`` over them (``LookaheadDrafter._drafting_pays``)."""
    total = 0.0
    for r in range(len(counts)):
        for j in range(counts[r]):
            total += out_pc[r, j] - floor
    return total


@compiled
def keep_drafts(slots, counts, out_tok, out_cell, out_pc, out_src, s_last_len, s_last_tok, s_last_cells, s_last_p,
                s_last_src):
    """What each slot drafted this step (``counts[r]`` leading tokens of its candidate), for the next
    step's ``observe_rows`` (and ``BatchRows.export``)."""
    for r in range(len(slots)):
        s = slots[r]
        c = counts[r]
        s_last_len[s] = c
        s_last_src[s] = out_src[r] if c > 0 else SRC_NONE
        for j in range(c):
            s_last_tok[s, j] = out_tok[r, j]
            s_last_cells[s, j] = out_cell[r, j]
            s_last_p[s, j] = out_pc[r, j]


@compiled
def chain_step(tokens, num_tokens, rowdata, ints, floats, lastk, last_p, stats, table, nk, nodes, ck, children, meta,
               params, fparams, scr_i32, scr_i64, scr_f64, out_tok, out_cell, out_pc, out_meta):
    """A whole drafter step (``LookaheadDrafter.step``) in one call: ``observe_rows``; the new output
    counted into the memory (``memory_count``) if it fits the room it has (new tokens it takes without
    evicting or growing its tables; -1: no memory, or counted already) -- each row's contexts reaching
    back ``seglen`` tokens into its segment, as ``SuffixMemory.add`` does; ``propose_slots``; and
    ``keep_drafts`` if the drafts fit the batch's budget.

    Why one call, and so few arguments: right after a forward pass the caches are cold, and there every
    numpy operation and every kernel call costs 10-40 us (a call's argument checks grow with its
    arguments: 60 arrays ~36 us cold, ~3 us warm) -- at batch 1 that fixed cost *is* the proposer.
    So the state comes packed: ``rowdata`` (slots, new token counts, verified drafts per row), the
    slots' fields (``core.batch_rows.BatchRows``: ``ints``, ``floats``, ``lastk``, ``last_p``, ``stats``),
    the acceptance table's four rows, the memory's tables (``SuffixMemory.packed_tables``), ``params``
    (max_prompt_index, depth, room, k, min_match, max_match, max_total, ctx0, mem0, depths, class_cells,
    observe), ``fparams`` (weight, cap, floor), scratch by type; outputs ``out_tok``/``out_cell``/``out_pc``
    and ``out_meta`` (rows: length, source, count above the floor, fresh output from, to).

    Returns (new output tokens counted, or -1 when they do not fit: then nothing after ``observe_rows``
    ran, and the caller counts them with ``SuffixMemory.add`` and calls again with ``observe`` 0 and room
    -1, which drafts from the fresh output ``out_meta`` still holds; whether ``keep_drafts`` ran -- not
    when the drafts exceed the budget)."""
    slots, n_new, verified = rowdata[0], rowdata[1], rowdata[2]
    s_start, s_seen, s_memseen, s_plen, s_kid, s_seglen, s_last_len, s_last_src, s_toff = (
        ints[0], ints[1], ints[2], ints[3], ints[4], ints[5], ints[6], ints[7], ints[8])
    s_hist_a, s_hist_e = floats[0], floats[1]
    s_last_tok, s_last_cells = lastk[0], lastk[1]
    ev, acc, p, prior = table[0], table[1], table[2], table[3]
    max_prompt_index, depth, room, k, min_match, max_match, max_total, ctx0, mem0, depths, class_cells, observe = (
        params[0], params[1], params[2], params[3], params[4], params[5], params[6], params[7], params[8], params[9],
        params[10], params[11])
    weight, cap, floor = fparams[0], fparams[1], fparams[2]
    out_len, out_src, out_count, fresh_lo, fresh_hi = out_meta[0], out_meta[1], out_meta[2], out_meta[3], out_meta[4]
    scratch = scr_i32[: depth + k + 1]
    tail = scr_i32[depth + k + 1 : 2 * depth + k + 1]
    cand_t = scr_i32[2 * depth + k + 1 : 2 * depth + 2 * k + 1]
    probs, cand_p = scr_f64[: k + 1], scr_f64[k + 1 : 2 * k + 1]
    cand_c = scr_i64[:k]
    if observe:
        observe_rows(slots, num_tokens, n_new, verified, max_prompt_index, s_start, s_seen, s_memseen, s_plen,
                     s_last_len, s_last_cells, last_p, s_last_src, s_hist_a, s_hist_e, stats, ev, acc, p, prior, weight,
                     cap, fresh_lo, fresh_hi)
    fresh = 0
    if room >= 0:
        n = len(slots)
        for r in range(n):
            fresh += fresh_hi[r] - fresh_lo[r]
        if fresh > room:
            return -1, False
        kids, bases = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        for r in range(n):
            s, lo = slots[r], fresh_lo[r]
            kids[r] = s_kid[s]
            bases[r] = lo - min(s_seglen[s], depth, lo - s_start[s])
            s_seglen[s] += fresh_hi[r] - lo
        memory_count(nk, nodes, ck, children, meta, kids, tokens, bases, fresh_lo, fresh_hi, depth, 1)
    propose_slots(tokens, slots, num_tokens, n_new, s_start, s_kid, s_hist_a, s_hist_e, s_toff, p, class_cells, k,
                  min_match, max_match, nk, nodes[0], nodes[1], nodes[2], depth, floor, ctx0, mem0, depths, scratch,
                  probs, tail, cand_t, cand_c, cand_p, out_tok, out_cell, out_pc, out_len, out_src, out_count)
    total = 0
    for r in range(len(slots)):
        total += out_count[r]
    if total > max_total:
        return fresh, False
    keep_drafts(slots, out_count, out_tok, out_cell, out_pc, out_src, s_last_len, s_last_tok, s_last_cells, last_p,
                s_last_src)
    return fresh, True


@compiled
def greedy_verify_into(argmax, drafts, num_draft, out):  # pragma: no cover - compiled
    """Greedy verification of one speculative step into ``out`` (``[batch, max_spec_len + 1]``, filled
    with -1 by the caller): row i keeps the target's argmax while its draft token matched and stops at
    the first mismatch; a row whose draft matched throughout gets its bonus row's argmax too
    (core/verify.py).  ``argmax`` holds each request's draft positions then its bonus row."""
    row = 0
    d = 0
    for i in range(num_draft.shape[0]):
        nd = num_draft[i]
        j = 0
        while j < nd:
            tok = argmax[row + j]
            out[i, j] = tok
            if drafts[d + j] != tok:
                break
            j += 1
        if j == nd:
            out[i, nd] = argmax[row + nd]
        row += nd + 1
        d += nd
