#!/usr/bin/env python3
"""Render the lookahead configuration table (key, default, what it does) from vllm_lookahead/core/config.py
into docs/lookahead.md, between ``<!-- config:begin -->`` and ``<!-- config:end -->``.

The text is each field's docstring in ``LookaheadConfig`` (top-level keys) and ``LadeConfig`` (the 2D
layout's ``lade`` section, rows ``lade.<key>``); the defaults are the dataclasses' own.  tests/core
checks that the committed table is current.

    python scripts/gen_config_table.py          # rewrite the table
    python scripts/gen_config_table.py --check  # exit 1 if it is out of date
"""

from __future__ import annotations

import ast
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "vllm_lookahead" / "core" / "config.py"
DOC = ROOT / "docs" / "lookahead.md"
BEGIN, END = "<!-- config:begin -->", "<!-- config:end -->"
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from doc_block import run  # noqa: E402 (scripts/, beside this file)

from vllm_lookahead.core import config  # noqa: E402 (after the path set-up; pure Python, no vLLM)


def _docstrings(class_name: str) -> dict[str, str]:
    """Field name -> the docstring right after its annotation in ``class_name`` (config.py's source)."""
    tree = ast.parse(CONFIG.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    out: dict[str, str] = {}
    body = cls.body
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr) \
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
            out[node.target.id] = " ".join(nxt.value.value.split())
    return out


def _default(f: dataclasses.Field) -> str:
    if f.default_factory is not dataclasses.MISSING:  # the lade section
        return "see below"
    return "`" + json.dumps(f.default) + "`"


def documented_keys(cls: type = config.LookaheadConfig, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, what it does) of every field of ``cls``, in declaration order."""
    docs = _docstrings(cls.__name__)
    return [(prefix + f.name, _default(f), docs.get(f.name, "")) for f in dataclasses.fields(cls)]


def table() -> str:
    rows = documented_keys() + documented_keys(config.LadeConfig, "lade.")
    lines = ["| key | default | what it does |", "|---|---|---|"]
    for key, default, doc in rows:
        lines.append(f"| `{key}` | {default} | {doc.replace('|', '&#124;')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return run(DOC, BEGIN, END, "gen_config_table.py from vllm_lookahead/core/config.py", table(), argv,
               "config table")


if __name__ == "__main__":
    sys.exit(main())
