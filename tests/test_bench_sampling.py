"""``bench --temperature/--top-p/--top-k/--request-seed``: the sampling every method runs with, and the
exactness figure that only greedy runs can have."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vllm_lookahead.bench import (
    _aggregate,
    _mark_exact,
    build_parser,
    main,
    request_seed,
    sampling_kwargs,
    sampling_record,
)


def run(method: str, tps: float, ids: list[list[int]]) -> dict:
    return {"method": method, "by_batch_size": {"1": {"tokens_per_s": tps, "compression": 2.0, "token_ids": ids}}}


@pytest.mark.unit
def test_default_is_greedy_and_given_fields_reach_every_request():
    args = build_parser().parse_args([])
    assert sampling_kwargs(args) == {"temperature": 0.0, "max_tokens": 128}  # vLLM's defaults for the rest
    args = build_parser().parse_args(["--temperature", "0.7", "--top-p", "0.9", "--top-k", "20",
                                      "--request-seed", "5", "--max-tokens", "8"])
    assert sampling_kwargs(args) == {"temperature": 0.7, "max_tokens": 8, "top_p": 0.9, "top_k": 20}
    assert sampling_record(args) == {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "request_seed": 5}


@pytest.mark.unit
def test_request_seed_follows_the_prompt_not_its_position():
    """A prompt keeps its seed whichever prompts around it a method kept; another base moves it."""
    assert request_seed(5, "def f():\n") == request_seed(5, "def f():\n")
    assert request_seed(5, "def f():\n") != request_seed(5, "def g():\n")
    assert request_seed(5, "def f():\n") != request_seed(6, "def f():\n")
    assert 0 <= request_seed(2**31 - 1, "x") < 2**31


@pytest.mark.unit
def test_exactness_is_null_when_sampling_unseeded_and_survives_aggregation():
    ok, other = [[1, 2], [3]], [[1, 2], [4]]
    runs = [[run("none", 100.0, ok), run("x", 150.0, other)], [run("none", 90.0, ok), run("x", 140.0, ok)]]
    for r in runs:
        _mark_exact(r, [1], comparable=False)
    agg = {r["method"]: r["by_batch_size"]["1"] for r in _aggregate(runs)}
    assert agg["x"]["exact_vs_none"] is None and agg["x"]["exact_vs_none_bs1"] is None
    assert agg["x"]["speedup_vs_none_median"] == pytest.approx((1.5 + 140 / 90) / 2)
    greedy = [run("none", 100.0, ok), run("x", 150.0, other)]
    _mark_exact(greedy, [1])  # the default: greedy or seeded, compared as before
    assert greedy[1]["by_batch_size"]["1"]["exact_vs_none"] == 0.5


@pytest.mark.unit
def test_bad_sampling_is_a_usage_error(capsys):
    for bad in (["--temperature", "-1"], ["--top-p", "0"], ["--top-p", "1.5"]):
        assert main(["--n", "2", *bad]) == 2, bad
        assert "--temperature must be >= 0 and --top-p in (0, 1]" in capsys.readouterr().err


@pytest.mark.vllm
def test_sampled_bench_records_its_sampling_and_no_exactness(tmp_path):
    """A tiny real unseeded T=0.7 run: the JSON says how it sampled, and `outputs identical to none`
    is null for every method rather than a share that would read as a loss of quality."""
    out = tmp_path / "b.json"
    r = subprocess.run([sys.executable, "-m", "vllm_lookahead.cli", "bench", "--prompts", "open", "--n", "4",
                        "--methods", "none lookahead:k=8", "--batch-sizes", "2", "--max-tokens", "8",
                        "--temperature", "0.7", "--top-p", "0.95", "--isolation", "none",
                        "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(out.read_text())
    assert rep["sampling"] == {"temperature": 0.7, "top_p": 0.95, "top_k": None, "request_seed": None}
    for res in rep["results"]:
        m = res["by_batch_size"]["2"]
        assert m["requests"] == 4 and m["generated_tokens"] > 0
        assert m["exact_vs_none"] is None and m["exact_vs_none_bs1"] is None


@pytest.mark.unit
def test_readme_table_takes_greedy_runs_only():
    """The README table's last column is exactness, which a T>0 run does not have: such a file must not
    become the table's source, while files from before ``sampling`` existed (greedy) still do."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("gen_readme_table", root / "scripts" / "gen_readme_table.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    data = json.loads((root / "benchmarks" / "results" / "il5_k8_open_128_r5.json").read_text())
    assert "sampling" not in data and gen.qualifies(data)
    assert gen.qualifies({**data, "sampling": {"temperature": 0.0}})
    assert not gen.qualifies({**data, "sampling": {"temperature": 0.7}})
