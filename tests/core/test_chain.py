"""The engine-wide output memory (longest match, frequencies, token bound, isolation) and the drafter that
drafts from it and the context match -- twin-tested against the plain-Python reference
(tests/core/reference_drafter.py)."""

from __future__ import annotations

import random
from collections import Counter, OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_drafter import ReferenceDrafter, agreement, step_rows, suffix_match_evidence

from vllm_lookahead.core import LookaheadConfig, LookaheadDrafter, RowStep
from vllm_lookahead.core.config import LookaheadConfigError
from vllm_lookahead.core.simulate import simulate
from vllm_lookahead.core.suffix_memory import SuffixMemory

pytestmark = pytest.mark.unit


# ----------------------------------------------------------------------------- output memory
def add_one(mem: SuffixMemory, seg: object, key: object, row: list[int], lo: int = 0, floor: int = 0) -> None:
    """``mem.add`` of one entry: ``row[lo:]`` appended to segment ``seg``, ``row[floor:lo]`` its earlier tokens."""
    mem.add([seg], [key], np.asarray([row], dtype=np.int32), [lo], [len(row)], [floor])


def brute_next(segments: list[list[int]], context: list[int], depth: int) -> tuple[int | None, int]:
    """Most frequent next token after the longest suffix of ``context`` (<= depth) seen in segments."""
    for m in range(min(depth, len(context)), 0, -1):
        suffix = context[len(context) - m:]
        nxt = Counter(seg[i + m] for seg in segments for i in range(len(seg) - m)
                      if seg[i:i + m] == suffix)
        if nxt:
            best = max(nxt.values())
            return min(t for t, c in nxt.items() if c == best), m  # ties: any of them; compare the count
    return None, 0


@settings(max_examples=60, deadline=None)
@given(segs=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=30), min_size=1, max_size=5),
       ctx=st.lists(st.integers(0, 4), min_size=1, max_size=8), depth=st.integers(1, 6))
def test_memory_longest_match_and_most_frequent_continuation(segs, ctx, depth):
    mem = SuffixMemory(10_000, depth)
    for i, s in enumerate(segs):
        add_one(mem, i, "k", s[:3])  # in pieces, as the engine adds committed tokens
        add_one(mem, i, "k", s, min(3, len(s)))
    toks, probs, matched = mem.lookup("k", ctx, 1)
    want, want_m = brute_next(segs, ctx, depth)
    assert matched == want_m
    if want is None:
        assert toks == []
        return
    suffix = ctx[len(ctx) - matched:]
    nxt = Counter(s[i + matched] for s in segs for i in range(len(s) - matched) if s[i:i + matched] == suffix)
    assert nxt[toks[0]] == max(nxt.values())  # a most frequent continuation (ties may differ)
    assert probs[0] == pytest.approx(nxt[toks[0]] / (sum(nxt.values()) + 1))


@settings(max_examples=80, deadline=None)
@given(segs=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=40), min_size=1, max_size=8),
       ctxs=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=8), min_size=1, max_size=6),
       depth=st.integers(1, 6), max_tokens=st.integers(1, 120))
def test_memory_with_eviction_matches_the_surviving_outputs(segs, ctxs, depth, max_tokens):
    """Counts subtracted on eviction (a node's most frequent child re-found when it loses counts), tables
    rebuilt as they fill: after every ``add``, lookups answer exactly as the surviving outputs say -- the
    segment's tokens alone in the row, or after a 3-token "prompt" with the new tokens given as a list."""
    mem = SuffixMemory(max_tokens, depth)
    fast = SuffixMemory(max_tokens, depth)
    alive: OrderedDict[int, list[int]] = OrderedDict()  # reference: FIFO by tokens, as documented
    for i, s in enumerate(segs):
        tokens = [9, 9, 9]
        for piece in (s[:5], s[5:]):  # in pieces, as the engine adds committed tokens
            if not piece:
                continue
            add_one(mem, i, "k", tokens[3:] + piece, len(tokens) - 3)
            tokens = tokens + piece
            fast.add([i], ["k"], np.asarray([tokens], dtype=np.int32), [len(tokens) - len(piece)], [len(tokens)], [0],
                     [piece])
            alive.setdefault(i, []).extend(piece)
            while sum(map(len, alive.values())) > max_tokens:
                alive.popitem(last=False)
            assert len(mem) == len(fast) == sum(map(len, alive.values()))
            assert mem.num_contexts() == fast.num_contexts()
            for ctx in ctxs:
                toks, probs, matched = mem.lookup("k", ctx, 1)
                buf = np.asarray([7] + ctx + [0, 0], dtype=np.int32)  # read in place: ctx = buf[1:n]
                assert fast.lookup_from("k", buf[1:], len(ctx), 3) == mem.lookup("k", ctx, 3)
                want, want_m = brute_next(list(alive.values()), ctx, depth)
                assert matched == want_m
                if want is None:
                    assert toks == []
                    continue
                suffix = ctx[len(ctx) - matched:]
                nxt = Counter(a[j + matched] for a in alive.values() for j in range(len(a) - matched)
                              if a[j:j + matched] == suffix)
                assert nxt[toks[0]] == max(nxt.values())
                assert probs[0] == pytest.approx(nxt[toks[0]] / (sum(nxt.values()) + 1))


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.lists(st.tuples(st.integers(0, 5), st.lists(st.integers(0, 4), min_size=0, max_size=6)),
                                min_size=1, max_size=6), min_size=1, max_size=12),
       depth=st.integers(1, 5), max_tokens=st.integers(1, 80))
