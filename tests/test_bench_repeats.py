"""``bench --repeats``: aggregation over interleaved repeats (median, min/max, same-repeat speed-up,
worst-case exactness), the per-batch-size K SPEC key and the machine record, without starting an engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_lookahead.bench import _aggregate, _mark_exact, machine
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
