#!/usr/bin/env python3
"""Render the alarm table of docs/sidecar.md ("What each alarm means and what to do") from the alarm
catalogue, quality_sidecar/alarms.py, between ``<!-- alarms:begin -->`` and ``<!-- alarms:end -->``.

The catalogue is also what every alert event says (``meaning``, ``action``), so the docs and the
alerts cannot drift apart.  tests/sidecar/test_alarm_catalogue.py checks that the committed table is current.

    python scripts/gen_alarm_table.py          # rewrite the table
    python scripts/gen_alarm_table.py --check  # exit 1 if it is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "sidecar.md"
BEGIN, END = "<!-- alarms:begin -->", "<!-- alarms:end -->"
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from doc_block import run  # noqa: E402 (scripts/, beside this file)

from quality_sidecar.alarms import CATALOGUE  # noqa: E402 (after the path set-up; pure Python)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table() -> str:
    """docs/sidecar.md's alarm table (the catalogue's order)."""
    lines = ["| detector | meaning | what to do | detail |", "|---|---|---|---|"]
    for name, t in CATALOGUE.items():
        lines.append(f"| `{name}` | {_cell(t.meaning)} | {_cell(t.action)} | {_cell(t.note)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return run(DOC, BEGIN, END, "gen_alarm_table.py from quality_sidecar/alarms.py", markdown_table(), argv,
               "alarm table")


if __name__ == "__main__":
    sys.exit(main())