def test_memory_rows_in_one_call_count_as_one_add_per_row(steps, depth, max_tokens):
    """``add`` of a whole step's rows (counted from the engine's token rows, in one kernel call up to each
    eviction or rebuild) stores exactly what one ``add`` per row does: same tokens, same live contexts,
    same look-ups -- across table rebuilds and evictions (small ``max_tokens``), with a request's tokens
    arriving over several steps and several keys, rows with nothing new among them, and the new tokens
    given as a list or read from the rows."""
    one, rows = SuffixMemory(max_tokens, depth), SuffixMemory(max_tokens, depth)
    committed: dict[int, list[int]] = {}
    for step in steps:
        batch, seen = [], set()
        for req, new in step:
            if req in seen:  # one row per request per step, as in the engine
                continue
            seen.add(req)
            toks = committed.setdefault(req, [3])  # a one-token prompt, then output
            lo = len(toks)
            toks.extend(new)
            add_one(one, req, req % 2, toks, lo)
            batch.append((req, req % 2, list(toks), lo))
        width = max(len(b[2]) for b in batch)
        grid = np.full((len(batch), width), -1, dtype=np.int32)
        for r, (_, _, toks, _) in enumerate(batch):
            grid[r, : len(toks)] = toks
        rows.add([b[0] for b in batch], [b[1] for b in batch], grid, [b[3] for b in batch], [len(b[2]) for b in batch],
                 [0] * len(batch), [b[2][b[3]:] if b[0] % 3 else [] for b in batch])
        assert len(one) == len(rows) and one.num_contexts() == rows.num_contexts()
        for key in (0, 1):
            for ctx in ([0], [1, 2], [4, 4, 4], [2, 0, 1, 3]):
                assert rows.lookup(key, ctx, 3) == one.lookup(key, ctx, 3)


def test_memory_eviction_re_finds_the_most_frequent_child():
    mem = SuffixMemory(max_tokens=12, depth=1)
    add_one(mem, "old", None, [5, 6, 5, 6, 5, 6])  # after 5: 6 three times
    add_one(mem, "new", None, [5, 7, 5, 7, 5, 8])  # after 5: 7 twice, 8 once
    assert mem.lookup(None, [5], 1)[0] == [6]
    add_one(mem, "newer", None, [1])  # 13 tokens: the old output goes, and the 6s with it
    assert mem.lookup(None, [5], 1) == ([7], [pytest.approx(2 / 4)], 1)


