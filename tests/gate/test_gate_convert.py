"""`vllm-lookahead gate convert`: JSONL prompts with regex / exact / JSON-schema / unit-test checkers and
HumanEval-style problems become a gate eval set that the gate's own loader accepts; references pass
their checkers (HumanEval tests run in the real sandbox); wrong completions fail; bad input is exit 2
with every problem and its line, and nothing is written."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from vllm_lookahead.gate.checkers import check
from vllm_lookahead.gate.cli import main as gate_main
from vllm_lookahead.gate.evalset import load_eval_set

pytestmark = pytest.mark.unit

TRAFFIC = [
    {"prompt": "Order id for 'order 8812 shipped':", "regex": r"\b8812\b", "reference": " 8812"},
    {"id": "cap-1", "task": "capitals", "prompt": "The capital of France is", "exact": "Paris",
     "reference": " Paris", "max_tokens": 4},
    {"prompt": '{"name": ', "json_schema": {"type": "object", "required": ["name"],
                                            "properties": {"name": {"type": "string"}}},
     "json_prefix": '{"name": ', "reference": '"ada"}'},
    {"prompt": "def double(x):\n    return", "tests": "assert double(3) == 6\nassert double(-1) == -2",
     "reference": " 2 * x"},
    {"prompt": "x = ", "checker": {"type": "python_syntax"}, "reference": "1 + 2"},
]

HUMANEVAL = [
    {"task_id": "HumanEval/900", "entry_point": "add_all",
     "prompt": 'def add_all(xs: list) -> int:\n    """Sum of xs.\n    >>> add_all([1, 2])\n    3\n    """\n',
     "canonical_solution": "    return sum(xs)\n",
     "test": "def check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\n"},
    {"task_id": "HumanEval/901", "entry_point": "is_even",
     "prompt": 'def is_even(n: int) -> bool:\n    """True for even n."""\n',
     "canonical_solution": "    return n % 2 == 0\n",
     "test": "def check(candidate):\n    assert candidate(4)\n    assert not candidate(7)\n"},
]


def _write(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_traffic_sample_converts_and_references_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _write(tmp_path / "traffic.jsonl", TRAFFIC)
    out = tmp_path / "eval.jsonl"
    assert gate_main(["convert", str(src), "--from", "jsonl", "-o", str(out), "--task", "support",
                      "--max-tokens", "32", "--verify"]) == 0
    assert "wrote 5 items" in capsys.readouterr().out
    items = load_eval_set(out)
    assert [it.checker["type"] for it in items] == ["regex", "exact", "json_schema", "python_tests", "python_syntax"]
    assert items[0].id == "support-00001" and items[1].id == "cap-1" and items[1].task == "capitals"
    assert items[1].max_tokens == 4 and items[0].max_tokens == 32
    for it in items:
        assert check(it.prompt, it.reference or "", it.checker).passed, it.id
    wrong = {"support-00001": " 9999", "cap-1": " Lyon", "support-00003": '"ada"', "support-00004": " x + 1"}
    for it in items:
        if it.id in wrong:
            assert not check(it.prompt, wrong[it.id], it.checker).passed, it.id


def test_humaneval_problems_run_their_tests_in_the_sandbox(tmp_path: Path) -> None:
    src = tmp_path / "problems.jsonl.gz"
    with gzip.open(src, "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in HUMANEVAL))
    out = tmp_path / "he.jsonl"
    assert gate_main(["convert", str(src), "--from", "humaneval", "-o", str(out), "--verify"]) == 0
    items = load_eval_set(out)
    assert [it.id for it in items] == ["HumanEval-900", "HumanEval-901"] and {it.task for it in items} == {"humaneval"}
    it = items[0]
    assert not it.prompt.endswith("\n") and it.checker["type"] == "python_tests" and "check(add_all)" in it.checker["tests"]
    # what a model emits after the prompt: the newline, the body, then more code at column 0 (cut off)
    assert check(it.prompt, "\n    return sum(xs)\n\ndef unrelated():\n    pass\n", it.checker).passed
    res = check(it.prompt, "\n    return len(xs)\n", it.checker)
    assert not res.passed and "AssertionError" in res.detail


def test_bad_inputs_report_every_problem_and_write_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "bad.jsonl"
    src.write_text("\n".join([
        json.dumps({"prompt": "a"}),                                  # no checker
        "{not json",
        json.dumps({"prompt": "b", "regex": "(", "reference": "x"}),  # bad regex (the loader's check)
        json.dumps({"prompt": "c", "exact": "x", "regex": "y"}),      # two checkers
        json.dumps({"prompt": "d", "exact": "x", "colour": 1}),       # unknown key
    ]) + "\n")
    out = tmp_path / "out.jsonl"
    assert gate_main(["convert", str(src), "--from", "jsonl", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    for words in (":1: needs exactly one checker", ":2: not JSON", ":4: needs exactly one checker", ":5: unknown key"):
        assert words in err, (words, err)
    assert not out.exists()
    # the loader's own checks (bad regex) after conversion: reported, still nothing written
    src.write_text(json.dumps({"prompt": "b", "regex": "("}) + "\n")
    assert gate_main(["convert", str(src), "--from", "jsonl", "-o", str(out)]) == 2
    assert "bad regex" in capsys.readouterr().err and not out.exists()
    assert not list(tmp_path.glob(".out.jsonl.*"))
    # a reference that fails its own checker is caught by --verify
    _write(src, [{"prompt": "p", "exact": "Paris", "reference": " Lyon"}])
    assert gate_main(["convert", str(src), "--from", "jsonl", "-o", str(out), "--verify"]) == 2
    assert "reference fails its checker" in capsys.readouterr().err and not out.exists()
    he = _write(tmp_path / "he.jsonl", [{"task_id": "X/1", "prompt": "def f():\n"}])
    assert gate_main(["convert", str(he), "--from", "humaneval", "-o", str(out)]) == 2
    assert "needs non-empty string(s) ['test', 'entry_point']" in capsys.readouterr().err
    assert gate_main(["convert", str(tmp_path / "missing.jsonl"), "--from", "jsonl", "-o", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_production_samples_become_the_gates_sampling_profiles(tmp_path: Path) -> None:
    """`--from samples`: the T>0 profiles of the traffic, most requested first, rounding client noise,
    leaving out greedy requests and those whose distribution the gate cannot rebuild; the policy file it
    writes loads with the gate's own loader and keeps every other default."""
    from vllm_lookahead.gate.policy import load_policy

    def smp(**sampling):
        return {"schema_version": "1.2", "sampling": sampling}

    rows = ([smp(temperature=0.7, top_p=0.95)] * 6 + [smp(temperature=0.70000001, top_p=0.95, top_k=-1)] * 2
            + [smp(temperature=1.0, top_k=40, seed=7)] * 3 + [smp(temperature=0.0)] * 5
            + [smp(temperature=0.7, top_p=0.95, repetition_penalty=1.2)] * 4 + [smp(temperature=1.3)])
    src = tmp_path / "samples.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "policy.yaml"
    assert gate_main(["convert", str(src), "--from", "samples", "-o", str(out), "--min-share", "0.1"]) == 0
    sampled = load_policy(out)["criteria"]["sampled"]
    assert sampled["profiles"] == [{"temperature": 0.7, "top_p": 0.95},
                                   {"temperature": 1.0, "top_k": 40, "seed": "per_request"}]  # T=1.3: 1 of 12 < 10%
    assert sampled["samples_per_item"] == load_policy()["criteria"]["sampled"]["samples_per_item"]
    assert "66.7% of T>0 samples" in out.read_text()


def test_samples_without_t_above_zero_or_broken_lines_are_exit_2(tmp_path: Path, capsys) -> None:
    src = tmp_path / "greedy.jsonl"
    src.write_text(json.dumps({"sampling": {"temperature": 0}}) + "\n")
    out = tmp_path / "p.yaml"
    assert gate_main(["convert", str(src), "--from", "samples", "-o", str(out)]) == 2
    assert "no T>0 samples" in capsys.readouterr().err and not out.exists()
    src.write_text(json.dumps({"sampling": {"temperature": 1}}) + "\n{broken\n" + json.dumps({"prompt": "x"}) + "\n")
    assert gate_main(["convert", str(src), "--from", "samples", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "greedy.jsonl:2: not JSON" in err and "greedy.jsonl:3: not a sample" in err and not out.exists()
