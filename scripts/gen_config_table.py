#!/usr/bin/env python3
"""Render the configuration tables (key, default, what it does) between ``<!-- config:begin -->`` and
``<!-- config:end -->``: the ``lookahead`` section (``LookaheadConfig``, vllm_lookahead/core/config.py) in
docs/lookahead.md, and the ``lookahead2d`` section (``Lade2DConfig``, vllm_lookahead/lade2d/config.py)
in docs/lade2d.md.

The text is each field's docstring; the defaults are the dataclasses' own.  tests/core and tests/lade2d
check that the committed tables are current.

    python scripts/gen_config_table.py          # rewrite the tables
    python scripts/gen_config_table.py --check  # exit 1 if one is out of date
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- config:begin -->", "<!-- config:end -->"
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from doc_block import run  # noqa: E402 (scripts/, beside this file)

from vllm_lookahead.core.config import LookaheadConfig  # noqa: E402 (after the path set-up; no vLLM)
from vllm_lookahead.lade2d.config import Lade2DConfig  # noqa: E402

DOCS = ((LookaheadConfig, ROOT / "docs" / "lookahead.md"), (Lade2DConfig, ROOT / "docs" / "lade2d.md"))


def _docstrings(config_cls: type) -> dict[str, str]:
    """Field name -> the docstring right after its annotation in ``config_cls`` (its module's source)."""
    tree = ast.parse(Path(inspect.getsourcefile(config_cls) or "").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == config_cls.__name__)
    out: dict[str, str] = {}
    body = cls.body
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr) \
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
            out[node.target.id] = " ".join(nxt.value.value.split())
    return out


def documented_keys(cls: type = LookaheadConfig) -> list[tuple[str, str, str]]:
    """(key, default, what it does) of every field of ``cls``, in declaration order."""
    docs = _docstrings(cls)
    return [(f.name, "`" + json.dumps(f.default) + "`", docs.get(f.name, "")) for f in dataclasses.fields(cls)]


def table(cls: type = LookaheadConfig) -> str:
    lines = ["| key | default | what it does |", "|---|---|---|"]
    for key, default, doc in documented_keys(cls):
        lines.append(f"| `{key}` | {default} | {doc.replace('|', '&#124;')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return max(run(doc, BEGIN, END, "gen_config_table.py", table(cls), argv, "config table") for cls, doc in DOCS)


if __name__ == "__main__":
    sys.exit(main())
