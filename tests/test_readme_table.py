"""The results table in README.md and benchmarks/results/README.md is what scripts/gen_readme_table.py
generates from the newest same-invocation comparison of the default against none / ngram / suffix.

Recording a newer qualifying JSON, or editing the block by hand, fails here until the script is re-run.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
SPEC = importlib.util.spec_from_file_location("gen_readme_table", ROOT / "scripts" / "gen_readme_table.py")
gen = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gen)


def test_the_table_has_sources_for_both_prompt_sets() -> None:
    sources = gen.select()
    assert set(sources) >= {"open", "copy"}, sources.keys()
    for _prompts, (name, data) in sources.items():
        assert [r["method"].split(":")[0] for r in gen.headline(data)] == ["none", "ngram", "suffix", "lookahead"], name


@pytest.mark.parametrize("path", list(gen.TARGETS), ids=lambda p: str(p.relative_to(ROOT)))
def test_marked_block_equals_the_generated_table(path: Path) -> None:
    text = path.read_text()
    assert text == gen.render(text, gen.table(gen.select(), gen.TARGETS[path])), (
        f"{path.relative_to(ROOT)}: the table block is out of date; run python scripts/gen_readme_table.py")


def test_qualifies_rejects_an_override_or_a_missing_baseline() -> None:
    base = {"command": "x", "interleave": "chunks", "repeats": 5, "prompts": "open",
            "results": [{"method": m, "by_batch_size": {b: {"speedup_vs_none_median": 1.0} for b in ("1", "8", "32")}}
                        for m in ("none", "ngram:k=8", "suffix:k=8", "lookahead:k=8")]}
    assert gen.qualifies(base)
    override = {**base, "results": [*base["results"][:3], {**base["results"][3], "method": "lookahead:k=8,chain_min_p=0.1"}]}
    assert not gen.qualifies(override)
    assert not gen.qualifies({**base, "results": base["results"][1:]})
    assert not gen.qualifies({**base, "interleave": None})
    assert not gen.qualifies({**base, "results": [*base["results"][:3], {**base["results"][3], "method": "lookahead:k=4"}]})


def test_a_peer_or_lookahead_at_another_k_runs_beside_the_four_rows() -> None:
    recs = [{"method": m, "by_batch_size": {b: {"speedup_vs_none_median": 1.0} for b in ("1", "8", "32")}}
            for m in ("none", "ngram:k=8", "suffix:k=4", "suffix:k=8", "lookahead:k=8")]
    data = {"command": "x", "interleave": "chunks", "repeats": 3, "prompts": "/x/real_chat.jsonl",
            "model": "/cache/smollm2-135m-instruct", "results": recs}
    assert [r["method"] for r in gen.headline(data)] == ["none", "ngram:k=8", "suffix:k=8", "lookahead:k=8"]
    # lookahead at another k beside the default: the default's row
    other_k = {**data, "results": [*recs[:4], {**recs[4], "method": "lookahead:k=4"}, recs[4]]}
    assert [r["method"] for r in gen.headline(other_k)] == ["none", "ngram:k=8", "suffix:k=8", "lookahead:k=8"]
    assert gen.prompt_set(data) == "smollm2-135m-instruct, real_chat"
    assert gen.prompt_set({"prompts": "open", "model": "/w/models/demo-code-4l"}) == "open"


@pytest.mark.parametrize("path", list(gen.TARGETS), ids=lambda p: str(p.relative_to(ROOT)))
def test_served_block_equals_the_generated_table(path: Path) -> None:
    text = path.read_text()
    assert text == gen.render(text, gen.served_table(gen.served_select(), gen.TARGETS[path]), gen.SERVED_BEGIN,
                              gen.SERVED_END), f"{path.relative_to(ROOT)}: the served block is out of date"


def test_served_table_takes_serve_bench_files_with_three_repeats_and_none_first(tmp_path: Path) -> None:
    """A serve_bench file qualifies with vLLM's client, >= 3 repeats and `none` first; each row shows one
    summary record (method, prompt set, temperature) at every concurrency: none in tokens/s, others as
    ratios to none."""
    import json

    def rec(method: str, temp: float, tps: float, ratio: float) -> dict:
        fig = {"output_tokens_per_s": {"median": tps, "min": tps, "max": tps},
               "output_tokens_per_s_vs_none": {"median": ratio, "min": ratio - 0.1, "max": ratio + 0.1}}
        return {"method": method, "prompts": "open", "temperature": temp, "by_concurrency": {"1": fig, "all": fig}}

    data = {"client": gen.SERVE_CLIENT, "repeats": 3, "model": "/m/demo-code-4l", "time": "t", "command": "c",
            "requests_per_cell": 24, "max_tokens": 96,
            "summary": [rec("none", 0.7, 250.0, 1.0), rec("lookahead:k=8", 0.7, 260.0, 1.04)]}
    (tmp_path / "a.json").write_text(json.dumps(data))
    (tmp_path / "b.json").write_text(json.dumps({**data, "repeats": 2, "time": "u"}))
    sources = gen.served_select(tmp_path)
    assert list(sources) == ["demo-code-4l"] and sources["demo-code-4l"][0] == "a.json"
    table = gen.served_table(sources, detailed=False)
    assert "| open, T=0.7 (`a.json`) | none | 250 / 250 tokens/s |" in table
    assert "| open, T=0.7 (`a.json`) | **lookahead:k=8** | 1.04x [0.94x, 1.14x] / 1.04x [0.94x, 1.14x] |" in table
    (tmp_path / "a.json").write_text(json.dumps({**data, "summary": data["summary"][::-1]}))
    assert gen.served_select(tmp_path) == {}
