"""Unit and property tests of the pure lookahead core (no vLLM): context look-up, config validation (removed
keys included), the drafter's k bound, id keying, the busy-batch guard and the measured floor."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_drafter import step_rows

from vllm_lookahead.core import LookaheadConfig, LookaheadConfigError, LookaheadDrafter, RowStep
from vllm_lookahead.core import drafter as drafter_module
from vllm_lookahead.core.jit import load_kernels
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


# ----------------------------------------------------------------------------- context index
@settings(max_examples=80, deadline=None)
@given(seq=st.lists(st.integers(0, 5), min_size=1, max_size=120), lo=st.integers(1, 3), span=st.integers(0, 3))
def test_context_lookup_matches_bruteforce(seq, lo, span):
    hi = lo + span
    end, n, evidence = (int(x) for x in load_kernels().suffix_match_evidence(np.asarray(seq, dtype=np.int32),
                                                                              len(seq), lo, hi))
    cont = seq[end:end + 4] if end >= 0 else []
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
    if expect_n:
        suffix = seq[len(seq) - expect_n:]
        nexts = [seq[i + expect_n] for i in range(len(seq) - expect_n) if seq[i:i + expect_n] == suffix]
        expect_class = 0 if len(nexts) == 1 else (1 if set(nexts) == {expect[0]} else 2)
        assert evidence == expect_class, (nexts, expect)


# ----------------------------------------------------------------------------- config
def test_config_validation_messages():
    cfg = LookaheadConfig.from_dict({"memory_depth": 4, "chain_min_p": 0})
    assert cfg.overrides() == {"memory_depth": 4, "chain_min_p": 0.0}
    with pytest.raises(LookaheadConfigError, match="unknown key"):
        LookaheadConfig.from_dict({"windw": 3})
    with pytest.raises(LookaheadConfigError, match="expected int"):
        LookaheadConfig.from_dict({"memory_depth": "8"})
    with pytest.raises(LookaheadConfigError, match="memory_depth=99 is invalid; must be in 1..32"):
        LookaheadConfig.from_dict({"memory_depth": 99})
    with pytest.raises(LookaheadConfigError, match="min_match"):
        LookaheadConfig.from_dict({"min_match": 5, "max_match": 2})


@pytest.mark.parametrize("key", ["layout", "lade"])
def test_a_key_moved_to_an_extension_fails_naming_where_it_went(key):
    """The 2D layout's keys left the lookahead section: given there, they fail in one line that names
    the extension's proposer and section, never silently ignored."""
    with pytest.raises(LookaheadConfigError) as e:
        LookaheadConfig.from_dict({key: {}})
    msg = str(e.value)
    assert "\n" not in msg and "Lade2DProposer" in msg and 'additional_config["lookahead2d"]' in msg


@pytest.mark.parametrize("key", ["policy", "ema_decay", "pool_size", "window", "W", "chain_max_draft"])
def test_an_unknown_key_fails_and_lists_the_known_ones(key):
    """Keys of earlier, unreleased drafts of the config (and typos) fail at start, naming the known keys."""
    with pytest.raises(LookaheadConfigError, match=f"unknown key\\(s\\) \\[{key!r}\\]; known keys: .*'chain_min_p'"):
        LookaheadConfig.from_dict({key: 1})


def test_at_most_fifteen_documented_top_level_keys():
    """The config stays short: every key has a docstring (the generated table's text)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import gen_config_table

    keys = gen_config_table.documented_keys()
    assert len(keys) <= 15
    assert all(doc for _, _, doc in keys)


def test_config_env_fallback(monkeypatch):
    monkeypatch.setenv("VLLM_LOOKAHEAD_CONFIG", '{"memory_depth": 3}')
    assert LookaheadConfig.from_sources(None).memory_depth == 3
    assert LookaheadConfig.from_sources({"lookahead": {"memory_depth": 5}}).memory_depth == 5
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


def test_state_keyed_by_request_id_across_reordering():
    cfg = LookaheadConfig()
    d = LookaheadDrafter(cfg, 3)
    a = [1, 2, 3, 1, 2, 3, 1, 2]
    b = [9, 8, 7, 9, 8, 7, 9, 8]
    step_rows(d, [RowStep("a", a, len(a), [2], prompt_len=7), RowStep("b", b, len(b), [8], prompt_len=7)])
    drafts = step_rows(d, [RowStep("b", b + [7], 9, [7]), RowStep("a", a + [3], 9, [3])])
    assert drafts[0][:2] == [9, 8] and drafts[1][:2] == [1, 2]


def test_finished_requests_are_pruned_and_bounded(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(drafter_module, "MAX_DORMANT_REQUESTS", 2)
    d = LookaheadDrafter(LookaheadConfig(), 2)
    for i in range(10):
        step_rows(d, [RowStep(f"r{i}", [1, 2, 3], 3, [3], prompt_len=2)])
    assert len(d.batch.active) == 1 and len(d.batch.dormant) <= 2


def test_prefill_rows_get_no_draft():
    d = LookaheadDrafter(LookaheadConfig(), 4)
    assert step_rows(d, [RowStep("r", [1, 2, 1, 2], 4, [], prompt_len=8)]) == [[]]


_PERIOD = [3, 1, 4, 1, 5, 9, 2, 6]


def _periodic(i: int, pos: int) -> int:
    """Row i's token at position pos: a periodic text, what a copying model commits."""
    return (_PERIOD[pos % 8] + i) % 50


