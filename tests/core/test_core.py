"""Unit and property tests of the pure lookahead core (no vLLM): pool bounds, context look-up,
config validation, the drafter's k bound, id keying, adaptive policy and the Jacobi trajectories."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_lookahead.core import (
    LookaheadConfig,
    LookaheadConfigError,
    LookaheadDrafter,
    NGramPool,
    RowStep,
)
from vllm_lookahead.core.context_index import ContextIndex
from vllm_lookahead.core.simulate import simulate

pytestmark = pytest.mark.unit


# ----------------------------------------------------------------------------- toy target models
def table_model(vocab: int, seed: int, order: int = 2):
    """A deterministic 'model': the next token is a fixed random function of the last `order` tokens."""
    rng = random.Random(seed)
    table: dict[tuple[int, ...], int] = {}

    def next_token(ctx) -> int:
        key = tuple(ctx[-order:])
        if key not in table:
            table[key] = rng.randrange(vocab)
        return table[key]

    def verify(ctx, draft):
        seq = list(ctx)
        out = []
        for t in [*draft, None]:
            out.append(next_token(seq))
            if t is not None:
                seq.append(t)
        return out

    return next_token, verify


def greedy(next_token, prompt, n):
    seq = list(prompt)
    for _ in range(n):
        seq.append(next_token(seq))
    return seq[len(prompt):]


# ----------------------------------------------------------------------------- pool
@settings(max_examples=60, deadline=None)
@given(ngram=st.integers(2, 5), g=st.integers(1, 4), max_keys=st.integers(1, 8),
       seq=st.lists(st.integers(0, 12), min_size=0, max_size=200))
def test_pool_bounds_and_recency(ngram, g, max_keys, seq):
    pool = NGramPool(ngram, g, max_keys)
    pool.add_sequence(seq)
    assert pool.num_keys <= max_keys
    for key in range(13):
        conts = pool.get(key)
        assert len(conts) <= g
        assert len(set(conts)) == len(conts), "no duplicate continuations per key"
        assert all(len(c) == ngram - 1 for c in conts)
    # the most recent n-gram of the sequence is at the front of its key's list
    if len(seq) >= ngram:
        last = seq[-ngram:]
        assert pool.get(last[0])[0] == tuple(last[1:])


def test_pool_rejects_wrong_length():
    with pytest.raises(ValueError, match="3 tokens"):
        NGramPool(4, 2, 10).add(1, (2, 3))


# ----------------------------------------------------------------------------- context index
@settings(max_examples=80, deadline=None)
@given(seq=st.lists(st.integers(0, 5), min_size=1, max_size=120), lo=st.integers(1, 3), span=st.integers(0, 3))
def test_context_lookup_matches_bruteforce(seq, lo, span):
    hi = lo + span
    idx = ContextIndex(lo, hi)
    cut = len(seq) // 2
    idx.extend(seq[:cut])
    idx.extend(seq[cut:])
    cont, n = idx.lookup(4)
    # brute force: longest suffix length in [lo, hi] with an earlier occurrence; latest occurrence wins
    expect, expect_n = [], 0
    for m in range(min(hi, len(seq)), lo - 1, -1):
        suffix = seq[len(seq) - m:]
        ends = [i + m for i in range(len(seq) - m) if seq[i:i + m] == suffix]
        if ends:
            expect, expect_n = seq[max(ends):max(ends) + 4], m
            break
    assert (cont, n) == (expect, expect_n)
    # the same match with its evidence: every earlier occurrence of the matched suffix, and whether they
    # were all followed by the drafted token (one occurrence / more, all the same / more, different)
    cont_e, n_e, evidence = idx.lookup_evidence(4)
    assert (cont_e, n_e) == (expect, expect_n)
    if expect_n:
        suffix = seq[len(seq) - expect_n:]
        nexts = [seq[i + expect_n] for i in range(len(seq) - expect_n) if seq[i:i + expect_n] == suffix]
        expect_class = 0 if len(nexts) == 1 else (1 if set(nexts) == {expect[0]} else 2)
        assert evidence == expect_class, (nexts, expect)


# ----------------------------------------------------------------------------- config
def test_config_validation_messages():
    # W/N/G mean LADE's 2D shape everywhere (core.config.ALIASES), never the chain's knobs
    cfg = LookaheadConfig.from_dict({"W": 3, "N": 5, "G": 2})
    assert (cfg.lade_window, cfg.lade_ngram, cfg.lade_candidates) == (3, 5, 2)
    assert (cfg.window, cfg.ngram, cfg.pool_size) == (0, 4, 8)
    assert cfg.overrides() == {"lade_window": 3, "lade_ngram": 5, "lade_candidates": 2}
    with pytest.raises(LookaheadConfigError, match="ngram=1 is invalid"):
        LookaheadConfig.from_dict({"ngram": 1})
    with pytest.raises(LookaheadConfigError, match="unknown key"):
        LookaheadConfig.from_dict({"windw": 3})
    with pytest.raises(LookaheadConfigError, match="expected int"):
        LookaheadConfig.from_dict({"pool_size": "8"})
    with pytest.raises(LookaheadConfigError, match="not both"):
        LookaheadConfig.from_dict({"N": 3, "lade_ngram": 3})
    with pytest.raises(LookaheadConfigError, match="min_match"):
        LookaheadConfig.from_dict({"min_match": 5, "max_match": 2})


def test_config_env_fallback(monkeypatch):
    monkeypatch.setenv("VLLM_LOOKAHEAD_CONFIG", '{"pool_size": 3}')
    assert LookaheadConfig.from_sources(None).pool_size == 3
    assert LookaheadConfig.from_sources({"lookahead": {"pool_size": 5}}).pool_size == 5
    monkeypatch.setenv("VLLM_LOOKAHEAD_CONFIG", "{nope")
    with pytest.raises(LookaheadConfigError, match="not valid JSON"):
        LookaheadConfig.from_sources(None)


# ----------------------------------------------------------------------------- drafter + simulation
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("k", [1, 3, 6])
def test_simulated_output_equals_greedy_and_never_exceeds_k(seed, k):
    next_token, verify = table_model(vocab=7, seed=seed, order=2)
    prompt = [random.Random(seed).randrange(7) for _ in range(20)]
    res = simulate(verify, prompt, 80, k)
    assert res.tokens == greedy(next_token, prompt, 80)
    assert res.steps <= 80
    assert res.accepted <= res.drafted


def test_lookahead_compresses_a_repetitive_model():
    """A low-entropy model (small vocabulary, order-2 table) cycles; lookahead must find the cycle."""
    _, verify = table_model(vocab=5, seed=1, order=2)
    res = simulate(verify, [0, 1, 2, 3], 200, 4)
    assert res.compression > 2.5, res


def test_jacobi_trajectory_ngrams_are_model_consistent():
    """Order-1 model: the next token is f(last token).  With prompt seeding off, every n-gram in the pool
    -- from committed output or from Jacobi trajectories at rejected positions -- must follow f.  A
    trajectory n-gram stitched from misaligned positions or iterations would break the chain."""
    rng = random.Random(3)
    f = [rng.randrange(40) for _ in range(40)]

    def verify(ctx, draft):
        seq = list(ctx) + list(draft)
        return [f[t] for t in seq[len(ctx) - 1:]]

    # (the pool is kept for a lone request only when asked: pool_max_batch is 0 by default)
    cfg = LookaheadConfig(seed_from_prompt=False, ngram=4, min_acceptance=0.0, pool_max_batch=1)
    drafter = LookaheadDrafter(cfg, 5)
    prompt = [rng.randrange(40) for _ in range(30)]
    res = simulate(verify, prompt, 120, 5, drafter=drafter)
    assert len(res.tokens) == 120
    state = next(iter(drafter.states.values()))
    checked = 0
    for key in range(40):
        for cont in state.pool.get(key):
            chain = [key, *cont]
            assert all(f[a] == b for a, b in zip(chain, chain[1:])), (key, cont)
            checked += 1
    assert checked > 0
    assert state.stats.by_source, "the drafter drafted from some source"


def test_state_keyed_by_request_id_across_reordering():
    cfg = LookaheadConfig()
    d = LookaheadDrafter(cfg, 3)
    a = [1, 2, 3, 1, 2, 3, 1, 2]
    b = [9, 8, 7, 9, 8, 7, 9, 8]
    d.step([RowStep("a", a, len(a), [2], prompt_len=7), RowStep("b", b, len(b), [8], prompt_len=7)])
    drafts = d.step([RowStep("b", b + [7], 9, [7]), RowStep("a", a + [3], 9, [3])])
    assert drafts[0][:2] == [9, 8] and drafts[1][:2] == [1, 2]


def test_finished_requests_are_pruned_and_bounded():
    cfg = LookaheadConfig(max_dormant_requests=2)
    d = LookaheadDrafter(cfg, 2)
    for i in range(10):
        d.step([RowStep(f"r{i}", [1, 2, 3], 3, [3], prompt_len=2)])
    assert len(d.states) == 1 and len(d._dormant) <= 2


def test_adaptive_policy_turns_off_and_probes():
    """Policy "ema": a model that never agrees with any draft drives the EMA down: the request stops drafting and
    only probes every probe_interval steps."""
    cfg = LookaheadConfig(policy="ema", min_acceptance=0.2, probe_interval=5, free_draft_batch_size=0)
    d = LookaheadDrafter(cfg, 4)
    ctx = [1, 2, 1, 2, 1, 2]
    draft = d.step([RowStep("r", ctx, len(ctx), [2], prompt_len=5)])[0]
    lengths = []
    for step in range(40):
        new = [100 + step]  # never what was drafted
        argmax = [100 + step] * (len(draft) + 1)
        ctx = ctx + new
        draft = d.step([RowStep("r", ctx, len(ctx), new, len(draft), argmax)])[0]
        lengths.append(len(draft))
    tail = lengths[20:]
    assert sum(1 for n in tail if n > 0) <= len(tail) // 5 + 1, lengths


def test_batch_budget_and_busy_threshold():
    cfg = LookaheadConfig(max_batch_draft_tokens=6, batch_size_threshold=100)
    d = LookaheadDrafter(cfg, 4)
    rows = [RowStep(f"r{i}", [1, 2, 1, 2, 1, 2], 6, [2], prompt_len=5) for i in range(5)]
    drafts = d.step(rows)
    assert sum(len(x) for x in drafts) <= 6
    busy = LookaheadDrafter(LookaheadConfig(policy="ema", batch_size_threshold=2, busy_min_acceptance=0.9,
                                            confident_fallback=False), 4)
    drafts = busy.step(rows)  # initial EMA 0.5 < 0.9 and the batch is busy: nobody drafts
    assert all(len(x) == 0 for x in drafts)


def test_busy_batch_falls_back_to_confident_context_matches_only():
    """Below the floor a request drafts what prompt lookup would (a >= 2-token suffix seen before),
    never the pool or Jacobi fill; a request without such a match drafts nothing."""
    d = LookaheadDrafter(LookaheadConfig(policy="ema", batch_size_threshold=2, busy_min_acceptance=0.9), 4)
    repeat = [7, 8, 9, 5, 7, 8]  # suffix (7, 8) seen before -> continuation 9 5 7 8
    once = [7, 8, 9, 5, 6, 8]  # only the 1-token suffix (8) repeats: not confident
    rows = [RowStep("a", repeat, 6, [8], prompt_len=5), RowStep("b", once, 6, [8], prompt_len=5),
            RowStep("c", repeat, 6, [8], prompt_len=5)]
    drafts = d.step(rows)
    assert drafts == [[9, 5, 7, 8], [], [9, 5, 7, 8]]
    free = LookaheadDrafter(LookaheadConfig(policy="ema"), 4).step(rows)  # not busy: b drafts from the 1-token match
    assert free[1] != []


def test_prefill_rows_get_no_draft():
    d = LookaheadDrafter(LookaheadConfig(), 4)
    assert d.step([RowStep("r", [1, 2, 1, 2], 4, [], prompt_len=8)]) == [[]]


def test_shared_pool_carries_output_ngrams_across_requests_but_not_prompts():
    """Policy "ema"'s engine-wide n-gram pool (policy "cost" uses the output memory instead)."""
    d = LookaheadDrafter(LookaheadConfig(policy="ema", min_match=3, max_match=4), 4)
    prompt_a = [900, 901, 902, 903]
    out_a = [10, 11, 12, 13, 14]
    ctx = prompt_a[:]
    for t in out_a:  # request a generates 10 11 12 13 14 one token per step (no drafts accepted)
        ctx = ctx + [t]
        d.step([RowStep("a", ctx, len(ctx), [t], prompt_len=len(prompt_a))])
    # request b ends its prompt on 10: its own pool has nothing for 10, the shared pool has a's output
    b = [500, 501, 10]
    assert d.step([RowStep("b", b, 3, [10], prompt_len=2)]) == [[11, 12, 13]]  # one 4-gram, no chain
    # a's *prompt* n-grams are not shared: b ending on 901 gets no draft from them
    c = [600, 601, 901]
    assert d.step([RowStep("c", c, 3, [901], prompt_len=2)]) == [[]]
    off = LookaheadDrafter(LookaheadConfig(policy="ema", min_match=3, max_match=4, shared_pool_keys=0), 4)
    ctx = prompt_a[:]
    for t in out_a:
        ctx = ctx + [t]
        off.step([RowStep("a", ctx, len(ctx), [t], prompt_len=len(prompt_a))])
    assert off.step([RowStep("b", b, 3, [10], prompt_len=2)]) == [[]]


