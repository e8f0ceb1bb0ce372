"""``benchmarks/serve_bench.py``: the serving benchmark's arguments, what it sends, how it pairs and
summarises runs, and one tiny real run through ``vllm-lookahead serve`` and vLLM's own client."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_lookahead.decoders import parse_spec

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "serve_bench.py"
_spec = importlib.util.spec_from_file_location("serve_bench", SCRIPT)
sb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sb)


@pytest.mark.unit
def test_concurrencies_and_temperatures():
    assert sb.parse_concurrency("1,8,32,all") == [1, 8, 32, None]
    assert sb.parse_temperatures("0,0.7,1.0") == [0.0, 0.7, 1.0]
    for bad in ("0", "8,x", "-1"):
        with pytest.raises(ValueError):
            sb.parse_concurrency(bad)
    with pytest.raises(ValueError):
        sb.parse_temperatures("0.7,-1")


@pytest.mark.unit
def test_server_and_client_arguments():
    """The server gets the SPEC's own speculative/additional config (what `bench` runs); the client
    the same sampling for every method, no limit for concurrency `all`."""
    args = sb.build_parser().parse_args(["--top-p", "0.9", "--serve-arg=--enforce-eager"])
    spec = parse_spec("lookahead:k=8")
    argv = sb.serve_args(spec, args)
    kw = spec.engine_kwargs()
    cfg = argv[argv.index("--speculative-config") + 1]
    assert json.loads(cfg) == kw["speculative_config"] and "--enforce-eager" in argv
    assert json.loads(argv[argv.index("--additional-config") + 1]) == kw["additional_config"]
    assert "--speculative-config" not in sb.serve_args(parse_spec("none"), args)
    ngram = sb.serve_args(parse_spec("ngram:k=8"), args)
    assert json.loads(ngram[ngram.index("--speculative-config") + 1])["method"] == "ngram"
    c = sb.client_argv("http://h:1", "m", Path("d.jsonl"), 4, None, 0.7, args)
    assert c[c.index("--temperature") + 1] == "0.7" and c[c.index("--top-p") + 1] == "0.9"
    assert "--max-concurrency" not in c and "--top-k" not in c
    c = sb.client_argv("http://h:1", "m", Path("d.jsonl"), 4, 8, 0.0, args)
    assert c[c.index("--max-concurrency") + 1] == "8" and c[c.index("--num-prompts") + 1] == "4"


def _run(rep: int, method: str, tps: float, tpot: float, conc: int | None = 8, temp: float = 0.7) -> dict:
    return {"repeat": rep, "method": method, "max_concurrency": conc, "temperature": temp,
            "output_tokens_per_s": tps, "tpot_ms_median": tpot, "ttft_ms_median": 10.0, "failed": 0}


@pytest.mark.unit
def test_ratios_pair_the_same_repeat_and_cell_and_summary_spans_repeats():
    """A slow repeat (busy machine for both methods) cancels in the paired ratio."""
    runs = [_run(1, "none", 100.0, 10.0), _run(1, "la", 200.0, 5.0),
            _run(2, "none", 50.0, 20.0), _run(2, "la", 90.0, 11.0),
            _run(3, "none", 100.0, 10.0), _run(3, "la", 160.0, 6.0),
            _run(1, "none", 300.0, 3.0, conc=None), _run(1, "la", 330.0, 3.0, conc=None)]
    for rep in (1, 2, 3):
        sb.add_ratios([r for r in runs if r["repeat"] == rep])
    assert [r["output_tokens_per_s_vs_none"] for r in runs if r["method"] == "la"] == pytest.approx([2.0, 1.8, 1.6, 1.1])
    summary = {(e["method"], conc): f for e in sb.summarize(runs) for conc, f in e["by_concurrency"].items()}
    assert [(e["method"], list(e["by_concurrency"])) for e in sb.summarize(runs)] == [("none", ["8", "all"]),
                                                                                    ("la", ["8", "all"])]
    la = summary[("la", "8")]
    assert la["repeats"] == 3 and la["output_tokens_per_s"]["all"] == [200.0, 90.0, 160.0]
    assert la["output_tokens_per_s_vs_none"]["median"] == pytest.approx(1.8)
    assert (la["output_tokens_per_s_vs_none"]["min"], la["output_tokens_per_s_vs_none"]["max"]) == pytest.approx((1.6, 2.0))
    assert la["tpot_vs_none"]["median"] == pytest.approx(0.55)
    assert summary[("la", "all")]["repeats"] == 1 and summary[("none", "8")]["output_tokens_per_s_vs_none"]["all"] == [1.0] * 3


@pytest.mark.unit
def test_prompt_sets_have_their_own_cells_and_concurrencies():
    """``--prompts 'open copy@1+all'``: open at every --max-concurrency, copy at 1 and saturation only;
    a copy cell's ratio pairs with none's copy cell, never with open's at the same concurrency."""
    assert sb.parse_prompt_sets("open copy@1+all", [1, 8]) == [("open", [1, 8]), ("copy", [1, None])]
    with pytest.raises(ValueError):
        sb.parse_prompt_sets("  ", [1])
    runs = [{**_run(1, "none", 100.0, 10.0, conc=1), "prompts": "open"}, {**_run(1, "la", 90.0, 11.0, conc=1), "prompts": "open"},
            {**_run(1, "none", 50.0, 20.0, conc=1), "prompts": "copy"}, {**_run(1, "la", 150.0, 7.0, conc=1), "prompts": "copy"}]
    sb.add_ratios(runs)
    assert [r["output_tokens_per_s_vs_none"] for r in runs if r["method"] == "la"] == pytest.approx([0.9, 3.0])
    assert [(e["method"], e["prompts"]) for e in sb.summarize(runs)] == [("none", "open"), ("la", "open"),
                                                                          ("none", "copy"), ("la", "copy")]


@pytest.mark.unit
def test_first_method_must_be_none(capsys):
    assert sb.main(["--methods", "lookahead:k=8,none"]) == 2
    assert "first method must be none" in capsys.readouterr().err


@pytest.mark.vllm
def test_tiny_real_serving_run(tmp_path):
    """Two real servers (none, lookahead) and vLLM's client, 4 sampled requests each: every request
    completes, tokens/s and latencies are measured and lookahead's ratio to `none` is filled in."""
    out = tmp_path / "serve.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--n", "4", "--max-tokens", "8", "--methods", "none,lookahead:k=8",
                        "--max-concurrency", "1", "--temperatures", "0.7", "--repeats", "1", "--max-model-len", "1024",
                        "--serve-arg=--enforce-eager", "--workdir", str(tmp_path / "work"), "--json", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(out.read_text())
    runs = {x["method"]: x for x in rep["runs"]}
    assert set(runs) == {"none", "lookahead:k=8"} and rep["sampling"]["temperatures"] == [0.7]
    for x in runs.values():
        assert x["completed"] == 4 and x["failed"] == 0 and x["output_tokens"] > 0
        assert x["output_tokens_per_s"] > 0 and x["ttft_ms_median"] > 0
    la = runs["lookahead:k=8"]
    assert la["acceptance_percent"] is not None and runs["none"]["acceptance_percent"] is None
    assert la["output_tokens_per_s_vs_none"] == pytest.approx(la["output_tokens_per_s"] / runs["none"]["output_tokens_per_s"])
    assert "tokens/s" in r.stderr and "ms" in r.stdout
