"""The ``seeded_exact`` criterion on constructed runs (no engine starts): per-request-seeded T>0 samples
paired by (item, sample) with the baseline's, judged against the baseline's seeded A/A run, required
under ``required: auto`` only for a candidate measured coupled."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from vllm_lookahead.gate import criteria, sequential
from vllm_lookahead.gate.analysis import _seeded_exact, analyse, load_classifiers
from vllm_lookahead.gate.engine import ArmRuns, RequestRecord, RunResult
from vllm_lookahead.gate.evalset import EvalItem
from vllm_lookahead.gate.policy import PolicyError, load_policy, validate
from vllm_lookahead.gate.report import markdown_summary, seeded_table

pytestmark = pytest.mark.unit

N_ITEMS, N_SAMPLES = 40, 4  # 160 seeded pairs
SEEDED = [{"temperature": 0.8, "seed": "per_request"}, {"temperature": 1.0, "top_p": 0.9, "seed": "per_request"}]
COUPLED = {"coupled": 12, "rejection_sampler": 0}


def _ids(i: int, s: int) -> list[int]:
    return [i, s, 7, 8]


def _sampled(name: str, differ: set[int] = frozenset(), mode: str = "batch", sampling: list | None = None,
             steps: dict[str, int] | None = None) -> RunResult:
    """Seeded samples; the ``differ`` indices (of the N_ITEMS x N_SAMPLES pairs) get other token ids."""
    recs = []
    for s in range(N_SAMPLES):
        for i in range(N_ITEMS):
            k = s * N_ITEMS + i
            recs.append(RequestRecord(f"i{i}", s, _ids(i, s) + ([99] if k in differ else []), "ok\n", "length", 3))
    return RunResult(name, {"spec": "none"}, mode, SEEDED if sampling is None else sampling, 0, 1.0, recs,
                     verifier_steps=steps)


def _arms(cand_differ: set[int], aa_differ: set[int] | None, steps: dict[str, int] | None,
          sampling: list | None = None) -> tuple[ArmRuns, ArmRuns]:
    greedy = RunResult("g", {"spec": "none"}, "batch", [], 0, 1.0,
                       [RequestRecord(f"i{i}", 0, [i, 1], "ok\n", "length", 3) for i in range(N_ITEMS)])
    base = ArmRuns(greedy, aa=greedy, sampled=_sampled("b", sampling=sampling, steps={"coupled": 0, "rejection_sampler": 0}),
                   sampled_aa=None if aa_differ is None else _sampled("b A/A", aa_differ, "chunks of 8", sampling))
    cand = ArmRuns(greedy, sampled=_sampled("c", cand_differ, sampling=sampling, steps=steps))
    return base, cand


def _judge(cand_differ: set[int], aa_differ: set[int] | None, steps: dict[str, int] | None,
           policy: dict[str, Any] | None = None, sampling: list | None = None) -> dict[str, Any]:
    base, cand = _arms(cand_differ, aa_differ, steps, sampling)
    return criteria.seeded_exact(SimpleNamespace(policy=policy or load_policy(), seeded_exact=_seeded_exact(base, cand)))


def test_a_coupled_candidate_that_reproduces_the_baseline_passes_and_is_required() -> None:
    c = _judge(set(), {3, 50}, COUPLED)
    assert c["required"] is True and c["passed"] is True
    assert c["measured"] == round(0 - 2 / 160, 4)
    assert "coupled (12 T>0 drafted steps" in c["detail"] and "0/160 seeded samples differ" in c["detail"]
    assert "A/A 2/160 (chunks of 8 vs all at once)" in c["detail"]


def test_excess_over_the_aa_rate_fails_even_when_not_significant() -> None:
    base, cand = _arms(set(range(7)), set(range(4)), COUPLED)
    sx = _seeded_exact(base, cand)
    assert sx["p_value"] > 0.05 and sx["excess_mismatch"] == pytest.approx(3 / 160)  # 0.019 > 0.01
    c = criteria.seeded_exact(SimpleNamespace(policy=load_policy(), seeded_exact=sx))
    assert c["required"] is True and c["passed"] is False


def test_a_significant_excess_fails_within_a_loose_tolerance() -> None:
    pol = load_policy()
    pol["criteria"]["seeded_exact"]["max_excess_mismatch"] = 0.5
    base, cand = _arms(set(range(0, 160, 8)), set(), COUPLED)  # 20/160 vs 0/160: excess 0.125 < 0.5
    sx = _seeded_exact(base, cand)
    assert sx["p_value"] < 1e-5
    c = criteria.seeded_exact(SimpleNamespace(policy=pol, seeded_exact=sx))
    assert c["passed"] is False and c["required"] is True
    assert sx["candidate"]["diverged"][:2] == ["i0#0", "i0#1"]  # pairs named item#sample


@pytest.mark.parametrize("steps, required, words", [
    (COUPLED, True, "coupled (12"),
    ({"coupled": 12, "rejection_sampler": 2}, False, "not coupled: 2 T>0 drafted steps verified by vLLM's rejection sampler"),
    ({"coupled": 0, "rejection_sampler": 0}, False, "a proposer other than lookahead's"),
    ({"coupled": 0, "coupled_off_cpu": 9, "rejection_sampler": 0}, False,
     "9 by coupled verification off the CPU (token identity not checked on this device)"),
    (None, False, "coupling not measurable (endpoint candidate)"),
])
def test_auto_requires_it_only_for_a_measured_coupled_candidate(steps: dict[str, int] | None, required: bool,
                                                                words: str) -> None:
    c = _judge(set(range(40)), set(), steps)
    assert c["required"] is required and c["passed"] is False  # measured and reported either way
    assert words in c["detail"] and "40/160 seeded samples differ" in c["detail"]
    if not required:
        assert "sampled statistical tests judge it" in c["detail"]


def test_required_true_forces_it_and_false_never_requires_it() -> None:
    pol = load_policy()
    pol["criteria"]["seeded_exact"]["required"] = True
    c = _judge(set(range(40)), set(), None, pol)  # an endpoint: coupling unknown
    assert c["required"] is True and c["passed"] is False and "required by the policy" in c["detail"]
    pol["criteria"]["seeded_exact"]["required"] = False
    c = _judge(set(range(40)), set(), COUPLED, pol)
    assert c["required"] is False and c["passed"] is False


def test_without_the_aa_run_it_is_judged_against_zero_mismatches() -> None:
    c = _judge({5}, None, COUPLED)  # 1/160 = 0.006 <= 0.01, Fisher p = 0.5
    assert c["passed"] is True and "A/A not run: judged against 0 mismatches" in c["detail"]
    c = _judge({5, 6, 7}, None, COUPLED)  # 3/160 = 0.019 > 0.01
    assert c["passed"] is False and c["required"] is True


def test_not_measured_without_seeded_samples() -> None:
    engine_seeded = [{"temperature": 0.8}]
    c = _judge(set(), set(), COUPLED, sampling=engine_seeded)
    assert c["passed"] is None and c["required"] is False and "seed: engine" in c["detail"]
    c = criteria.seeded_exact(SimpleNamespace(policy=load_policy(), seeded_exact=None))
    assert c["passed"] is None and c["required"] is False and "samples_per_item: 0" in c["detail"]


def _items() -> list[EvalItem]:
    return [EvalItem(f"i{i}", "a", f"p{i}\n", {"type": "next_line", "answer": "ok"}) for i in range(N_ITEMS)]


def test_analyse_fails_a_coupled_candidate_and_reports_the_numbers() -> None:
    pol = load_policy()
    pol["criteria"]["sampled"]["required"] = False  # these constructed samples are not scored
    clfs = load_classifiers(["degenerate"])
    base, cand = _arms(set(range(30)), {1}, COUPLED)
    res = analyse(_items(), base, cand, pol, clfs, ["i0"])
    assert res["verdict"] == "FAIL" and res["failed"] == ["seeded_exact"], res["criteria"]
    sx = res["seeded_exact"]
    assert (sx["candidate"]["n"], sx["candidate"]["mismatches"], sx["aa"]["n"], sx["aa"]["mismatches"]) == (160, 30, 160, 1)
    assert sx["verifier_steps"] == COUPLED and sx["coupled"] is True and sx["p_value"] < 0.05
    assert [c["name"] for c in res["criteria"]].index("seeded_exact") == 5
    # the same samples from a candidate verified by vLLM's rejection sampler: reported, not required
    base, cand = _arms(set(range(30)), {1}, {"coupled": 0, "rejection_sampler": 9})
    res2 = analyse(_items(), base, cand, pol, clfs, ["i0"])
    assert res2["verdict"] == "PASS", res2["criteria"]
    # report: the table of pairs and the verifier steps; a FAIL decided at a sequential look
    res["meta"] = {"baseline": {"spec": "none"}, "candidate": {"spec": "x"}, "eval_set_name": "e",
                   "model_name": "m", "dtype": "float32", "alpha": 0.05, "wall_s": 1.0}
    table = "\n".join(seeded_table(res))
    assert "| candidate vs baseline | 160 | 30 (i0#0" in table and "| A/A: baseline chunks of 8 vs all at once | 160 | 1 |" in table
    assert "coupled 12, vLLM's rejection sampler 0" in table
    assert "| seeded_exact |" in markdown_summary(res)
    assert "seeded_exact" in sequential.decided_fail(res, 0.05, 0.01)
    assert "seeded_exact" not in sequential.decided_fail(res2, 0.05, 0.01)


def test_sequential_merge_keeps_the_seeded_runs_and_sums_the_verifier_steps() -> None:
    b1, c1 = _arms(set(), set(), COUPLED)
    b2, c2 = _arms(set(), set(), {"coupled": 1, "rejection_sampler": 2})
    base, cand = sequential.merge(b1, b2), sequential.merge(c1, c2)
    assert base.sampled_aa is not None and len(base.sampled_aa.records) == 2 * N_ITEMS * N_SAMPLES
    assert cand.sampled.verifier_steps == {"coupled": 13, "rejection_sampler": 2}
    c3 = ArmRuns(c2.greedy, sampled=_sampled("c", steps=None))
    assert sequential.merge(c1, c3).sampled.verifier_steps is None  # an unmeasured part: not measured


@pytest.mark.parametrize("doc, words", [
    ({"criteria": {"seeded_exact": {"required": "yes"}}}, "true, false or auto"),
    ({"criteria": {"seeded_exact": {"max_excess_mismatch": 1.5}}}, r"\[0, 1\]"),
    ({"criteria": {"seeded_exact": {"max_excess_mismatch": True}}}, "must be a number"),
    ({"criteria": {"seeded_exact": {"alpha": 0.1}}}, "unknown key"),
    ({"criteria": {"seeded_exact": {"required": True}, "sampled": {"samples_per_item": 0, "required": False}}},
     "no T>0 sample has its own seed"),
    ({"criteria": {"seeded_exact": {"required": True}, "sampled": {"profiles": [{"temperature": 0.8}]}}},
     "seed: per_request"),
])
def test_policy_rejects_bad_seeded_exact_values(doc: dict[str, Any], words: str) -> None:
    with pytest.raises(PolicyError, match=words):
        validate(doc)


def test_default_policy_seeds_every_profile_and_judges_seeded_exact_automatically() -> None:
    pol = load_policy()
    assert pol["criteria"]["seeded_exact"] == {"required": "auto", "max_excess_mismatch": 0.01}
    assert all(p["seed"] == "per_request" for p in pol["criteria"]["sampled"]["profiles"])
    assert validate({"criteria": {"seeded_exact": None}})["criteria"]["seeded_exact"]["required"] is False


def test_the_coupled_fault_cools_only_draft_positions_of_sampled_rows() -> None:
    """``CoupledDraftTemperatureProposer``: target (draft) positions of T>0 rows divided by factor; the
    bonus positions and greedy rows untouched, the engine's logits never written."""
    import torch

    from tests.faults import CoupledDraftTemperatureProposer

    # rows: 0 greedy with 2 drafts, 1 at T=0.8 with 1 draft, 2 at T=1 with 0 drafts
    logits = torch.arange(1, 7, dtype=torch.float32).repeat(6, 1)  # 2 + 1 target positions, 3 bonus
    sd = SimpleNamespace(num_draft_tokens=[2, 1, 0], target_logits_indices=torch.tensor([0, 1, 3]),
                         bonus_logits_indices=torch.tensor([2, 4, 5]))
    runner = SimpleNamespace(input_batch=SimpleNamespace(sampling_metadata=SimpleNamespace(
        temperature=torch.tensor([0.0, 0.8, 1.0]))))
    out = CoupledDraftTemperatureProposer._cooled(SimpleNamespace(factor=0.8), runner, logits, sd)
    assert torch.equal(out[3], logits[3] / 0.8)
    assert all(torch.equal(out[i], logits[i]) for i in (0, 1, 2, 4, 5))
    assert torch.equal(logits[3], torch.arange(1, 7, dtype=torch.float32))  # a copy, not in place