_PERIOD = [3, 1, 4, 1, 5, 9, 2, 6]


def _periodic(i: int, pos: int) -> int:
    """Row i's token at position pos: a periodic text, what a copying model commits."""
    return (_PERIOD[pos % 8] + i) % 50


def _guarded_run(step_cost, steps: int = 200, batch: int = 32, policy: str = "ema", truth=_periodic,
                 drafter: LookaheadDrafter | None = None) -> list[int]:
    """Drive the drafter at a busy batch with a fake clock: every step each row commits the longest
    prefix of its draft that matches ``truth(row, position)`` plus the model's next token, and a step
    takes ``step_cost(draft_rows)`` seconds.  Returns the draft tokens of every step."""
    d = drafter or LookaheadDrafter(LookaheadConfig(policy=policy), 4)
    now = [0.0]
    d.clock = lambda: now[0]
    ctxs = [[truth(i, j) for j in range(24)] for i in range(batch)]
    drafts = d.step([RowStep(f"r{i}", c, len(c), [c[-1]], prompt_len=23) for i, c in enumerate(ctxs)])
    made = []
    for _ in range(steps):
        n_draft = sum(len(x) for x in drafts)
        made.append(n_draft)
        now[0] += step_cost(n_draft)
        rows = []
        for i, dr in enumerate(drafts):
            c = ctxs[i]
            new = []
            for t in dr:  # greedy verification: the drafts that match, then the model's own token
                if t != truth(i, len(c)):
                    break
                new.append(t)
                c.append(t)
            new.append(truth(i, len(c)))
            c.append(new[-1])
            rows.append(RowStep(f"r{i}", c, len(c), new, len(dr), None, 23))
        drafts = d.step(rows)
    return made


