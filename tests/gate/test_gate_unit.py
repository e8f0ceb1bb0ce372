"""Unit tests of the gate's pure parts: specs, policy, eval-set loading, checkers, sandbox, stats,
analysis/verdict on constructed runs, report writing, CLI usage errors (no engine starts)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from vllm_lookahead.decoders import SpecError, parse_spec
from vllm_lookahead.gate import stats
from vllm_lookahead.gate.analysis import analyse, load_classifiers
from vllm_lookahead.gate.checkers import check, cut_block
from vllm_lookahead.gate.cli import main as gate_main
from vllm_lookahead.gate.engine import ArmRuns, RequestRecord, RunResult
from vllm_lookahead.gate.evalset import DEFAULT_EVAL_SET, EvalItem, EvalSetError, load_eval_set
from vllm_lookahead.gate.policy import PolicyError, load_policy, validate
from vllm_lookahead.gate.profiles import parse_profiles
from vllm_lookahead.gate.report import _sampled_table, markdown_summary, write_report
from vllm_lookahead.gate.sandbox import run_python

pytestmark = pytest.mark.unit


# ---------------------------------------------------------------- specs
def test_spec_none_ngram_lookahead_custom() -> None:
    assert parse_spec("none").engine_kwargs() == {}
    ng = parse_spec("ngram:k=4,n_min=2,n_max=5").engine_kwargs()["speculative_config"]
    assert ng == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    la = parse_spec("lookahead:k=3,memory_depth=5,max_match=4,chain_min_p=0.1").engine_kwargs()
    assert la["speculative_config"] == {"model": "vllm_lookahead.LookaheadProposer", "num_speculative_tokens": 3}
    assert la["additional_config"] == {"lookahead": {"memory_depth": 5, "max_match": 4, "chain_min_p": 0.1}}
    cu = parse_spec("custom:tests.faults.CorruptTokenProposer:k=2,fraction=0.25")
    assert cu.engine_kwargs()["speculative_config"]["model"] == "tests.faults.CorruptTokenProposer"
    assert cu.engine_kwargs()["additional_config"] == {"custom_proposer": {"fraction": 0.25}}
    sx = parse_spec("suffix:k=4,depth=16,min_prob=0.2", check_import=False).engine_kwargs()["speculative_config"]
    assert sx == {"method": "suffix", "num_speculative_tokens": 4, "suffix_decoding_max_tree_depth": 16,
                  "suffix_decoding_min_token_prob": 0.2}


@pytest.mark.parametrize("bad, words", [
    ("", "empty"), ("beam:k=2", "unknown decoder kind"), ("ngram", "missing k"), ("ngram:k=0", "k must be"),
    ("ngram:k=4,n_min=5,n_max=2", "n_min"), ("lookahead:k=4,window=x", "window"),
    ("lookahead:k=4,foo=1", "unknown key"), ("none:k=1", "no parameters"),
    ("custom:NoDots:k=4", "dotted class path"), ("custom:no_such_pkg.mod.Cls:k=4", "cannot import"),
    ("custom:tests.faults.Nope:k=4", "has no class"), ("ngram:k=4,k=5", "twice"),
    ("ngram:k=99", "<= 16"), ("suffix:k=4,tree=3", "unknown suffix parameter"),
    ("suffix:k=4,min_prob=2", "min_prob must be"), ("suffix:k=4,depth=0", "depth must be"),
])
def test_spec_errors_are_clear(bad: str, words: str) -> None:
    with pytest.raises(SpecError, match=words):
        parse_spec(bad)


# ---------------------------------------------------------------- policy
def test_default_policy_loads_and_quality_is_mandatory(tmp_path: Path) -> None:
    pol = load_policy()
    assert pol["criteria"]["pass_rate_overall"]["max_drop"] == 0.02
    p = tmp_path / "p.yaml"
    p.write_text("criteria:\n  exact_match: null\n")
    with pytest.raises(PolicyError, match="mandatory"):
        load_policy(p)
    p.write_text("criteria:\n  behaviour: {required: false}\n")
    with pytest.raises(PolicyError, match="mandatory"):
        load_policy(p)


@pytest.mark.parametrize("doc, words", [
    ({"criteria": {"pass_rate": {}}}, "unknown criterion"),
    ({"criteria": {"exact_match": {"max_excess": 0.1}}}, "unknown key"),
    ({"criteria": {"exact_match": {"max_excess_mismatch": "x"}}}, "wrong type"),
    ({"criteria": {"exact_match": {"max_excess_mismatch": 3}}}, r"\[0, 1\]"),
    ({"alpha": 2}, "alpha"), ({"multiple_testing": "magic"}, "multiple_testing"), ({"oops": 1}, "top-level"),
    ({"version": 2}, "version"), ([1, 2], "mapping"), ({"runs": {"aa_batch_size": 0}}, "aa_batch_size"),
    ({"runs": {"aa_mode": "x"}}, "unknown key"),
])
def test_policy_errors(doc: object, words: str) -> None:
    with pytest.raises(PolicyError, match=words):
        validate(doc)


def test_policy_refuses_a_required_t0_check_without_samples(tmp_path: Path) -> None:
    """samples_per_item: 0 with sampled.required: true used to drop the T>0 check silently."""
    with pytest.raises(PolicyError, match=r"samples_per_item is 0 but criteria.sampled.required is true"):
        validate({"criteria": {"sampled": {"samples_per_item": 0}}})
    pol = validate({"criteria": {"sampled": {"samples_per_item": 0, "required": False}}})
    assert pol["criteria"]["sampled"]["samples_per_item"] == 0 and pol["criteria"]["sampled"]["required"] is False
    assert validate({"criteria": {"sampled": None}})["criteria"]["sampled"]["required"] is False


def test_policy_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="does not exist"):
        load_policy(tmp_path / "nope.yaml")
    (tmp_path / "b.yaml").write_text("criteria: [\n")
    with pytest.raises(PolicyError, match="not valid YAML"):
        load_policy(tmp_path / "b.yaml")


# ---------------------------------------------------------------- eval set
def test_bundled_eval_set_is_valid_and_references_pass() -> None:
    items = load_eval_set(DEFAULT_EVAL_SET)
    assert len(items) >= 100
    assert {"next_line", "copy", "syntax", "json", "unit_tests", "test_name", "body_prefix"} <= {i.task for i in items}
    for it in items:
        if it.reference is not None and it.task in ("next_line", "body_prefix", "syntax", "copy"):
            assert check(it.prompt, it.reference + ("\n" if it.task == "copy" else ""), it.checker).passed, it.id
    assert len(load_eval_set(DEFAULT_EVAL_SET, limit=2)) == 2 * len({i.task for i in items})


def test_eval_set_reports_every_problem(tmp_path: Path) -> None:
    f = tmp_path / "e.jsonl"
    good = {"id": "a", "task": "t", "prompt": "x", "checker": {"type": "exact", "answer": "y"}}
    f.write_text("\n".join([json.dumps(good), "{not json", json.dumps({**good, "checker": {"type": "nope"}}),
                            json.dumps(good), json.dumps({**good, "id": "b", "max_tokens": 0}),
                            json.dumps({**good, "id": "c", "checker": {"type": "regex", "pattern": "("}})]))
    with pytest.raises(EvalSetError) as e:
        load_eval_set(f)
    msg = str(e.value)
    for words in ("not JSON", "unknown checker type", "duplicate id", "max_tokens", "bad regex", ":2:", ":6:"):
        assert words in msg
    with pytest.raises(EvalSetError, match="does not exist"):
        load_eval_set(tmp_path / "missing.jsonl")


# ---------------------------------------------------------------- checkers and sandbox
def test_checkers() -> None:
    assert check("", "  return x\nmore", {"type": "next_line", "answer": "  return x"}).passed
    assert not check("", "  return y\n", {"type": "next_line", "answer": "  return x"}).passed
    assert check("", "abcdefXYZ", {"type": "prefix", "answer": "abcdefQQQ", "min_chars": 6}).passed
    assert not check("", "abcdeXYZ", {"type": "prefix", "answer": "abcdefQQQ", "min_chars": 6}).passed
    assert check("", "foo_bar(self):\n", {"type": "regex", "pattern": r"[a-z_]+\(self\):", "cut": "first_line"}).passed
    js = {"type": "json_schema", "prefix": '{"a": ', "schema": {"type": "object", "required": ["a"]}}
    assert check("", '1}\')\n', js).passed
    assert not check("", "1, ", js).passed
    assert not check("", '1}', {**js, "schema": {"type": "object", "required": ["b"]}}).passed
    assert check("def f(x):\n", "    return x\n\ndef g(:\n", {"type": "python_syntax"}).passed
    assert not check("def f(x):\n", "    return (x\n", {"type": "python_syntax"}).passed
    assert cut_block("    a\n    b\nclass X:\n") == "    a\n    b\n"
    nl = {"type": "next_line", "answer": "    x = 1", "lstrip_newline": True}
    assert check("def f():", "\n    x = 1\n", nl).passed and check("def f():", "    x = 1", nl).passed
    assert not check("def f():", "\n\n    x = 1", nl).passed


def test_python_tests_checker_runs_in_sandbox() -> None:
    c = {"type": "python_tests", "tests": "assert add(1, 2) == 3"}
    assert check("def add(a, b):\n", "    return a + b\n", c).passed
    assert not check("def add(a, b):\n", "    return a - b\n", c).passed


def test_sandbox_limits(tmp_path: Path) -> None:
    r = run_python("while True:\n    pass\n", timeout_s=1)
    assert not r.ok and r.timed_out
    r = run_python("x = bytearray(2_000_000_000)\n", timeout_s=5, memory_mb=128)
    assert not r.ok and "MemoryError" in r.stderr_tail
    # isolated: runs in its own temp dir, not ours, and sees no PYTHON* environment
    r = run_python("import os, sys\nassert 'gate-sandbox-' in os.getcwd()\nassert sys.flags.isolated\n")
    assert r.ok, r.stderr_tail


# ---------------------------------------------------------------- statistics
def test_mcnemar_and_bootstrap() -> None:
    base = [True] * 30 + [False] * 10
    cand = [True] * 20 + [False] * 20
    pr = stats.paired_rates(base, cand, resamples=500)
    assert (pr.n10, pr.n01) == (10, 0)
    assert pr.p_value == pytest.approx(sps.binomtest(10, 10, 0.5).pvalue)
    assert pr.ci_high < 0 < pr.delta + 0.3
    same = stats.paired_rates(base, base)
    assert same.p_value == 1.0 and same.ci_low == same.ci_high == 0.0


def test_multiple_testing_matches_references() -> None:
    p = [0.01, 0.04, 0.03, 0.2]
    np.testing.assert_allclose(stats.adjust_pvalues(p, "bh"), sps.false_discovery_control(p, method="bh"))
    assert stats.adjust_pvalues(p, "holm") == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert stats.adjust_pvalues(p, "bonferroni") == pytest.approx([0.04, 0.16, 0.12, 0.8])
    with pytest.raises(ValueError):
        stats.adjust_pvalues(p, "x")


def test_mde_matches_connor_table() -> None:
    # anchors/quality.md: delta = 1 pp needs 1,567 / 3,137 / 7,847 pairs at p_d = 2% / 4% / 10%
    for n, pd in ((1567, 0.02), (3137, 0.04), (7847, 0.10)):
        assert stats.mcnemar_mde(n, pd) == pytest.approx(0.01, abs=2e-4)
    assert stats.mcnemar_mde(10, 0.01) is None


def test_first_divergence() -> None:
    assert stats.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert stats.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert stats.first_divergence([1, 2, 3], [1, 2]) == 2


def test_sampling_profiles_are_validated_and_the_old_key_names_its_replacement() -> None:
    from vllm_lookahead.gate.profiles import profile_of

    pol = load_policy()
    profiles = parse_profiles(pol["criteria"]["sampled"]["profiles"])
    assert len(profiles) >= 2 and any(p.top_p < 1 and p.top_k for p in profiles)  # production-like by default
    assert [profile_of(profiles, j) for j in range(4)] == [profiles[0], profiles[1], profiles[0], profiles[1]]
    with pytest.raises(PolicyError, match=r"criteria.sampled.temperature was replaced by criteria.sampled.profiles"):
        validate({"criteria": {"sampled": {"temperature": 0.8}}})
    for bad, msg in (([], "non-empty list"), ([{"top_p": 0.9}], "needs a temperature"),
                     ([{"temperature": 0.8, "top_q": 1}], "unknown key"), ([{"temperature": 0}], "temperature must be > 0"),
                     ([{"temperature": 1, "top_p": 1.5}], "top_p"), ([{"temperature": 1, "seed": "each"}], "seed")):
        with pytest.raises(PolicyError, match=msg):
            validate({"criteria": {"sampled": {"profiles": bad}}})
    p = dataclasses.replace(profiles[1], seed="per_request")
    f = p.request_fields("item-3", 1, 0)
    assert f["top_p"] == p.top_p and f["top_k"] == p.top_k and isinstance(f["seed"], int)
    assert f["seed"] == p.request_fields("item-3", 1, 0)["seed"] != p.request_fields("item-3", 3, 0)["seed"]
    engine = dataclasses.replace(profiles[0], seed="engine")
    assert "seed" not in engine.request_fields("item-3", 0, 0)  # engine seed: none per request
    # by default every profile seeds each request, so both arms draw sample j of item i alike (seeded_exact)
    assert all(p.seed == "per_request" for p in profiles)


# ---------------------------------------------------------------- analysis on constructed runs
def _items() -> list[EvalItem]:
    out = []
    for i in range(40):
        task = "a" if i < 20 else "b"
        out.append(EvalItem(f"i{i}", task, f"p{i}\n", {"type": "next_line", "answer": "ok"}))
    return out


def _run(texts: list[str], ids: list[list[int]], mode: str = "batch") -> RunResult:
    recs = [RequestRecord(f"i{i}", 0, ids[i], t, "length", 3, 0.01, 0.002, 8, 6, 10, [4, 4], [3, 3])
            for i, t in enumerate(texts)]
    return RunResult("x", {"spec": "none"}, mode, [], 0, 1.0, recs)


def _arms(cand_texts: list[str], cand_ids: list[list[int]]) -> tuple[ArmRuns, ArmRuns]:
    texts = ["ok\n" if i % 2 == 0 else "no\n" for i in range(40)]
    ids = [[i, 1, 2, 3] for i in range(40)]
    base = ArmRuns(_run(texts, ids), _run(texts, ids, "sequential"), aa=_run(texts, ids, "chunks of 8"))
    return base, ArmRuns(_run(cand_texts, cand_ids), _run(cand_texts, cand_ids, "sequential"))


def test_analysis_pass_for_identical_and_fail_for_regression(tmp_path: Path) -> None:
    pol = load_policy()
    pol["criteria"]["sampled"]["required"] = False  # these constructed arms have no T>0 samples
    clfs = load_classifiers(pol["criteria"]["behaviour"]["classifiers"])
    items = _items()
    texts = ["ok\n" if i % 2 == 0 else "no\n" for i in range(40)]
    ids = [[i, 1, 2, 3] for i in range(40)]
    base, cand = _arms(texts, ids)
    res = analyse(items, base, cand, pol, clfs, ["i0", "i1"])
    assert res["verdict"] == "PASS", res["criteria"]
    assert res["exact_match"]["candidate"]["mismatches"] == 0
    # regress every passing item of task a: pass rate drops, tokens diverge at index 1
    bad_texts = [("no\n" if i < 20 else t) for i, t in enumerate(texts)]
    bad_ids = [([i, 9, 2, 3] if i < 20 else x) for i, x in enumerate(ids)]
    base, cand = _arms(bad_texts, bad_ids)
    base, _ = _arms(texts, ids)
    res = analyse(items, base, cand, pol, clfs, ["i0"])
    assert res["verdict"] == "FAIL"
    failed = set(res["failed"])
    assert {"pass_rate_overall", "pass_rate_per_task", "exact_match"} <= failed
    assert res["exact_match"]["candidate"]["first_divergence"] == [1] * 20
    res["meta"] = {"baseline": {"spec": "none"}, "candidate": {"spec": "x"}, "eval_set_name": "e",
                   "model_name": "m", "dtype": "float32", "alpha": 0.05, "wall_s": 1.0}
    paths = write_report(res, {}, tmp_path / "rep")
    html = paths["html"].read_text()
    assert "FAIL" in html and html.count("data:image/png;base64,") == 4
    md = markdown_summary(res)
    assert "**FAIL**" in md and "| exact_match |" in md and len(md) < 65536
    assert json.loads(paths["json"].read_text())["verdict"] == "FAIL"


def test_latency_alone_never_clears_the_gate() -> None:
    pol = load_policy()
    pol["criteria"]["sampled"]["required"] = False
    pol["criteria"]["latency"]["required"] = True
    texts = ["ok\n" if i % 2 == 0 else "no\n" for i in range(40)]
    bad = ["no\n"] * 40
    base, _ = _arms(texts, [[i, 1, 2, 3] for i in range(40)])
    _, cand = _arms(bad, [[i, 1, 2, 3] for i in range(40)])
    # the candidate is much faster (shorter TPOT) but worse
    for r in cand.sequential.records:
        r.tpot_s = 0.0001
    res = analyse(_items(), base, cand, pol, load_classifiers(["degenerate"]), ["i0", "i1"])
    lat = next(c for c in res["criteria"] if c["name"] == "latency")
    assert lat["passed"] is True and res["verdict"] == "FAIL"


def _sampled_run(name: str, pit_power: float, shift: float, seed: int, impossible: int = 0,
                 n_tokens: int = 30) -> RunResult:
    """Constructed T>0 run with scores: PIT values u**pit_power (1 = exact), mean log-prob -2 + shift
    (``n_tokens`` per sample: the exposure the impossible-token test sees)."""
    rng = np.random.default_rng(seed)
    recs, scores = [], []
    for i in range(40):
        for s in range(4):
            recs.append(RequestRecord(f"i{i}", s, [1, 2, 3], "ok\n", "length", 3))
            bad = impossible if (i, s) == (3, 1) else 0
            scores.append({"item_id": f"i{i}", "sample": s, "n_tokens": n_tokens, "out_of_support": bad,
                           "oos_reasons": {"top_p": bad} if bad else {},
                           "mean_logprob": float(-2 + shift + rng.normal(0, 0.3)),
                           "pit": list(rng.random(30) ** pit_power)})
    run = RunResult(name, {"spec": "none"}, "batch", [{"temperature": 0.8}, {"temperature": 1.0, "top_p": 0.9}],
                    0, 1.0, recs)
    run.scores, run.scoring_s = scores, 0.5
    return run


@pytest.mark.parametrize("pit_power, shift, verdict", [(1.0, 0.0, "PASS"), (1.3, 0.0, "FAIL"), (1.0, 0.2, "FAIL")])
def test_sampled_criterion_judges_pit_and_likelihood_shift(pit_power: float, shift: float, verdict: str) -> None:
    """Identical T>0 features, only the scores under the baseline model differ: a sharper candidate
    (PIT mass towards 0) or a likelihood shift must FAIL the sampled criterion on their own."""
    pol = load_policy()
    texts, ids = ["ok\n"] * 40, [[i, 1, 2, 3] for i in range(40)]
    base, cand = _arms(texts, ids)
    base.sampled, cand.sampled = _sampled_run("b", 1.0, 0.0, 1), _sampled_run("c", pit_power, shift, 2)
    res = analyse(_items(), base, cand, pol, load_classifiers(["degenerate"]), ["i0"])
    assert res["verdict"] == verdict, res["criteria"]
    conf = res["sampled"]["conformance"]
    assert conf["shift"]["ci_low"] < shift < conf["shift"]["ci_high"]
    assert conf["pit_baseline_control"]["p_value"] > 0.01
    assert (res["failed"] == ["sampled"]) == (verdict == "FAIL")
    table = "\n".join(_sampled_table(res))
    assert "mean token log-prob" in table and "Likelihood shift" in table and "excess log-prob" in table
    prof = res["sampled"]["conformance"]["profiles"]["candidate"]
    assert [x["profile"] for x in prof] == ["T=0.8", "T=1 top_p=0.9"] and sum(x["samples"] for x in prof) == 160
    cand.sampled.scores = None  # samples that were never scored cannot pass
    res = analyse(_items(), base, cand, pol, load_classifiers(["degenerate"]), ["i0"])
    assert res["failed"] == ["sampled"] and "not scored" in res["criteria"][4]["detail"]


@pytest.mark.parametrize("late_shift, verdict", [(0.0, "PASS"), (0.3, "FAIL")])
def test_a_fault_deep_in_the_drafts_fails_on_its_own_test(late_shift: float, verdict: str) -> None:
    """The excess of the candidate's tokens at draft position >= 2 is tested on its own: a shift
    there FAILs the sampled criterion even when every other statistic looks exact."""
    pol = load_policy()
    texts, ids = ["ok\n"] * 40, [[i, 1, 2, 3] for i in range(40)]
    base, cand = _arms(texts, ids)
    base.sampled, cand.sampled = _sampled_run("b", 1.0, 0.0, 1), _sampled_run("c", 1.0, 0.0, 2)
    rng = np.random.default_rng(3)
    for x in cand.sampled.scores:
        x["late_excess"] = [float(rng.normal(late_shift * 10, math.sqrt(10))), 10.0, 10]
    res = analyse(_items(), base, cand, pol, load_classifiers(["degenerate"]), ["i0"])
    assert res["verdict"] == verdict, res["criteria"]
    late = res["sampled"]["conformance"]["excess_late_draft"]
    assert late["tokens"] == 1600 and abs(late["nats_per_token"] - late_shift) < 0.1
    assert "excess_late_draft_z" in res["sampled"]["p_adjusted"]
    assert "draft positions >= 2" in "\n".join(_sampled_table(res))
    for x in cand.sampled.scores:  # no speculation (or no mask): no such test, no multiple-testing cost
        del x["late_excess"]
    assert "excess_late_draft_z" not in analyse(_items(), base, cand, pol, load_classifiers(["degenerate"]),
                                                ["i0"])["sampled"]["p_adjusted"]


def test_a_records_draft_positions_come_from_its_step_lists() -> None:
    rec = RequestRecord("i", 0, [5] * 8, "", "length", 3, per_step_drafted=[0, 3, 2, 0], per_step_accepted=[0, 2, 2, 0])
    assert rec.draft_positions.tolist() == [0, 1, 2, 3, 1, 2, 3, 0]
    rec.per_step_drafted, rec.per_step_accepted = [3, 2], [2, 2]  # steps without drafts missing: no positions
    assert rec.draft_positions is None


# ---------------------------------------------------------------- CLI usage errors (exit 2)
@pytest.mark.parametrize("args, words", [
    (["--candidate", "bogus"], "unknown decoder kind"),
    (["--eval-set", "/nonexistent.jsonl"], "does not exist"),
    (["--policy", "/nonexistent.yaml"], "does not exist"),
    (["--model", "/nonexistent-model", "--candidate", "ngram:k=4"], "does not exist"),
])
def test_cli_usage_errors(args: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert gate_main(args) == 2
    assert words in capsys.readouterr().err


def test_cli_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        gate_main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--candidate" in out and "custom:pkg.module.Class" in out


# ---------------------------------------------------------------- non-inferiority, JUnit, acceptance floor
def test_noninferiority_score_test_keeps_level_and_has_power() -> None:
    """Tango's paired score test by simulation: at the margin (delta = -m) it rejects <= alpha (+MC
    error); at delta = 0 with 10% discordance and 300 items it proves non-inferiority most of the time;
    no discordant pair proves nothing on 12 items but does on 122."""
    rng = np.random.default_rng(0)
    m, alpha = 0.05, 0.05
    for n, p10 in ((60, 0.08), (122, 0.06), (122, 0.15), (300, 0.08)):
        x = rng.multinomial(n, [p10, p10 - m, 1 - 2 * p10 + m], size=4000)
        level = np.mean([stats.paired_noninferiority_p(a, b, n, m) < alpha for a, b, _ in x])
        assert level <= alpha + 3 * np.sqrt(alpha * (1 - alpha) / 4000), (n, p10, level)
    x = rng.multinomial(300, [0.05, 0.05, 0.9], size=2000)
    power = np.mean([stats.paired_noninferiority_p(a, b, 300, m) < alpha for a, b, _ in x])
    assert power > 0.8
    assert stats.paired_noninferiority_p(0, 0, 12, m) > 0.2
    assert stats.paired_noninferiority_p(0, 0, 122, m) < 0.01
    with pytest.raises(ValueError, match="margin"):
        stats.paired_noninferiority_p(0, 0, 10, 0.0)


def test_policy_ni_margin_and_acceptance_floor_are_validated(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="ni_margin must be in"):
        validate({"criteria": {"pass_rate_overall": {"ni_margin": 1.5}}})
    with pytest.raises(PolicyError, match="min_mean_length must be >= 1"):
        validate({"criteria": {"acceptance_length": {"min_mean_length": 0.5}}})
    p = validate({"criteria": {"pass_rate_overall": {"ni_margin": 0.05}, "acceptance_length": {"required": True}}})
    assert p["criteria"]["pass_rate_overall"]["ni_margin"] == 0.05


def test_ni_margin_needs_enough_items_and_acceptance_floor_bites(tmp_path: Path) -> None:
    """Identical arms on 40 items: PASS without a margin, FAIL with ni_margin 0.05 (40 items cannot
    prove it: 40*0.05/0.95 < 2.7) and PASS at 0.15; the constructed candidate accepts 6 of 8 drafted
    tokens over 2 drafting steps per request -> mean acceptance length 4, under a floor of 5 it FAILs."""
    texts, ids = ["ok\n" if i % 2 == 0 else "no\n" for i in range(40)], [[i, 1, 2, 3] for i in range(40)]
    clfs = load_classifiers(["degenerate"])
    pol = load_policy()
    pol["criteria"]["sampled"]["required"] = False
    base, cand = _arms(texts, ids)
    res = analyse(_items(), base, cand, pol, clfs, ["i0"])
    acc = next(c for c in res["criteria"] if c["name"] == "acceptance_length")
    assert res["verdict"] == "PASS" and acc["measured"] == 4.0 and not acc["required"]
    pol["criteria"]["pass_rate_overall"]["ni_margin"] = 0.05
    res = analyse(_items(), base, cand, pol, clfs, ["i0"])
    assert res["failed"] == ["pass_rate_overall"] and "non-inferiority (margin 0.05)" in res["criteria"][0]["detail"]
    pol["criteria"]["pass_rate_overall"]["ni_margin"] = 0.15
    pol["criteria"]["acceptance_length"].update(required=True, min_mean_length=5.0)
    res = analyse(_items(), base, cand, pol, clfs, ["i0"])
    assert res["failed"] == ["acceptance_length"], res["criteria"]


def test_junit_xml_lists_criteria_and_failures(tmp_path: Path) -> None:
    from xml.etree import ElementTree as ET

    from vllm_lookahead.gate.report import junit_xml

    texts = ["ok\n" if i % 2 == 0 else "no\n" for i in range(40)]
    pol = load_policy()
    pol["criteria"]["sampled"]["required"] = False
    base, _ = _arms(texts, [[i, 1, 2, 3] for i in range(40)])
    _, cand = _arms(["no\n"] * 40, [[i, 9, 2, 3] for i in range(40)])
    res = analyse(_items(), base, cand, pol, load_classifiers(["degenerate"]), ["i0"])
    root = ET.fromstring(junit_xml(res))
    suite = root.find("testsuite")
    assert suite is not None and int(suite.get("tests")) == len(res["criteria"])
    failed = sorted(c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None)
    assert failed == sorted(res["failed"]) and "exact_match" in failed
    assert int(suite.get("failures")) == len(res["failed"])


@pytest.mark.parametrize("impossible, dtype, verdict", [(2, "float32", "PASS"), (14, "float32", "FAIL"),
                                                        (14, "bfloat16", "PASS"), (40, "bfloat16", "FAIL")])
def test_impossible_tokens_fail_the_gate_at_a_level_and_say_which_parameter(impossible: int, dtype: str,
                                                                             verdict: str) -> None:
    """Impossible tokens are a test inside the Holm family, not "more than the baseline arm": two in
    320,000 tokens against the baseline arm's none could be chance (tolerated: 1 / 320,000 per token);
    fourteen cannot in fp32, while bf16's floor (5e-5: boundary flips, 16 expected here) tolerates them
    and forty exceed it."""
    pol = load_policy()
    texts, ids = ["ok\n"] * 40, [[i, 1, 2, 3] for i in range(40)]
    base, cand = _arms(texts, ids)
    base.sampled = _sampled_run("b", 1.0, 0.0, 1, n_tokens=2000)
    cand.sampled = _sampled_run("c", 1.0, 0.0, 2, impossible=impossible, n_tokens=2000)
    res = analyse(_items(), base, cand, pol, load_classifiers(["degenerate"]), ["i0"], dtype=dtype)
    assert (res["failed"] == ["sampled"]) == (verdict == "FAIL"), res["sampled"]["p_adjusted"]
    conf = res["sampled"]["conformance"]
    assert conf["out_of_support_reasons"] == {"baseline": {}, "candidate": {"top_p": impossible}}
    assert f"top_p {impossible}" in "\n".join(_sampled_table(res))
    assert "impossible_tokens" in res["sampled"]["p_adjusted"]