def test_memory_is_bounded_by_tokens_and_evicts_oldest_first():
    mem = SuffixMemory(max_tokens=20, depth=3)
    add_one(mem, "old", None, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert mem.lookup(None, [1, 2], 3)[0] == [3, 4, 5]
    for i in range(3):
        add_one(mem, f"new{i}", None, [50 + i] * 8)
    assert len(mem) <= 20
    assert mem.lookup(None, [1, 2], 3) == ([], [], 0)  # the oldest output is gone, counts and all
    fresh = SuffixMemory(max_tokens=20, depth=3)  # the survivors alone: no context of the old output is left
    for i in range(3):
        add_one(fresh, f"new{i}", None, [50 + i] * 8)
    assert mem.num_contexts() == fresh.num_contexts()


def test_memory_tables_stay_at_most_half_full_while_growing():
    """The load check reads the kernel's slot counts only when a Python upper bound says the tables might
    pass half full (core/suffix_memory.py, ``_used_bound``): the bound must never fall below the true
    count, or the open-addressing tables could fill up (and a probe never end)."""
    rng = random.Random(3)
    mem = SuffixMemory(max_tokens=1000, depth=4)  # starts at the smallest tables; evicts past 1000 tokens
    sizes, segs = set(), {}
    for i in range(400):  # random tokens: nearly every context is new, so the tables grow and rebuild
        seg = segs.setdefault(f"r{i % 97}", [])
        lo = len(seg)
        seg.extend(rng.randrange(50_000) for _ in range(rng.randint(1, 9)))
        add_one(mem, f"r{i % 97}", None, seg, lo)
        used = mem._used_slots()
        assert mem._used_bound >= used
        assert 2 * used <= len(mem._nk)
        sizes.add(len(mem._nk))
    assert len(sizes) > 1  # it did grow (rebuilt) along the way


def test_memory_isolation_key_separates_tenants():
    """Outputs stored under one isolation key never draft for another -- in the memory and through the
    drafter, where the key comes from the request (LoRA adapter / tenant)."""
    mem = SuffixMemory(1000, 4)
    add_one(mem, "a", ("lora1", None), [5, 6, 7, 8, 9])
    assert mem.lookup(("lora1", None), [5, 6], 3)[0] == [7, 8, 9]
    assert mem.lookup(("lora2", None), [5, 6], 3) == ([], [], 0)
    assert mem.lookup((None, None), [5, 6], 3) == ([], [], 0)

    d = LookaheadDrafter(LookaheadConfig(max_match=2), 4)
    prompt = [900, 901, 902]
    ctx = prompt[:]
    for t in [10, 11, 12, 13, 14, 15]:  # tenant A's request generates 10..15
        ctx = ctx + [t]
        step_rows(d, [RowStep("a", ctx, len(ctx), [t], prompt_len=len(prompt), isolation_key=(None, "A"))])
    other = [700, 701, 10, 11]  # another request ends on A's output 10 11; its own context cannot match
    same = step_rows(d, [RowStep("b", other, 4, [11], prompt_len=3, isolation_key=(None, "A"))])
    assert same[0][:1] == [12]
    foreign = step_rows(d, [RowStep("c", other, 4, [11], prompt_len=3, isolation_key=(None, "B"))])
    assert foreign == [[]]
    # prompts are never stored: a request ending on A's prompt tokens gets nothing from them
    assert step_rows(d, [RowStep("e", [1, 900, 901], 3, [901], prompt_len=2, isolation_key=(None, "A"))]) == [[]]


# ----------------------------------------------------------------------------- the drafter
def order2_model(vocab: int, seed: int):
    rng = random.Random(seed)
    table: dict[tuple[int, ...], int] = {}

    def nxt(ctx):
        key = tuple(ctx[-2:])
        if key not in table:
            table[key] = rng.randrange(vocab)
        return table[key]

    def verify(ctx, draft):
        seq, out = list(ctx), []
        for t in [*draft, None]:
            out.append(nxt(seq))
            if t is not None:
                seq.append(t)
        return out

    return nxt, verify


def test_drafts_are_lossless_and_use_memory_across_requests():
    """Simulated greedy verification: outputs equal greedy decoding; a second request with the same
    behaviour compresses better thanks to the first one's outputs in the engine-wide memory."""
    nxt, verify = order2_model(50, 1)
    d = LookaheadDrafter(LookaheadConfig(), 4)
    tick = iter(range(10**6))
    d.clock = lambda: 1e-3 * next(tick)  # every step 1 ms whatever its rows: drafting is free
    prompt = [3, 4]
    first = simulate(verify, prompt, 120, 4, drafter=d, req_id="a")
    seq = list(prompt)
    for _ in range(120):
        seq.append(nxt(seq))
    assert first.tokens == seq[2:]
    memory_accepted = d.summary()["by_source"].get("memory", {}).get("accepted", 0)
    second = simulate(verify, [9, 3, 4], 120, 4, drafter=d, req_id="b")
    assert second.compression > first.compression and second.compression > 3.0
    assert d.summary()["by_source"]["memory"]["accepted"] > memory_accepted


def test_chain_policy_cuts_each_draft_at_its_commit_probability_floor():
    """A draft goes on while its estimated commit probability (the product of its tokens'
    acceptance estimates) stays >= chain_min_p -- the whole candidate at floor 0, nothing at a floor no
    estimate reaches, a prefix in between; above batch_size_threshold rows chain_busy_min_p rules."""
    ctx = [5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7, 8]  # the context says 9 10 11 12 follows

    def draft(**kw) -> list[int]:
        d = LookaheadDrafter(LookaheadConfig(**kw), 4)
        return step_rows(d, [RowStep("r", ctx, len(ctx), [8], prompt_len=11)])[0]

    full = draft(chain_min_p=0.0)
    assert full == [9, 10, 11, 12]
    assert draft(chain_min_p=0.99) == []
    part = draft(chain_min_p=0.3)
    assert 0 < len(part) < 4 and part == full[: len(part)]
    # 20 rows > batch_size_threshold: the busy floor applies (each row as alone would draft fully)
    busy = LookaheadDrafter(LookaheadConfig(chain_min_p=0.0, chain_busy_min_p=0.99,
                                            batch_size_threshold=16), 4)
    rows = [RowStep(f"r{i}", ctx, len(ctx), [8], prompt_len=11) for i in range(20)]
    assert step_rows(busy, rows) == [[]] * 20


def test_sampler_classes_learn_their_own_acceptance():
    """Greedy and T>0 requests learn apart (``core.acceptance.sampler_class``): after a greedy request
    whose drafts are always accepted and a T=1 request whose drafts are always rejected ran side by side
    on the same repetitive text, a *new* greedy request drafts the whole match while a new T=1 request
    drafts less (its class's cells learned the rejections; the greedy ones did not).  One table for both
    would give the newcomers the same draft -- their histories are empty, only the cells differ."""
    ctx = [5, 6, 7, 8, 9, 10, 11, 12] * 3 + [5, 6, 7, 8]
    d = LookaheadDrafter(LookaheadConfig(memory_tokens=0, measured_floor=False, chain_min_p=0.12), 4)
    rows = {"g": list(ctx), "t": list(ctx)}
    temps = {"g": 0.0, "t": 1.0, "g2": 0.0, "t2": 1.0}
    drafts = {"g": [], "t": []}
    for _ in range(60):
        news = {}
        for rid, c in rows.items():
            dr = drafts[rid]
            news[rid] = (dr + [c[len(c) - 8 + len(dr)]]) if rid == "g" else [c[len(c) - 8]]  # all / none accepted
            c += news[rid]
        out = step_rows(d, [RowStep(rid, c, len(c), news[rid], len(drafts[rid]), prompt_len=len(ctx),
                              temperature=temps[rid]) for rid, c in rows.items()])
        drafts = dict(zip(rows, out))
    new = step_rows(d, [RowStep(rid, ctx, len(ctx), [8], prompt_len=len(ctx) - 1, temperature=temps[rid])
                  for rid in ("g2", "t2")])
    assert new[0] == [9, 10, 11, 12]
    assert len(new[1]) < 4, new
    from vllm_lookahead.core.acceptance import CLASS_CELLS, sampler_class

    assert [sampler_class(t) for t in (0.0, 1e-6, 0.3, 0.7, 1.0, 1.5, None)] == [0, 0, 1, 2, 3, 4, 3]
    hot = d.table.evaluated[sampler_class(1.0) * CLASS_CELLS : (sampler_class(1.0) + 1) * CLASS_CELLS]
    assert hot.sum() > 0 and d.table.accepted[sampler_class(1.0) * CLASS_CELLS :][: CLASS_CELLS].sum() == 0


def test_drafts_that_do_not_pay_for_a_drafting_step_are_dropped():
    """With a measured switch price (a step with drafts costs 10 ms more than one without, at ~360 tokens/s:
    ~3.6 tokens), a draft whose expected surplus (~1.4 tokens) is below it is not drafted at all -- the step
    runs as a plain step; with a cheap switch (0.1 ms) the same draft goes ahead."""
    ctx = [5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7, 8]

    def first_draft(switch_s: float) -> list[int]:
        d = LookaheadDrafter(LookaheadConfig(memory_tokens=0, chain_min_p=0.05), 4)
        rng = np.random.default_rng(0)
        for i in range(64):  # synthetic steps: 3 ms + 0.1 ms per row (+ switch_s when drafting), rows vary
            drafts = int(rng.integers(0, 5)) if i % 2 else 0
            d.row_price.observe(1, drafts, 3, 0.003 + 0.0001 * (1 + drafts) + (switch_s if drafts else 0.0))
        assert d.row_price.switch_price(1) == pytest.approx(switch_s * d.row_price.summary()["1"]["tokens_per_s"],
                                                            rel=0.05)
        return step_rows(d, [RowStep("r", ctx, len(ctx), [8], prompt_len=11)])[0]

    assert first_draft(0.0001) == [9, 10, 11, 12]
    assert first_draft(0.01) == []


def test_agreement_marks_agreeing_then_conflicting_tokens():
    """Cells of tokens the other source drafts too go to the AGREE block, the first token it drafts
    differently to the CONFLICT block, tokens past that (or past its end) stay ALONE."""
    from vllm_lookahead.core.acceptance import AGREE, BLOCK, CONFLICT

    cells = [3, 4, 5, 6, 7]
    assert agreement(list(cells), [1, 2, 3, 4, 5], [1, 2, 9, 4]) == [
        3 + AGREE * BLOCK, 4 + AGREE * BLOCK, 5 + CONFLICT * BLOCK, 6, 7]
    assert agreement(list(cells), [1, 2, 3, 4, 5], [1, 2]) == [3 + AGREE * BLOCK, 4 + AGREE * BLOCK, 5, 6, 7]
    assert agreement(list(cells), [1, 2, 3, 4, 5], []) == cells
    assert agreement(list(cells), [1, 2, 3, 4, 5], [8]) == [3 + CONFLICT * BLOCK, 4, 5, 6, 7]


def test_memory_agreeing_with_the_context_raises_the_estimate():
    """The same context draft is estimated more likely committed where the memory (an earlier request's
    output) continues the context the same way than where it continues differently -- and the drafter
    still drafts the context's tokens in both cases (the prompt match is the stronger source here)."""

    def first_estimate(memory_output: list[int]) -> tuple[list[int], float]:
        d = LookaheadDrafter(LookaheadConfig(chain_min_p=0.0), 4)
        out = [40, 41, *memory_output]
        for n in range(1, len(out) + 1):  # an earlier request whose output the memory keeps
            step_rows(d, [RowStep("m", [1, 2, *out], 2 + n, [out[n - 1]], prompt_len=2)])
        ctx = [5, 6, 7, 8, 9, 10, 11, 12, 30, 31, 5, 6, 7, 8]
        draft = step_rows(d, [RowStep("r", ctx, len(ctx), [8], prompt_len=13)])[0]
        return draft, float(d.batch.last_p[d.batch.active["r"], 0])

    agree_draft, agree = first_estimate([7, 8, 9, 10, 11])
    conflict_draft, conflict = first_estimate([7, 8, 50, 51, 52])
    assert agree_draft == conflict_draft == [9, 10, 11, 12]
    assert agree > conflict


def test_history_factor_scales_a_candidate_once_and_waits_for_history():
    """A request's accepted / expected ratio moves off 1 only after a few tokens of history
    (``HISTORY_PRIOR`` pseudo-tokens each side), is clipped to [0.3, 1.6], and scales a candidate's
    commit probability once: p_cum[j] = min(rho * p[c0] * ... * p[cj], 0.98) -- compounding it per
    token would turn a ratio of 1.3 into 1.3**8 over eight positions."""
    from reference_drafter import Request, p_cum

    ref = ReferenceDrafter(LookaheadConfig(chain_min_p=0.0, memory_tokens=0), 4)
    ctx = [5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7, 8]

    def first_p(hist_a: float, hist_e: float) -> float:
        return ref.candidate(Request(hist_accepted=hist_a, hist_expected=hist_e), ctx)[2][0]

    base = first_p(0.0, 0.0)
    assert first_p(1.0, 0.0) < 1.2 * base  # one lucky token barely moves it
    assert first_p(500.0, 10.0) == pytest.approx(min(1.6 * base, 0.98))
    assert first_p(0.0, 500.0) == pytest.approx(0.3 * base)
    p = [0.9, 0.8, 0.7, 0.6]
    pc = p_cum([0, 1, 2, 3], p, 1.3)
    want, acc = [], 1.3
    for x in p:
        acc = min(acc * x, 0.98)
        want.append(acc)
    assert pc == pytest.approx(want) and pc[0] == 0.98 and pc[-1] == pytest.approx(0.98 * 0.8 * 0.7 * 0.6)
    assert p_cum([0, 1, 2, 3], p, 0.5) == pytest.approx([0.5 * 0.9, 0.5 * 0.72, 0.5 * 0.504, 0.5 * 0.3024])


def test_context_match_evidence_reference_agrees_with_the_kernel():
    """The reference's context match (longest suffix, latest occurrence, evidence class) is the kernel's."""
    from vllm_lookahead.core.jit import load_kernels

    rng = random.Random(5)
    for _ in range(400):
        toks = [rng.randrange(4) for _ in range(rng.randint(1, 40))]
        lo = rng.randint(1, 3)
        hi = lo + rng.randint(0, 4)
        got = load_kernels().suffix_match_evidence(np.asarray(toks, dtype=np.int32), len(toks), lo, hi)
        assert tuple(int(x) for x in got) == suffix_match_evidence(toks, lo, hi), (toks, lo, hi)


def test_chain_floor_rises_with_the_batch():
    """The floor is chain_min_p at one row, chain_busy_min_p from batch_size_threshold rows on, and
    rises monotonically in between (a row must beat the tokens/s of a bigger batch); a mid-size batch
    therefore drafts a shorter prefix of the same candidate than a single request does."""
    cfg = LookaheadConfig(chain_min_p=0.05, chain_busy_min_p=0.4, batch_size_threshold=16)
    d = LookaheadDrafter(cfg, 4)
    floors = [d.chain_floor(b) for b in range(1, 40)]
    assert floors[0] == 0.05 and floors[15] == 0.4 and floors[-1] == 0.4
    assert all(a <= b for a, b in zip(floors, floors[1:])) and 0.05 < floors[7] < 0.4
    ctx = [5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7, 8]
    kw = dict(chain_min_p=0.0, chain_busy_min_p=0.99, batch_size_threshold=16)
    alone = step_rows(LookaheadDrafter(LookaheadConfig(**kw), 4), [RowStep("r", ctx, len(ctx), [8], prompt_len=11)])[0]
    rows = [RowStep(f"r{i}", ctx, len(ctx), [8], prompt_len=11) for i in range(8)]
    mid = step_rows(LookaheadDrafter(LookaheadConfig(**kw), 4), rows)
    assert alone == [9, 10, 11, 12] and all(len(m) < len(alone) and m == alone[: len(m)] for m in mid)


def test_the_busy_floor_left_unset_is_chosen_by_k():
    """`chain_busy_min_p` unset (the default): the busy floor is 0.05 up to k = 4 (flat: the one-row
    floor) and 0.15 from k = 8 (linear between) -- the floors measured fastest at batch 32 on CPU with
    k = 4 and k = 8; a value that is set is used at every k.  With k = 8 a batch of 16 rows therefore
    drafts the confident head of a long context match, not its improbable tail."""
    unset = LookaheadConfig()
    assert unset.chain_busy_min_p is None and LookaheadConfig.from_dict({"chain_busy_min_p": None}) == unset
    floors = {k: LookaheadDrafter(unset, k).chain_floor(16) for k in (1, 4, 5, 6, 8, 16)}
    assert floors[1] == floors[4] == unset.chain_min_p == LookaheadDrafter(unset, 8).chain_floor(1)
    assert floors[8] == floors[16] == 0.15 and floors[4] < floors[5] < floors[6] < floors[8]
    assert LookaheadDrafter(LookaheadConfig(chain_busy_min_p=0.05), 8).chain_floor(16) == 0.05
    assert LookaheadDrafter(LookaheadConfig(chain_busy_min_p=0.4), 4).chain_floor(32) == 0.4
    with pytest.raises(LookaheadConfigError, match="chain_busy_min_p"):
        LookaheadConfig(chain_busy_min_p=1.5)
    ctx = [5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7, 8]  # a 4-token match: 9 10 11 12 5 6 7 8 follows

    def drafts(**kw) -> list[list[int]]:  # 16 rows: the busy floor, below the measured guard's reach
        rows = [RowStep(f"r{i}", ctx, len(ctx), [8], prompt_len=11) for i in range(16)]
        return step_rows(LookaheadDrafter(LookaheadConfig(**kw), 8), rows)

    long, short = drafts(chain_busy_min_p=0.05), drafts()
    assert all(d == [9, 10, 11, 12, 5, 6, 7, 8] for d in long)
    assert all(0 < len(d) < 8 and d == long[0][: len(d)] for d in short)


def test_guard_off_steps_skip_the_upkeep_and_lose_nothing():
    """While the busy-batch guard has drafting off, rows are not even observed (no proposer upkeep);
    when it is back on, the tokens committed meanwhile are scanned (context match) and stored (memory)."""
    d = LookaheadDrafter(LookaheadConfig(chain_min_p=0.0), 4)
    mode = ["chain"]
    d._guard = lambda live, counts, sampled=False: mode[0]  # fault injection: the guard's verdict, not its timing, is under test
    ctx = [900, 901]
    step_rows(d, [RowStep("r", ctx, 2, [901], prompt_len=1)])
    seen = int(d.batch.seen[d.batch.active["r"]])
    mode[0] = "off"
    for t in [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]:  # committed while off: a period the context can match later
        ctx = ctx + [t]
        assert step_rows(d, [RowStep("r", ctx, len(ctx), [t], prompt_len=1)]) == [[]]
    assert int(d.batch.seen[d.batch.active["r"]]) == seen  # untouched while off
    mode[0] = "chain"
    assert step_rows(d, [RowStep("r", ctx, len(ctx), [3], prompt_len=1)]) == [[4, 5, 6, 7]]
    assert int(d.batch.seen[d.batch.active["r"]]) == len(ctx)
    assert len(d.memory) == len(ctx) - 1  # every output token, the off period's included (not the prompt)


def test_proposer_isolation_key_from_lora_and_tenant():
    """The engine side: the key is (LoRA adapter, tenant); tenant from extra_args["lookahead"] or
    extra_args["tenant"]; a request with neither shares the anonymous key."""
    from types import SimpleNamespace as NS

    from vllm_lookahead.vllm.requests import isolation_key

    def req(lora=None, extra=None):
        return NS(lora_request=NS(lora_name=lora, lora_int_id=1) if lora else None,
                  sampling_params=NS(extra_args=extra))

    assert isolation_key(req()) == (None, None)
    assert isolation_key(req(lora="sql")) == ("sql", None)
    assert isolation_key(req(extra={"lookahead": {"tenant": "acme"}})) == (None, "acme")
    assert isolation_key(req(lora="sql", extra={"tenant": 7})) == ("sql", "7")
    assert isolation_key(None) == (None, None)
    assert len({isolation_key(req(lora=a, extra={"tenant": t})) for a in ("x", "y") for t in ("1", "2")}) == 4


def test_proposer_drafts_no_more_than_a_request_can_still_commit():
    """``draft_room``: a request ``r`` tokens short of ``max_tokens`` can use ``r - 1`` drafts (a step
    commits its accepted drafts plus one), at most k; no ``max_tokens``, or a request the runner does not
    know: k.  ``step`` cuts the drafts there and its measured rows count only what it drafted."""
    from types import SimpleNamespace as NS

    from vllm_lookahead.vllm.requests import draft_room

    reqs = {"a": NS(sampling_params=NS(max_tokens=10)), "b": NS(sampling_params=NS(max_tokens=None))}
    # prompt 5 tokens; "a" has 7, 8, 9 outputs: 3, 2, 1 tokens left
    assert draft_room(reqs, ["a", "a", "a", "b", "x"], [12, 13, 14, 14, 3], [5, 5, 5, 5, 1], 4) == [2, 1, 0, 4, 4]
    assert draft_room(reqs, ["a"], [6], [5], 4) == [4]

    d = LookaheadDrafter(LookaheadConfig(chain_min_p=0.0, chain_busy_min_p=0.0), 4)
    ctx = [5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7, 8]
    tokens = np.array([ctx, ctx], dtype=np.int32)
    args = (["p", "q"], tokens, np.array([12, 12]), [[8], [8]], np.array([0, 0]), np.array([11, 11]),
            lambda rid: None)
    assert d.step(*args, room=[4, 1]) == [[9, 10, 11, 12], [9]]
    assert d.last_budget == 5


REPLAY_TEMPERATURES = (0.0, 0.7, 1.0, 0.0, 1.3, 0.3)


def _replay(kind: str, seed: int, batch: int = 8, steps: int = 100, shrink: bool = False,
            **cfg) -> list:
    """Random decoding over a 12-token vocabulary (contexts and memory match often), a random prefix
    of every draft accepted, three tenants, a request replaced by a new one now and then.  ``kind``:
    "arrays" runs the compiled drafter (``step`` on a token array padded with zeros and a spare row),
    "stale" the same with random tokens in the padding (what a runner's token array holds past a row's
    committed tokens), "reference" the plain-Python reference drafter.  ``shrink``: now and then only some
    rows run (the others wait, as if preempted), down to a single row.  Returns every step's drafts."""
    config = LookaheadConfig(**cfg)
    d = ReferenceDrafter(config, 4) if kind == "reference" else LookaheadDrafter(config, 4)
    if kind != "reference":
        tick = iter(range(10**9))
        d.clock = lambda: 0.01 * next(tick)  # the same step times in every run
    rng, stale = random.Random(seed), np.random.default_rng(seed)
    ctxs = [[rng.randrange(12) for _ in range(rng.randint(3, 40))] for _ in range(batch)]
    plen = [len(c) for c in ctxs]
    ids = [f"r{i}" for i in range(batch)]
    news: list[list[int]] = [[] for _ in range(batch)]
    ver = [0] * batch

    def temperature_of(rid: str) -> float:  # every sampler class of the acceptance table, greedy included
        return REPLAY_TEMPERATURES[int(rid[1:]) % len(REPLAY_TEMPERATURES)]

    def step(run: list[int]) -> list[list[int]]:
        if kind != "reference":
            shape = (len(run) + 1, max(len(ctxs[i]) for i in run) + 3)
            tokens = np.zeros(shape, dtype=np.int32) if kind == "arrays" else stale.integers(0, 12, shape, dtype=np.int32)
            for r, i in enumerate(run):
                tokens[r, : len(ctxs[i])] = ctxs[i]
            return d.step([ids[i] for i in run], tokens, np.array([len(ctxs[i]) for i in run]), [news[i] for i in run],
                          np.array([ver[i] for i in run]), np.array([plen[i] for i in run]), lambda rid: int(rid[1:]) % 3,
                          temperature_of=temperature_of)
        return d.step([(ids[i], ctxs[i], news[i], ver[i], plen[i], int(ids[i][1:]) % 3, temperature_of(ids[i]))
                       for i in run])

    run = list(range(batch))
    drafts = dict(zip(run, step(run)))
    seen = [sorted(drafts.items())]
    for s in range(steps):
        for i in run:  # the rows that ran commit a random prefix of their drafts and one more token
            dr = drafts[i]
            news[i] = dr[: rng.randint(0, len(dr))] + [rng.randrange(12)]
            ctxs[i] += news[i]
            ver[i] = len(dr)
        if s % 13 == 4:  # a request finishes, a new one joins (still prefilling: no tokens sampled)
            j = rng.randrange(batch)
            ids[j], ctxs[j] = f"n{s}", [rng.randrange(12) for _ in range(rng.randint(3, 40))]
            plen[j], news[j], ver[j] = len(ctxs[j]), [], 0
        run = list(range(batch))
        if shrink and s % 7 in (2, 3, 5):
            run = sorted(rng.sample(run, 1 if s % 7 == 2 else rng.randint(2, batch - 1)))
        drafts = dict(zip(run, step(run)))
        seen.append(sorted(drafts.items()))
    return seen


@pytest.mark.parametrize("cfg", [{}, {"memory_tokens": 200}, {"memory_tokens": 0}, {"memory_tokens": 60},
                                 {"memory_depth": 2, "max_match": 2, "chain_min_p": 0.2},
                                 {"max_batch_draft_tokens": 9}, {"max_prompt_index_tokens": 16},
                                 {"chain_busy_min_p": 0.3, "batch_size_threshold": 4}])
@pytest.mark.parametrize("shrink", [False, True])
def test_compiled_drafter_drafts_exactly_what_the_reference_drafts(cfg, shrink):
    """The compiled drafter (slot arrays, one kernel call per step) is the plain-Python reference's twin:
    the same drafts at every step -- tokens, their floor cut, the batch budget -- with the memory on,
    evicting often (60 tokens), off, other depths, long prompts cut, a floor rising with the batch,
    requests leaving and joining and (``shrink``) the batch shrinking to one row and back.  (Fixed floors:
    the reference has no measured one.)"""
    for seed in range(3):
        fast = _replay("arrays", seed, shrink=shrink, measured_floor=False, **cfg)
        ref = _replay("reference", seed, shrink=shrink, measured_floor=False, **cfg)
        assert fast == ref
        assert sum(len(d) for step in fast for _, d in step) > 100  # the replay did draft


@pytest.mark.parametrize("cfg", [{}, {"memory_tokens": 60}, {"guard_batch_size": 2}])
def test_drafts_read_only_the_committed_tokens_of_their_rows(cfg):
    """``step`` reads row ``i`` of the token array only up to ``num_tokens[i]``: stale tokens past a row's
    committed ones (and in rows past the batch) change no draft -- the measured floor and the busy-batch
    guard ("off" included) in use."""
    for seed in range(2):
        assert _replay("stale", seed, shrink=True, **cfg) == _replay("arrays", seed, shrink=True, **cfg)