def _guarded_run(step_cost, steps: int = 200, batch: int = 32, truth=_periodic,
                 drafter: LookaheadDrafter | None = None, temperature: float = 0.0) -> list[int]:
    """Drive the drafter at a busy batch with a fake clock: every step each row commits the longest
    prefix of its draft that matches ``truth(row, position)`` plus the model's next token, and a step
    takes ``step_cost(draft_rows)`` seconds.  Returns the draft tokens of every step."""
    d = drafter or LookaheadDrafter(LookaheadConfig(), 4)
    now = [0.0]
    d.clock = lambda: now[0]
    ctxs = [[truth(i, j) for j in range(24)] for i in range(batch)]
    drafts = step_rows(d, [RowStep(f"r{i}", c, len(c), [c[-1]], prompt_len=23, temperature=temperature)
                     for i, c in enumerate(ctxs)])
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
            rows.append(RowStep(f"r{i}", c, len(c), new, len(dr), 23, temperature=temperature))
        drafts = step_rows(d, rows)
    return made


def test_busy_batch_guard_stops_drafting_where_plain_decoding_is_faster():
    """Above guard_batch_size the drafter times its steps: where draft rows cost more
    than they return they draft nothing (but for the re-tries), where they pay they keep drafting."""
    expensive = _guarded_run(lambda n: 0.010 + 0.002 * n)  # 128 draft rows triple a step
    cheap = _guarded_run(lambda n: 0.010 + 0.00001 * n)
    steady = expensive[40:]
    assert sum(1 for n in steady if n > 0) <= len(steady) // 10, expensive
    # cheap rows: "off" only for its 8 measuring steps and the re-tries (2 steps in 64)
    assert sum(1 for n in cheap if n == 0) <= 8 + 2 * (len(cheap) // 64 + 1), cheap
    assert sum(cheap) > 0.8 * 4 * 32 * (len(cheap) - 20), cheap
    # at or below guard_batch_size nothing is guarded: rows keep drafting however slow the step
    small = _guarded_run(lambda n: 0.010 + 0.002 * n, steps=60, batch=LookaheadConfig().guard_batch_size)
    assert all(n > 0 for n in small[1:]), small
    # steps that prefill a joining request are slow whatever the mode: they are not credited to it
    d = LookaheadDrafter(LookaheadConfig(), 4)
    tick = iter(range(1, 10**6))
    d.clock = lambda: 0.01 * next(tick)
    rows = [RowStep(f"r{i}", [1, 2, 3], 3, [3], prompt_len=2) for i in range(20)]
    step_rows(d, rows)
    step_rows(d, rows + [RowStep("new", [1, 2, 3], 3, [3], prompt_len=2)])
    step_rows(d, rows[:5] + [RowStep(f"r{i}", [1, 2, 3], 3, [], prompt_len=2) for i in range(5, 20)])
    assert sum(s["steps"] for s in d.guards[(32, False)].summary().values()) == 0


def test_a_sampled_batch_is_guarded_at_any_size():
    """A batch with a request at T > 0 is guarded at every batch size (with the measured floor): where
    its draft rows cost more than they return it drafts nothing but the re-tries, where they pay it
    keeps drafting; the same greedy batch of 2 is not guarded (it drafts however slow the step)."""
    expensive = _guarded_run(lambda n: 0.010 + 0.02 * n, batch=2, temperature=0.8)[40:]
    assert sum(1 for n in expensive if n > 0) <= len(expensive) // 10, expensive
    cheap = _guarded_run(lambda n: 0.010 + 0.00001 * n, batch=2, temperature=0.8)
    assert sum(1 for n in cheap if n == 0) <= 8 + 2 * (len(cheap) // 64 + 1), cheap
    greedy = _guarded_run(lambda n: 0.010 + 0.02 * n, steps=60, batch=2)
    assert all(n > 0 for n in greedy[1:]), greedy


def test_compiled_kernels_work_where_numba_cannot_cache():
    """numba refuses ``cache=True`` when it finds no writable cache location for a function's source;
    a function defined by exec() has no source file, a real case of that refusal (no mock).  The
    wrapper must still return a working compiled function."""
    from numba import njit

    from vllm_lookahead.core.kernels import compiled

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
    """``measured_floor``: once a batch-size bucket has 32 timed steps, the floor there is the
    step time a row adds times the steps' tokens/s (``DraftRowPrice``).  The same busy batch as the guard
    tests, under two step-time laws (fake clock): where a row costs more, the measured floor is higher
    and fewer draft tokens are made; before the bucket is measured the configured floor serves."""
    rng = random.Random(7)
    noise = [[rng.randrange(50) if rng.random() < 0.3 else None for _ in range(1000)] for _ in range(32)]

    def truth(i: int, pos: int) -> int:  # half the rows copy a periodic text, half with 30% random tokens
        return _periodic(i, pos) if i < 16 or noise[i][pos] is None else noise[i][pos]

    def run(row_s: float) -> tuple[LookaheadDrafter, list[int]]:
        d = LookaheadDrafter(LookaheadConfig(guard_batch_size=64), 4)  # no guard at 32
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
    fixed = LookaheadDrafter(LookaheadConfig(guard_batch_size=64, measured_floor=False), 4)
    _guarded_run(lambda n: 0.010 + 0.0002 * (32 + n), steps=60, drafter=fixed, truth=truth)
    assert fixed.row_price.price(32) is None and fixed.chain_floor(32) == fixed.cfg.busy_floor(4)
    steady = LookaheadDrafter(LookaheadConfig(guard_batch_size=64), 4)
    _guarded_run(lambda n: 0.010 + 0.0002 * (32 + n), steps=60, drafter=steady)  # every row drafts k: 128 rows
    assert steady.row_price.price(32) is None  # one step size: no slope to measure, the configured floor


def test_draft_row_price_fits_noisy_steps_and_skips_idle_time():
    """``DraftRowPrice`` on synthetic steps: step time = 3 ms + 0.1 ms per query row + 0.3 ms when the step
    has drafts, 5% noise; every 50th gap is idle time (a second).  The fitted row cost and the price
    (row cost x tokens/s) come out right, the idle gaps are not taken as steps, and nothing is priced
    before 32 steps."""
    from vllm_lookahead.core.row_price import DraftRowPrice, batch_bucket

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
    from vllm_lookahead.core.row_price import DraftRowPrice

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


def test_a_bucket_without_its_own_row_cost_borrows_the_nearest_and_keeps_its_tokens_per_s():
    """A batch that drains passes through small buckets in a few steps: priced after ``BORROW_EVERY`` of
    its steps with the nearest fitted bucket's row cost and its own tokens/s, until it has a fit."""
    from vllm_lookahead.core.row_price import BORROW_EVERY, DraftRowPrice

    rng = np.random.default_rng(2)
    price = DraftRowPrice()
    assert price.price(16) is None
    for _ in range(64):  # bucket 32: 2 ms per query row
        drafts = int(rng.integers(0, 40))
        price.observe(32, drafts, 32 + drafts // 3, 0.040 + 0.002 * (32 + drafts))
    assert price.summary()["32"]["row_ms"] == pytest.approx(2.0, rel=0.01)
    for _ in range(BORROW_EVERY):
        assert price.price(12) is None  # not yet: fewer than BORROW_EVERY steps of its own
        price.observe(12, 0, 12, 0.050)  # no drafts, rows constant: no slope of its own
    got = price.summary()["16"]
    assert got["row_cost_from"] == 32 and got["row_ms"] is None
    assert price.price(12) == pytest.approx(0.002 * 12 / 0.050, rel=1e-6)
    assert price.price(1) is None  # a bucket with no steps is not priced


def test_the_docs_config_table_is_generated_from_the_config_and_current():
    """docs/lookahead.md's configuration table is scripts/gen_config_table.py's output for core/config.py;
    a hand edit or a new key without a regenerated table fails here."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import gen_config_table

    assert gen_config_table.main(["--check"]) == 0, "run python scripts/gen_config_table.py"
    text = gen_config_table.table()
    assert all(f"`{key}`" in text for key, _, _ in gen_config_table.documented_keys())
