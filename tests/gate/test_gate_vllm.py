"""The gate on a real vLLM CPU engine with the demo model: a correct speculative candidate PASSes and
each deliberately faulty candidate (tests.faults, test-only) FAILs.

The faults are injected by patching vLLM internals from the faulty proposer classes -- a real
decoder cannot be made to misbehave on demand, so this is the one place the gate is fed a fault on
purpose.  One baseline engine is shared by the module; every candidate gets its own engine (vLLM
needs one per speculative config).  Small eval subset (2 items per task, 24 tokens) keeps it fast.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests import faults
from vllm_lookahead.decoders import parse_spec
from vllm_lookahead.gate.engine import ArmRuns
from vllm_lookahead.gate.evalset import DEFAULT_EVAL_SET, load_eval_set
from vllm_lookahead.gate.policy import load_policy
from vllm_lookahead.gate.run import GateInputs, evaluate, preflight, run_baseline, run_candidate

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

FAULTY = faults.SPEC


def _inputs(model: Path, candidate: str) -> GateInputs:
    pol = load_policy()
    # T>0 is exercised by test_gate_conformance_vllm.py and the CLI test
    pol["criteria"]["sampled"].update(samples_per_item=0, required=False)
    pol["runs"]["latency_items"] = 2
    items = load_eval_set(DEFAULT_EVAL_SET, limit=2)
    items = [it for it in items if it.task != "unit_tests"] + [it for it in items if it.task == "unit_tests"][:1]
    return GateInputs(model, items, "subset", parse_spec("none"), parse_spec(candidate), pol,
                      default_max_tokens=24, max_model_len=1024)


def _short(inp: GateInputs) -> GateInputs:
    """Cap every item at 24 tokens: faults show early, and the runs stay short."""
    import dataclasses

    items = [dataclasses.replace(it, max_tokens=min(it.max_tokens or 24, 24)) for it in inp.items]
    return dataclasses.replace(inp, items=items)


@pytest.fixture(scope="module")
def baseline(demo_model: Path) -> tuple[ArmRuns, list[Any]]:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    inp = _short(_inputs(demo_model, "ngram:k=4"))
    return run_baseline(inp), preflight(inp)


def _gate(demo_model: Path, baseline: tuple[ArmRuns, list[Any]], candidate: str) -> dict[str, Any]:
    inp = _short(_inputs(demo_model, candidate))
    base, clfs = baseline
    cand = run_candidate(inp)
    result, _ = evaluate(inp, base, cand, clfs, None, 0.0)
    return result


def test_aa_run_is_measured(baseline: tuple[ArmRuns, list[Any]]) -> None:
    base, _ = baseline
    assert base.aa is not None and base.aa.mode == "chunks of 8"
    assert [r.item_id for r in base.aa.records] == [r.item_id for r in base.greedy.records]
    assert len(base.greedy.records) > 10 and all(r.token_ids for r in base.greedy.records)
    assert base.sequential is not None and base.sequential.mode == "sequential" and len(base.sequential.records) == 2


def test_correct_ngram_candidate_passes(demo_model: Path, baseline: tuple[ArmRuns, list[Any]]) -> None:
    res = _gate(demo_model, baseline, "ngram:k=4")
    assert res["verdict"] == "PASS", res["criteria"]
    lat = res["latency"]["candidate"]
    assert lat["drafted_tokens"] > 0 and lat["compression"] > 1.0
    assert res["latency"]["baseline"]["drafted_tokens"] == 0
    # per-request spec metrics agree with vLLM's aggregate counters
    assert lat["engine_counters"]["num_accepted_tokens"] == lat["accepted_tokens"]


@pytest.mark.parametrize("fault, must_fail", [
    ("SecondChoiceProposer:k=4", "exact_match"),
    ("DropLastTokenProposer:k=4,fraction=0.5", "exact_match"),
    ("CorruptTokenProposer:k=4,fraction=0.5,position=1", "exact_match"),
])
def test_faulty_candidate_fails(demo_model: Path, baseline: tuple[ArmRuns, list[Any]], fault: str,
                                must_fail: str) -> None:
    res = _gate(demo_model, baseline, FAULTY + fault)
    assert res["verdict"] == "FAIL", res["criteria"]
    assert must_fail in res["failed"]
    assert res["exact_match"]["candidate"]["mismatches"] > res["exact_match"]["aa"]["mismatches"]
    assert res["exact_match"]["aa"]["n"] == res["n_items"]
