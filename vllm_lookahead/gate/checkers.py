"""Task checkers: does one completion pass its eval item?

Each checker is a small pure function over (prompt, completion, spec) so the gate can score the same
text for baseline and candidate and pair the results.  ``python_tests`` runs model-written code, so it
goes through :mod:`vllm_lookahead.gate.sandbox` (subprocess, time and memory limits, isolated temp dir).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jsonschema

from vllm_lookahead.gate.sandbox import run_python


@dataclass(frozen=True)
class CheckResult:
    passed: bool
    detail: str = ""


def first_line(text: str) -> str:
    return text.split("\n", 1)[0]


def cut_block(completion: str) -> str:
    """The completion up to the end of the current top-level block: the first non-blank line that
    starts at column 0 ends it (the prompt is an indented body, so that line belongs to new code)."""
    lines = completion.split("\n")
    for i, line in enumerate(lines[1:], 1):
        if line.strip() and not line[0].isspace():
            return "\n".join(lines[:i]).rstrip() + "\n"
    return completion


def _exact(prompt: str, completion: str, c: dict[str, Any]) -> CheckResult:
    text = first_line(completion) if c.get("cut") == "first_line" else completion
    answer = c["answer"]
    if c.get("strip", True):
        text, answer = text.strip(), answer.strip()
    return CheckResult(text == answer, f"got {text[:60]!r}")


def _next_line(prompt: str, completion: str, c: dict[str, Any]) -> CheckResult:
    got = first_line(completion).rstrip()
    return CheckResult(got == c["answer"].rstrip(), f"first line {got[:60]!r}")


def _prefix(prompt: str, completion: str, c: dict[str, Any]) -> CheckResult:
    answer = c["answer"]
    need = min(int(c.get("min_chars", 20)), len(answer))
    n = 0
    for a, b in zip(completion, answer):
        if a != b:
            break
        n += 1
    return CheckResult(n >= need, f"common prefix {n}/{need} chars")


def _regex(prompt: str, completion: str, c: dict[str, Any]) -> CheckResult:
    text = first_line(completion) if c.get("cut") == "first_line" else completion
    mode = c.get("mode", "match")
    fn = {"match": re.match, "search": re.search, "fullmatch": re.fullmatch}[mode]
    return CheckResult(fn(c["pattern"], text) is not None, f"{mode} on {text[:60]!r}")


def _json_schema(prompt: str, completion: str, c: dict[str, Any]) -> CheckResult:
    text = (c.get("prefix", "") + completion).lstrip()
    try:
        value, _ = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError as e:
        return CheckResult(False, f"not JSON: {e.msg}")
    try:
        jsonschema.validate(value, c["schema"])
    except jsonschema.ValidationError as e:
        return CheckResult(False, f"schema: {e.message[:80]}")
    return CheckResult(True, "valid")


def _python_syntax(prompt: str, completion: str, c: dict[str, Any]) -> CheckResult:
    source = (prompt if c.get("with_prompt", True) else "") + cut_block(completion)
    try:
        ast.parse(source)
    except (SyntaxError, ValueError) as e:
        return CheckResult(False, f"syntax error: {getattr(e, 'msg', e)}")
    return CheckResult(True, "parses")


def _python_tests(prompt: str, completion: str, c: dict[str, Any]) -> CheckResult:
    source = prompt + cut_block(completion) + "\n\n" + c["tests"] + "\n"
    res = run_python(source, timeout_s=float(c.get("timeout_s", 5)), memory_mb=int(c.get("memory_mb", 256)))
    return CheckResult(res.ok, res.summary())


CHECKERS: dict[str, tuple[Callable[[str, str, dict[str, Any]], CheckResult], tuple[str, ...]]] = {
    # type: (function, required keys)
    "exact": (_exact, ("answer",)),
    "next_line": (_next_line, ("answer",)),
    "prefix": (_prefix, ("answer",)),
    "regex": (_regex, ("pattern",)),
    "json_schema": (_json_schema, ("schema",)),
    "python_syntax": (_python_syntax, ()),
    "python_tests": (_python_tests, ("tests",)),
}


def validate_checker(c: Any) -> str | None:
    """Why a checker object is unusable, or None when it is fine."""
    if not isinstance(c, dict) or not isinstance(c.get("type"), str):
        return 'checker must be an object with a "type" string'
    if c["type"] not in CHECKERS:
        return f"unknown checker type {c['type']!r}; known: {', '.join(CHECKERS)}"
    missing = [k for k in CHECKERS[c["type"]][1] if k not in c]
    if missing:
        return f"checker {c['type']!r} needs {missing}"
    if c["type"] == "regex":
        if c.get("mode", "match") not in ("match", "search", "fullmatch"):
            return "regex mode must be match, search or fullmatch"
        try:
            re.compile(c["pattern"])
        except re.error as e:
            return f"bad regex: {e}"
    if c["type"] == "json_schema":
        try:
            jsonschema.Draft202012Validator.check_schema(c["schema"])
        except jsonschema.SchemaError as e:
            return f"bad JSON Schema: {e.message}"
    return None


def check(prompt: str, completion: str, checker: dict[str, Any]) -> CheckResult:
    """Score one completion with its item's checker.

    ``lstrip_newline: true`` drops one leading newline from the completion first: prompts that stop
    at the end of a line (not after its newline) avoid a token-boundary artefact of byte-level BPE,
    where the newline and the next line's indentation are one token, so the model's first token is
    the newline."""
    if checker.get("lstrip_newline") and completion.startswith("\n"):
        completion = completion[1:]
    return CHECKERS[checker["type"]][0](prompt, completion, checker)
