"""Build the gate's bundled eval set from the held-out CPython stdlib ``test/`` sources.

The demo model (models/demo-code-4l) never saw ``Lib/test/``, so these items measure generalisation,
not recall.  Tasks (statistics are per task):
  next_line   a function cut mid-body; pass = the completion's first line equals the real next line
  body_prefix header + docstring/first lines; pass = completion shares >= 24 chars with the real body
  copy        a snippet followed by its first line again; pass = the next line is copied exactly
  syntax      a short function's first lines; pass = prompt + completion (to the end of the function)
              parses as Python
  test_name   a TestCase body ending in "    def test_"; pass = a well-formed method header
  json        Python source that opens a JSON literal; pass = it is valid JSON matching a schema
  unit_tests  a small function's header + docstring; pass = hidden unit tests pass in the sandbox

Usage: python benchmarks/build_eval_set.py [--out vllm_lookahead/data/eval/stdlib_heldout.jsonl] [--seed 0]
Deterministic for a given seed and Python build.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vllm_lookahead.prompts import _candidate_files, _top_level_blocks  # noqa: E402

# Prompts stop at the end of a line, not after its newline: with byte-level BPE the newline and the
# next line's indentation are one token, so a prompt ending in a bare "\n" token tells the model
# "the next line starts at column 0".  Checkers drop the completion's leading newline instead.
NL = {"lstrip_newline": True}
COUNTS = {"next_line": 36, "body_prefix": 24, "copy": 16, "syntax": 16, "test_name": 12}

JSON_ITEMS = [
    ('import json\n\nCONFIG = json.loads(\'{"name": "', {"type": "object", "required": ["name"],
                                                        "properties": {"name": {"type": "string"}}}),
    ('import json\n\ndata = json.loads(\'{"id": ', {"type": "object", "required": ["id"]}),
    ('import json\n\nPAYLOAD = \'[1, 2, ', {"type": "array", "items": {"type": "integer"}}),
    ('import json\n\ns = json.dumps({"a": 1})\nself.assertEqual(s, \'{"a": ', {"type": "object", "required": ["a"]}),
    ('import json\n\nexpected = \'{"key": "value", "', {"type": "object", "required": ["key"]}),
    ('import json\n\nEMPTY = \'[', {"type": "array"}),
    ('import json\n\nobj = json.loads(\'{"x": [', {"type": "object", "required": ["x"],
                                                   "properties": {"x": {"type": "array"}}}),
    ('import json\n\nself.assertEqual(json.loads(\'{"', {"type": "object", "minProperties": 1}),
]

UNIT_ITEMS = [
    ('def add(a, b):\n    """Return the sum of a and b."""\n', "assert add(1, 2) == 3\nassert add(-1, 1) == 0"),
    ('def is_even(n):\n    """Return True if n is even."""\n', "assert is_even(2)\nassert not is_even(3)"),
    ('def square(x):\n    """Return x squared."""\n', "assert square(3) == 9\nassert square(-2) == 4"),
    ('def first(items):\n    """Return the first element of items."""\n', "assert first([4, 5]) == 4"),
    ('def last(items):\n    """Return the last element of items."""\n', "assert last([4, 5]) == 5"),
    ('def negate(x):\n    """Return -x."""\n', "assert negate(3) == -3"),
    ('def identity(x):\n    """Return x unchanged."""\n', "assert identity(7) == 7\nassert identity(None) is None"),
    ('def get_name(self):\n    """Return the name."""\n', "class C:\n    name = 'n'\nassert get_name(C()) == 'n'"),
    ('def is_empty(s):\n    """Return True if the sequence s is empty."""\n', "assert is_empty([])\nassert not is_empty([1])"),
    ('def double(x):\n    """Return twice x."""\n', "assert double(4) == 8"),
]


def blocks(seed: int):
    rng = random.Random(seed)
    for path in _candidate_files(seed):
        try:
            source = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        bs = [b for b in _top_level_blocks(source) if 4 <= len(b) <= 60]
        rng.shuffle(bs)
        for b in bs[:2]:
            yield path, b, rng


def test_name_prompts(seed: int, n: int) -> list[tuple[str, str]]:
    rng = random.Random(seed + 7)
    out = []
    for path in _candidate_files(seed + 7):
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        idx = [i for i, ln in enumerate(lines) if ln.startswith("    def test_") and i >= 8]
        if not idx:
            continue
        i = rng.choice(idx)
        ctx = lines[max(0, i - 10):i]
        if any(len(ln) > 100 for ln in ctx):
            continue
        out.append(("\n".join(ctx) + "\n    def test_", lines[i][len("    def test_"):]))
        if len(out) >= n:
            break
    return out


def build(seed: int) -> list[dict]:
    items: list[dict] = []
    counts = dict.fromkeys(COUNTS, 0)
    seen: set[str] = set()

    def add(task: str, prompt: str, checker: dict, reference: str, max_tokens: int) -> None:
        if prompt in seen or len(prompt) > 1500:
            return
        seen.add(prompt)
        counts[task] += 1
        items.append({"id": f"{task}-{counts[task]:03d}", "task": task, "prompt": prompt,
                      "max_tokens": max_tokens, "checker": checker, "reference": reference})

    for _path, b, rng in blocks(seed):
        if all(counts[t] >= COUNTS[t] for t in ("next_line", "body_prefix", "copy", "syntax")):
            break
        task = rng.choice([t for t in ("next_line", "body_prefix", "copy", "syntax") if counts[t] < COUNTS[t]])
        if task == "next_line" and len(b) >= 6:
            cut = rng.randint(3, len(b) - 2)
            nxt = b[cut]
            if len(nxt.strip()) >= 8:
                add(task, "\n".join(b[:cut]), {"type": "next_line", "answer": nxt, **NL}, nxt, 32)
        elif task == "body_prefix" and len(b) >= 5:
            cut = 2 if '"""' not in b[1] else 3
            ref = "\n".join(b[cut:cut + 6]) + "\n"
            if len(ref) >= 30 and b[cut].strip():
                add(task, "\n".join(b[:cut]), {"type": "prefix", "answer": ref, "min_chars": 24, **NL}, ref, 48)
        elif task == "copy" and len(b) >= 4:
            snippet = b[: min(len(b), 12)]
            if len(snippet[1].strip()) >= 4:
                prompt = "\n".join(snippet) + "\n\n\n" + snippet[0]
                add(task, prompt, {"type": "exact", "answer": snippet[1], "cut": "first_line", "strip": False, **NL},
                    snippet[1], 48)
        elif task == "syntax" and 4 <= len(b) <= 10 and b[0].startswith(("def ", "async def ")):
            add(task, "\n".join(b[:2]), {"type": "python_syntax"}, "\n" + "\n".join(b[2:]) + "\n", 96)

    for prompt, ref in test_name_prompts(seed, COUNTS["test_name"]):
        add("test_name", prompt, {"type": "regex", "pattern": r"[A-Za-z0-9_]+\(self[^)]*\):\s*$",
                                  "mode": "match", "cut": "first_line"}, ref, 24)
    for i, (prompt, schema) in enumerate(JSON_ITEMS, 1):
        start = re.search(r"'([\[{].*)$", prompt).group(1)
        items.append({"id": f"json-{i:03d}", "task": "json", "prompt": prompt, "max_tokens": 32,
                      "checker": {"type": "json_schema", "schema": schema, "prefix": start},
                      "response_format": {"type": "json_object"}})
    for i, (prompt, tests) in enumerate(UNIT_ITEMS, 1):
        items.append({"id": f"unit_tests-{i:03d}", "task": "unit_tests", "prompt": prompt.rstrip("\n"), "max_tokens": 48,
                      "checker": {"type": "python_tests", "tests": tests, "timeout_s": 5, "memory_mb": 256}})
    return items


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "vllm_lookahead/data/eval/stdlib_heldout.jsonl"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    items = build(args.seed)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(it, ensure_ascii=False) + "\n" for it in items), encoding="utf-8")
    per: dict[str, int] = {}
    for it in items:
        per[it["task"]] = per.get(it["task"], 0) + 1
    print(f"wrote {len(items)} items to {out}: {per}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
