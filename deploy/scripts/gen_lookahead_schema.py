#!/usr/bin/env python3
"""Generate the ``lookahead`` subtree of the chart's values.schema.json from the plugin's config.

Why: the ranges of the lookahead settings are declared once, in ``vllm_lookahead/core/config.py``
(``LIMITS``, ``CHOICES``, ``K_LIMITS``, the dataclass fields and their types).  The chart used to copy
four of them by hand; now ``helm install`` rejects exactly what the engine would reject at start-up
(a key the proposer does not know under ``lookahead.extra`` included), and nothing can drift:
``--check`` (run by tests/helm/test_lookahead_schema.py) fails when the committed schema differs.

Only ``properties.lookahead`` is rewritten; the rest of the file is left byte-for-byte alone.

    python deploy/scripts/gen_lookahead_schema.py          # rewrite the subtree
    python deploy/scripts/gen_lookahead_schema.py --check  # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "deploy" / "helm" / "vllm-lookahead" / "values.schema.json"
sys.path.insert(0, str(ROOT))

from vllm_lookahead.core import config  # noqa: E402 (after the path set-up; pure Python, no vLLM)

# chart value -> LookaheadConfig key (the chart's templates/_helpers.tpl "lookaheadParams"); every key
# goes through lookahead.extra
CHART_KEYS: dict[str, str] = {}


def lookahead_schema() -> dict[str, Any]:
    fields = config.json_schema()["properties"]
    lo, hi = config.K_LIMITS
    props: dict[str, Any] = {
        "numSpeculativeTokens": {"type": "integer", "description": "k: num_speculative_tokens",
                                 "minimum": lo, "maximum": hi},
    }
    for chart_key, key in CHART_KEYS.items():
        props[chart_key] = {k: v for k, v in fields[key].items() if k != "default"} | {
            "description": f"lookahead config key {key}"}
    props["extra"] = config.json_schema() | {
        "description": "other LookaheadConfig keys, merged into --additional-config (generated from core/config.py)"}
    return {"type": "object", "additionalProperties": False, "properties": props}


def updated_text(text: str) -> str:
    """``text`` (the schema file) with only the lookahead subtree replaced, key order kept."""
    schema = json.loads(text)
    schema["properties"]["lookahead"] = lookahead_schema()
    indent = 2 if '\n  "' in text else None
    return json.dumps(schema, indent=indent) + ("\n" if text.endswith("\n") else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if values.schema.json is out of date")
    args = ap.parse_args(argv)
    text = SCHEMA.read_text()
    current = json.loads(text)["properties"].get("lookahead")
    if args.check:
        if current != lookahead_schema():
            print(f"{SCHEMA}: the lookahead subtree differs from core/config.py; run "
                  "deploy/scripts/gen_lookahead_schema.py", file=sys.stderr)
            return 1
        return 0
    SCHEMA.write_text(updated_text(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
