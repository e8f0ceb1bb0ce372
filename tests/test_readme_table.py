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
