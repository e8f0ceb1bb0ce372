"""Eval sets: JSONL, one item per line (format in docs/gate.md).

    {"id": "next_line-0001", "task": "next_line", "prompt": "def f(x):\n", "max_tokens": 48,
     "checker": {"type": "next_line", "answer": "    return x"}, "reference": "    return x"}

Required: ``id`` (unique string), ``task`` (string; statistics are per task), ``prompt`` (non-empty
string), ``checker`` (object, see :mod:`vllm_lookahead.gate.checkers`).  Optional: ``max_tokens`` (int,
default from the CLI), ``reference`` (text shown in reports), ``response_format`` (passed to the
format classifier), ``meta`` (anything).  Every problem in the file is reported at once, with line
numbers, so a user fixes a file in one go.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_lookahead.gate.checkers import validate_checker

DEFAULT_EVAL_SET = Path(__file__).resolve().parents[1] / "data" / "eval" / "stdlib_heldout.jsonl"
KNOWN_KEYS = {"id", "task", "prompt", "checker", "max_tokens", "reference", "response_format", "meta"}


class EvalSetError(ValueError):
    """The eval set file is missing or malformed; the message lists every problem found."""


@dataclass(frozen=True)
class EvalItem:
    id: str
    task: str
    prompt: str
    checker: dict[str, Any]
    max_tokens: int | None = None
    reference: str | None = None
    response_format: Any = None
    meta: dict[str, Any] = field(default_factory=dict)


def _item(obj: Any, where: str) -> tuple[EvalItem | None, list[str]]:
    if not isinstance(obj, dict):
        return None, [f"{where}: expected a JSON object"]
    errs: list[str] = []
    for key in ("id", "task", "prompt"):
        if not isinstance(obj.get(key), str) or not obj.get(key):
            errs.append(f"{where}: {key!r} must be a non-empty string")
    why = validate_checker(obj.get("checker"))
    if why:
        errs.append(f"{where}: {why}")
    mt = obj.get("max_tokens")
    if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or mt < 1):
        errs.append(f"{where}: max_tokens must be an integer >= 1")
    unknown = set(obj) - KNOWN_KEYS
    if unknown:
        errs.append(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(KNOWN_KEYS)}")
    if errs:
        return None, errs
    return EvalItem(obj["id"], obj["task"], obj["prompt"], obj["checker"], mt, obj.get("reference"),
                    obj.get("response_format"), obj.get("meta") or {}), []


def load_eval_set(path: str | Path, *, limit: int | None = None, tasks: list[str] | None = None) -> list[EvalItem]:
    """Read and validate an eval set; ``limit`` keeps the first N items per task (for quick runs)."""
    path = Path(path)
    if not path.is_file():
        raise EvalSetError(f"eval set {path} does not exist")
    items: list[EvalItem] = []
    errors: list[str] = []
    seen: set[str] = set()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            errors.append(f"{path}:{n}: not JSON ({e.msg})")
            continue
        item, errs = _item(obj, f"{path}:{n}")
        errors += errs
        if item is None:
            continue
        if item.id in seen:
            errors.append(f"{path}:{n}: duplicate id {item.id!r}")
        seen.add(item.id)
        items.append(item)
    if errors:
        shown = "\n  ".join(errors[:20])
        more = f"\n  ... and {len(errors) - 20} more" if len(errors) > 20 else ""
        raise EvalSetError(f"eval set {path} has {len(errors)} problem(s):\n  {shown}{more}")
    if tasks:
        missing = set(tasks) - {i.task for i in items}
        if missing:
            raise EvalSetError(f"eval set {path} has no task(s) {sorted(missing)}")
        items = [i for i in items if i.task in tasks]
    if limit is not None:
        per: dict[str, int] = {}
        kept = []
        for it in items:
            per[it.task] = per.get(it.task, 0) + 1
            if per[it.task] <= limit:
                kept.append(it)
        items = kept
    if not items:
        raise EvalSetError(f"eval set {path} has no items")
    return items
