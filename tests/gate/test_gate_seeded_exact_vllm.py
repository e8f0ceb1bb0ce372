"""The ``seeded_exact`` criterion on real vLLM CPU engines (float32): per-request-seeded T>0 samples of
the candidate token for token vs the baseline's, against the baseline's own seeded A/A run.

* exact lookahead (coupled verification) -> measured coupled, required, passes with no excess mismatch;
* ``CoupledDraftTemperatureProposer`` (test-only: lookahead whose coupled verification samples draft
  positions at T x 0.8) -> measured coupled, required, FAILs;
* the same lookahead engine with coupled verification switched off (vLLM's rejection sampler, exact only
  in distribution) -> measured not coupled, reported, not required.

Drafts at fixed floors (``measured_floor=false``: whether drafts pay on a loaded machine is not what this
file tests), so every candidate drafts at T>0 (checked, else "coupled" would be vacuous).  One baseline
arm for the module; the coupled and the uncoupled lookahead runs share one engine.  The T>0 samples are
not scored (the ``sampled`` criterion is test_gate_conformance_vllm.py's): only token ids are compared.
Small subset: 2 items per task (no sandboxed unit tests), 4 seeded samples per item, at most 32 tokens.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from tests import faults
from vllm_lookahead.decoders import parse_spec
from vllm_lookahead.gate.engine import ArmRuns, GateEngine
from vllm_lookahead.gate.evalset import DEFAULT_EVAL_SET, load_eval_set
from vllm_lookahead.gate.policy import load_policy
from vllm_lookahead.gate.profiles import parse_profiles
from vllm_lookahead.gate.run import (
    GateInputs,
    evaluate,
    opts_for,
    preflight,
    run_baseline,
    run_candidate,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LOOKAHEAD = "lookahead:k=8,measured_floor=false"
FAULT = faults.SPEC + "CoupledDraftTemperatureProposer:k=8,factor=0.8,measured_floor=false"
SAMPLES = 4


def _inputs(model: Path, candidate: str) -> GateInputs:
    pol = load_policy()  # the default profiles: seed: per_request
    pol["criteria"]["sampled"].update(samples_per_item=SAMPLES, required=False)  # not scored here
    pol["runs"]["latency_items"] = 0
    items = [dataclasses.replace(it, max_tokens=min(it.max_tokens or 32, 32))
             for it in load_eval_set(DEFAULT_EVAL_SET, limit=2) if it.task != "unit_tests"]
    return GateInputs(model, items, "subset", parse_spec("none"), parse_spec(candidate), pol,
                      default_max_tokens=32, max_model_len=1024)


def _seeded(res: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in res["criteria"] if c["name"] == "seeded_exact")


@pytest.fixture(scope="module")
def gates(demo_model: Path) -> dict[str, Any]:
    from vllm_lookahead.vllm import coupled_verify

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    base_inp = _inputs(demo_model, "none")
    clfs = preflight(base_inp)
    base = run_baseline(base_inp)
    inp = _inputs(demo_model, LOOKAHEAD)
    profiles = parse_profiles(inp.policy["criteria"]["sampled"]["profiles"])
    with GateEngine(opts_for(inp), inp.candidate) as eng:  # one engine: coupled, then uncoupled
        greedy = eng.run_batch("candidate", inp.items)
        coupled = eng.run_batch("candidate T>0", inp.items, profiles=profiles, samples=SAMPLES)
        applies = coupled_verify.applies
        coupled_verify.applies = lambda *a: False  # vLLM's rejection sampler verifies every T>0 step
        try:
            uncoupled = eng.run_batch("candidate T>0 uncoupled", inp.items, profiles=profiles, samples=SAMPLES)
        finally:
            coupled_verify.applies = applies
    out = {"base": base,
           LOOKAHEAD: evaluate(inp, base, ArmRuns(greedy, sampled=coupled), clfs, None, 0.0)[0],
           "uncoupled": evaluate(inp, base, ArmRuns(greedy, sampled=uncoupled), clfs, None, 0.0)[0]}
    fault_inp = _inputs(demo_model, FAULT)
    out[FAULT] = evaluate(fault_inp, base, run_candidate(fault_inp), clfs, None, 0.0)[0]
    for name in (LOOKAHEAD, "uncoupled", FAULT):  # the measured numbers, for the record
        sx = out[name]["seeded_exact"]
        print(f"seeded_exact {name}: {sx['candidate']['mismatches']}/{sx['candidate']['n']} differ, A/A "
              f"{sx['aa']['mismatches']}/{sx['aa']['n']}, steps {sx['verifier_steps']}, p={sx['p_value']:.3g}")
    return out


def test_the_baseline_repeats_its_seeded_samples_at_another_batch_shape(gates: dict[str, Any]) -> None:
    base = gates["base"]
    assert base.sampled_aa is not None and base.sampled_aa.mode == "chunks of 8"
    assert [(r.item_id, r.sample) for r in base.sampled_aa.records] == [(r.item_id, r.sample) for r in base.sampled.records]
    assert base.sampled.verifier_steps == {"coupled": 0, "coupled_off_cpu": 0, "rejection_sampler": 0}  # no speculation
    sx = gates[LOOKAHEAD]["seeded_exact"]
    assert sx["aa"]["n"] == sx["candidate"]["n"] == len(base.sampled.records) > 40


def test_exact_lookahead_is_measured_coupled_and_reproduces_the_baseline(gates: dict[str, Any]) -> None:
    res = gates[LOOKAHEAD]
    sx, c = res["seeded_exact"], _seeded(res)
    assert sx["verifier_steps"]["coupled"] > 0 and sx["verifier_steps"]["rejection_sampler"] == 0
    assert c["required"] is True and c["passed"] is True, c
    assert sx["candidate"]["mismatches"] <= sx["aa"]["mismatches"], sx  # no excess mismatch
    assert res["verdict"] == "PASS", res["criteria"]


def test_coupled_draft_temperature_fault_fails_seeded_exact(gates: dict[str, Any]) -> None:
    res = gates[FAULT]
    sx, c = res["seeded_exact"], _seeded(res)
    assert sx["verifier_steps"]["coupled"] > 0 and sx["verifier_steps"]["rejection_sampler"] == 0
    assert c["required"] is True and c["passed"] is False, c
    assert "seeded_exact" in res["failed"]
    assert res["exact_match"]["candidate"]["mismatches"] == 0  # a T>0-only fault: greedy stays exact


def test_rejection_sampler_verification_is_not_coupled_and_not_required(gates: dict[str, Any]) -> None:
    res = gates["uncoupled"]
    sx, c = res["seeded_exact"], _seeded(res)
    assert sx["verifier_steps"]["coupled"] == 0 and sx["verifier_steps"]["rejection_sampler"] > 0
    assert c["required"] is False and c["passed"] is not None  # measured and reported
    assert "not coupled" in c["detail"] and "sampled statistical tests judge it" in c["detail"]
    assert "seeded_exact" not in res["failed"]
