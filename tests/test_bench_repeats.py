"""``bench --repeats``: aggregation over interleaved repeats (median, min/max, same-repeat speed-up,
worst-case exactness), the best baseline of the same repeat, the per-batch-size K SPEC key and the machine record, without starting
an engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_lookahead.bench import (
    _aggregate,
    _load,
    _mark_exact,
    add_vs_best_baseline,
    interleave_chunk,
    interleaved_order,
    machine,
)
from vllm_lookahead.decoders import SpecError, parse_spec

pytestmark = pytest.mark.unit


def run(method: str, tps: float, ids: list[list[int]]) -> dict:
    return {"method": method, "by_batch_size": {"1": {"tokens_per_s": tps, "compression": 2.0,
                                                      "token_ids": ids}}}


def test_aggregate_reports_median_min_max_and_same_repeat_speedup():
    ok, bad = [[1, 2], [3]], [[1, 2], [4]]
    runs = [[run("none", 100.0, ok), run("x", 150.0, ok)],
            [run("none", 50.0, ok), run("x", 90.0, bad)],   # a slow (loaded) repeat for both
            [run("none", 110.0, ok), run("x", 160.0, ok)]]
    for r in runs:
        _mark_exact(r, [1])
    agg = {r["method"]: r["by_batch_size"]["1"] for r in _aggregate(runs)}
    x = agg["x"]
    assert x["tokens_per_s"] == 150.0 and x["tokens_per_s_min"] == 90.0 and x["tokens_per_s_max"] == 160.0
    # speed-up against `none` of the same repeat: 1.5, 1.8, 1.4545 -> median 1.5
    assert x["speedup_vs_none_median"] == pytest.approx(1.5)
    assert x["speedup_vs_none_max"] == pytest.approx(1.8)
    assert x["exact_vs_none"] == 0.5  # the worst repeat: one output of two differed
    assert agg["none"]["exact_vs_none"] == 1.0


def test_per_batch_size_k_spec():
    kw = parse_spec("ngram:k=4,kbs=1-8x4/9-32x0").engine_kwargs()["speculative_config"]
    assert kw["num_speculative_tokens_per_batch_size"] == [(1, 8, 4), (9, 32, 0)]
    kw = parse_spec("ngram:k=4,kbs=1-1x4/2-64x2").engine_kwargs()["speculative_config"]
    assert kw["num_speculative_tokens_per_batch_size"] == [(1, 1, 4), (2, 64, 2)]
    # suffix: vLLM 0.32's proposer asserts a fixed K, so the SPEC refuses kbs there
    for bad in ("ngram:k=4,kbs=2-8x4", "ngram:k=4,kbs=1-8x4/5-9x2", "ngram:k=4,kbs=1-8", "suffix:k=4,kbs=1-8x4"):
        with pytest.raises(SpecError):
            parse_spec(bad)


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="reads Linux's /proc/cpuinfo")
def test_machine_record_names_the_cpu_vector_extensions():
    """Bench figures from an AVX-512 machine and an AVX2 one are not comparable: the record says which."""
    flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith(("flags", "Features"))).split(":", 1)[1].split()
    record = machine()
    assert record["cpu_vector_isa"] == [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "asimd", "sve")
                                        if f in flags]
    assert record["cpu_model"] and record["cpu_count"] >= 1


def test_speedup_over_the_best_baseline_pairs_each_repeat():
    """Each repeat's tokens/s over the faster of ngram and suffix *in that repeat*: a slow repeat (the
    machine was busy for everyone) cancels out, which the ratio of two medians does not do."""
    ok = [[1]]
    runs = [[run("none", 100.0, ok), run("ngram:k=4", 150.0, ok), run("suffix:k=4", 200.0, ok), run("lookahead:k=4", 220.0, ok)],
            [run("none", 60.0, ok), run("ngram:k=4", 130.0, ok), run("suffix:k=4", 120.0, ok), run("lookahead:k=4", 126.0, ok)],
            [run("none", 100.0, ok), run("ngram:k=4", 150.0, ok), run("suffix:k=4", 205.0, ok), run("lookahead:k=4", 200.0, ok)]]
    for r in runs:
        _mark_exact(r, [1])
    results = _aggregate(runs)
    add_vs_best_baseline(results)
    agg = {r["method"]: r["by_batch_size"]["1"] for r in results}
    la = agg["lookahead:k=4"]
    # best baseline per repeat: suffix 200, ngram 130, suffix 205 -> ratios 1.1, 0.969, 0.976
    assert la["speedup_vs_best_baseline_all"] == pytest.approx([1.1, 126 / 130, 200 / 205])
    assert la["speedup_vs_best_baseline_median"] == pytest.approx(200 / 205)
    assert la["speedup_vs_best_baseline_min"] == pytest.approx(126 / 130)
    # the ratio of the medians says otherwise: 200 / 200 (lookahead's and suffix's medians)
    assert la["tokens_per_s"] / agg["suffix:k=4"]["tokens_per_s"] == pytest.approx(1.0)
    assert "speedup_vs_best_baseline_median" not in agg["none"]
    assert agg["suffix:k=4"]["speedup_vs_best_baseline_all"] == pytest.approx([1.0, 120 / 130, 1.0])


def test_load_record_holds_the_cpu_time_stolen_by_the_hypervisor():
    """Each repeat's load record carries /proc/stat's cumulative steal time, so a repeat's share of
    stolen CPU is ``after - before``: it must be a non-decreasing count of seconds on Linux."""
    import sys

    a = _load()
    b = _load()
    assert {"loadavg_1m", "cpu_steal_s", "time"} <= set(a)
    if sys.platform.startswith("linux"):
        assert isinstance(a["cpu_steal_s"], float) and 0.0 <= a["cpu_steal_s"] <= b["cpu_steal_s"]


def test_interleaved_chunks_run_every_prompt_on_every_method_chunk_by_chunk():
    """``--interleave chunks``: each chunk of prompts runs on every method before the next chunk (so the
    methods of a chunk share the machine's state of those seconds), every method sees every prompt
    once and in order, and the first method rotates from chunk to chunk and from repeat to repeat."""
    for n, m, chunk, start in ((10, 3, 4, 0), (64, 4, 16, 1), (5, 1, 4, 2), (8, 2, 8, 1)):
        order = interleaved_order(n, m, chunk, start)
        assert len(order) == m * -(-n // chunk)
        for i in range(m):  # each method: the chunks in order, covering 0..n exactly once
            spans = [(lo, hi) for j, lo, hi in order if j == i]
            assert [x for lo, hi in spans for x in range(lo, hi)] == list(range(n))
        for c in range(0, len(order), m):  # one chunk = every method once, on the same prompts
            block = order[c : c + m]
            assert sorted(j for j, _, _ in block) == list(range(m))
            assert len({(lo, hi) for _, lo, hi in block}) == 1
            assert block[0][0] == (start + c // m) % m  # the first method rotates
    assert [interleave_chunk(b) for b in (1, 2, 8, 32)] == [4, 4, 16, 64]


def test_prompt_steps_are_told_from_decode_steps():
    """``step_counter.carries_prompt_tokens``: a decode step schedules one token plus the drafts of each
    request; anything more is prompt work (a new request's prefill or a chunk of one)."""
    from types import SimpleNamespace

    from vllm_lookahead.vllm.step_counter import carries_prompt_tokens

    def step(scheduled: dict[str, int], drafts: dict[str, list[int]]):
        return SimpleNamespace(num_scheduled_tokens=scheduled, total_num_scheduled_tokens=sum(scheduled.values()),
                               scheduled_spec_decode_tokens=drafts)

    assert not carries_prompt_tokens(step({"a": 1, "b": 1}, {}))
    assert not carries_prompt_tokens(step({"a": 4, "b": 1}, {"a": [7, 8, 9]}))  # a's 3 drafts + its token
    assert carries_prompt_tokens(step({"a": 4, "b": 1}, {"a": [7]}))  # 2 tokens of a are not drafts
    assert carries_prompt_tokens(step({"a": 1, "new": 300}, {}))  # a prefill next to a decode row
    assert not carries_prompt_tokens(None)