@pytest.mark.parametrize("policy", ["ema", "chain"])
def test_busy_batch_guard_stops_drafting_where_plain_decoding_is_faster(policy):
    """Above batch_size_threshold the ema and chain policies time their steps: where draft rows cost more
    than they return they draft nothing (but for the re-tries), where they pay they keep drafting."""
    expensive = _guarded_run(lambda n: 0.010 + 0.002 * n, policy=policy)  # 128 draft rows triple a step
    cheap = _guarded_run(lambda n: 0.010 + 0.00001 * n, policy=policy)
    steady = expensive[40:]
    assert sum(1 for n in steady if n > 0) <= len(steady) // 10, expensive
    # cheap rows: "off" only for its 8 measuring steps and the re-tries (2 steps in 64)
    assert sum(1 for n in cheap if n == 0) <= 8 + 2 * (len(cheap) // 64 + 1), cheap
    assert sum(cheap) > 0.8 * 4 * 32 * (len(cheap) - 20), cheap
    # at or below guard_batch_size nothing is guarded: rows keep drafting however slow the step
    small = _guarded_run(lambda n: 0.010 + 0.002 * n, steps=60, batch=LookaheadConfig().guard_batch_size,
                         policy=policy)
    assert all(n > 0 for n in small[1:]), small
    # steps that prefill a joining request are slow whatever the mode: they are not credited to it
    d = LookaheadDrafter(LookaheadConfig(policy=policy), 4)
    tick = iter(range(1, 10**6))
    d.clock = lambda: 0.01 * next(tick)
    rows = [RowStep(f"r{i}", [1, 2, 3], 3, [3], prompt_len=2) for i in range(20)]
    d.step(rows)
    d.step(rows + [RowStep("new", [1, 2, 3], 3, [3], prompt_len=2)])
    d.step(rows[:5] + [RowStep(f"r{i}", [1, 2, 3], 3, [], prompt_len=2) for i in range(5, 20)])
    assert sum(s["steps"] for s in d.guards[32].summary().values()) == 0


def test_busy_batch_guard_drafts_only_sure_tokens_where_weak_drafts_cost_more_than_they_return():
    """Policy "chain", a busy batch of 32: half the rows copy a periodic text (their drafts are accepted),
    half copy it with a random token at 30% of the positions (a draft's later tokens are rarely all
    right).  Where a draft row costs 2% of a step, the guard's "strict" mode (the higher
    ``chain_strict_min_p`` floor) serves the most tokens/s: it keeps the sure draft tokens and drops
    the long shots.  Where rows are free it drafts at the configured floor, which commits more tokens
    per step, and where rows are dearer still it drafts nothing."""
    rng = random.Random(7)
    noise = [[rng.randrange(50) if rng.random() < 0.3 else None for _ in range(1000)] for _ in range(32)]

    def truth(i: int, pos: int) -> int:
        return _periodic(i, pos) if i < 16 or noise[i][pos] is None else noise[i][pos]

    def run(row_cost: float) -> tuple[LookaheadDrafter, list[int]]:
        # fixed floors: the guard chooses between the configured and the strict floor (a measured floor,
        # the default, would itself rise to the rows' price and leave "strict" nothing to win)
        d = LookaheadDrafter(LookaheadConfig(policy="chain", chain_strict_min_p=0.3, measured_floor=False), 4)
        return d, _guarded_run(lambda n: 0.010 + row_cost * n, steps=300, truth=truth, drafter=d)

    costly, made = run(0.0002)
    guard = costly.guards[32].summary()
    assert max(guard, key=lambda m: guard[m]["tokens_per_s"]) == "strict", guard
    # after the 24 measuring steps the strict mode ran but for the re-tries (2 steps in 64)
    assert guard["strict"]["steps"] >= 300 - 24 - 2 * (300 // 64 + 1) - 1, guard
    free, made_free = run(0.0)
    guard_free = free.guards[32].summary()
    assert max(guard_free, key=lambda m: guard_free[m]["tokens_per_s"]) == "chain", guard_free
    assert sum(made_free[40:]) > 1.2 * sum(made[40:])  # the configured floor drafts the long shots too
    dear, _ = run(0.0004)
    guard_dear = dear.guards[32].summary()
    assert max(guard_dear, key=lambda m: guard_dear[m]["tokens_per_s"]) == "off", guard_dear
    default = LookaheadDrafter(LookaheadConfig(policy="chain"), 4)
    _guarded_run(lambda n: 0.010, steps=30, truth=truth, drafter=default)
    assert set(default.guards[32].summary()) == {"chain", "off"}  # the strict mode is opt-in


def test_compiled_kernels_work_where_numba_cannot_cache():
    """numba refuses ``cache=True`` when it finds no writable cache location for a function's source;
    a function defined by exec() has no source file, a real case of that refusal (no mock).  The
    wrapper must still return a working compiled function."""
    from numba import njit

    from vllm_lookahead.core.jit import compiled

    scope: dict = {}
    exec("def twice(x):\n    return 2 * x\n", scope)
    with pytest.raises(RuntimeError, match="cannot cache"):
        njit(cache=True)(scope["twice"])
    assert compiled(scope["twice"])(21) == 42


def test_missing_numba_is_a_clear_error_at_drafter_start_not_at_import():
    """numba comes with the cpu/cuda extras (not a base dependency: the sidecar never loads it).  Without
    it, importing the core still works and starting a drafter says what to install.  numba's absence is
    SIMULATED (``sys.modules["numba"] = None``, in a fresh interpreter): this venv has it installed."""
    import subprocess
    import sys

    code = ("import sys\nsys.modules['numba'] = None\n"
            "from vllm_lookahead.core import LookaheadConfig, LookaheadDrafter\n"
            "try:\n    LookaheadDrafter(LookaheadConfig(), 4)\n"
            "except ModuleNotFoundError as e:\n    print('ERROR', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ERROR" in r.stdout and "needs numba" in r.stdout and "vllm-lookahead[cpu]" in r.stdout, r.stdout


def test_a_measured_floor_is_the_price_of_a_draft_row_and_drafts_less_where_rows_are_dear():
    """``measured_floor``: once a batch-size bucket has 32 timed steps, policy "chain"'s floor there is the
    step time a row adds times the steps' tokens/s (``DraftRowPrice``).  The same busy batch as the guard
    tests, under two step-time laws (fake clock): where a row costs more, the measured floor is higher
    and fewer draft tokens are made; before the bucket is measured the configured floor serves."""
    rng = random.Random(7)
    noise = [[rng.randrange(50) if rng.random() < 0.3 else None for _ in range(1000)] for _ in range(32)]

    def truth(i: int, pos: int) -> int:  # half the rows copy a periodic text, half with 30% random tokens
        return _periodic(i, pos) if i < 16 or noise[i][pos] is None else noise[i][pos]

    def run(row_s: float) -> tuple[LookaheadDrafter, list[int]]:
        d = LookaheadDrafter(LookaheadConfig(policy="chain", guard_batch_size=64), 4)  # no guard at 32
        configured = d.chain_floor(32)
        assert d.row_price.price(32) is None
        made = _guarded_run(lambda n: 0.010 + row_s * (32 + n), steps=200, drafter=d, truth=truth)
        price = d.row_price.summary()["32"]
        assert price["row_ms"] == pytest.approx(1000 * row_s, rel=0.05), price
        # the price: seconds a row adds x tokens/s of the same steps
        assert price["price"] == pytest.approx(row_s * price["tokens_per_s"], rel=1e-6), price
        assert d.chain_floor(32) == max(min(price["price"], 0.5), d.cfg.chain_min_p) != configured
        assert d.chain_floor(1) == d.cfg.chain_min_p  # another bucket: still the configured floor
        return d, made

    cheap, made_cheap = run(0.00002)
    dear, made_dear = run(0.0002)
    assert dear.chain_floor(32) > cheap.chain_floor(32)
    assert sum(made_dear[60:]) < sum(made_cheap[60:])
    fixed = LookaheadDrafter(LookaheadConfig(policy="chain", guard_batch_size=64, measured_floor=False), 4)
    _guarded_run(lambda n: 0.010 + 0.0002 * (32 + n), steps=60, drafter=fixed, truth=truth)
    assert fixed.row_price.price(32) is None and fixed.chain_floor(32) == fixed.cfg.busy_floor(4)
    steady = LookaheadDrafter(LookaheadConfig(policy="chain", guard_batch_size=64), 4)
    _guarded_run(lambda n: 0.010 + 0.0002 * (32 + n), steps=60, drafter=steady)  # every row drafts k: 128 rows
    assert steady.row_price.price(32) is None  # one step size: no slope to measure, the configured floor


def test_draft_row_price_fits_noisy_steps_and_skips_idle_time():
    """``DraftRowPrice`` on synthetic steps: step time = 3 ms + 0.1 ms per query row + 0.3 ms when the step
    has drafts, 5% noise; every 50th gap is idle time (a second).  The fitted row cost and the price
    (row cost x tokens/s) come out right, the idle gaps are not taken as steps, and nothing is priced
    before 32 steps."""
    from vllm_lookahead.core.cost_model import DraftRowPrice, batch_bucket

    rng = np.random.default_rng(0)
    price = DraftRowPrice()
    tokens_total = seconds_total = 0.0
    for i in range(400):
        drafts = int(rng.integers(0, 9))
        t = (0.003 + 0.0001 * (1 + drafts) + (0.0003 if drafts else 0.0)) * (1 + 0.05 * rng.standard_normal())
        tokens = 1 + int(rng.integers(0, drafts + 1))
        if i < 31:
            assert price.price(1) is None
        if i % 50 == 49:
            price.observe(1, drafts, tokens, 1.0)  # idle: the engine waited for work
            continue
        price.observe(1, drafts, tokens, t)
        if i >= 400 - 256:
            tokens_total += tokens
            seconds_total += t
    got = price.summary()["1"]
    assert got["row_ms"] == pytest.approx(0.1, rel=0.15), got
    assert got["tokens_per_s"] == pytest.approx(tokens_total / seconds_total, rel=0.05), got
    assert price.price(1) == pytest.approx(0.0001 * tokens_total / seconds_total, rel=0.15)
    assert price.price(2) is None and [batch_bucket(n) for n in (1, 2, 3, 5, 8, 9, 33)] == [1, 2, 4, 8, 8, 16, 64]


def test_draft_row_price_is_not_fooled_by_a_machine_that_slows_down_as_drafts_grow():
    """On a shared machine step times drift (neighbours, frequency) while the draft rows drift too (the
    output memory fills): here a step gains 2 ms over the window as the drafts grow from ~1 to ~7 tokens,
    on top of 3 ms + 0.1 ms per query row.  A fit of levels would credit the drift to the rows; the fit of
    consecutive differences (``DraftRowPrice._refit``) recovers the row's 0.1 ms."""
    from vllm_lookahead.core.cost_model import DraftRowPrice

    rng = np.random.default_rng(1)
    price = DraftRowPrice()
    rows_seen, times = [], []
    for i in range(256):
        drafts = int(np.clip(round(1 + 6 * i / 256 + rng.normal(0, 1.5)), 0, 8))
        t = 0.003 + 0.0001 * (1 + drafts) + 0.002 * i / 256 + 0.00005 * rng.standard_normal()
        price.observe(1, drafts, 1 + drafts // 2, t)
        rows_seen.append(1 + drafts)
        times.append(t)
    levels_slope = np.polyfit(rows_seen, times, 1)[0]
    assert levels_slope > 0.00015  # the drift makes a fit of levels see 50%+ dearer rows
    assert price.summary()["1"]["row_ms"] == pytest.approx(0.1, rel=0.15), price.summary()
