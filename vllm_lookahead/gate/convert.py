"""``vllm-lookahead gate convert``: bring your own eval set (docs/gate.md, "Bring your own eval set").

Two input formats, one output: the gate's JSONL (``gate.evalset``), validated by the same loader
the gate uses, so a converted file is known to load before a gate run is started.

* ``--from jsonl``: one object per line with ``prompt`` and one checker, either a full ``checker``
  object or a shortcut: ``regex`` (pattern; ``regex_mode`` match/search/fullmatch), ``exact``
  (answer), ``json_schema`` (schema; ``json_prefix``: text the prompt already opened), ``tests``
  (Python test code run after prompt + completion in the sandbox).  Optional: ``id`` (default
  ``<task>-<line>``), ``task`` (default ``--task``), ``max_tokens``, ``reference``,
  ``response_format``, ``meta``.  A sample of production traffic with a checker per prompt is the
  intended use.
* ``--from samples``: production samples (the sidecar's sample schema, e.g. a dump of the samples
  topic) -> not an eval set but a policy file whose ``criteria.sampled.profiles`` are the T>0
  sampling profiles the traffic uses (most requested first, at most ``--max-profiles``, each at least
  ``--min-share`` of the T>0 samples): the gate then samples like production.  Pass it as
  ``vllm-lookahead gate --policy FILE`` (the rest of the policy keeps its defaults).
* ``--from humaneval``: HumanEval-style problems (``task_id``, ``prompt``, ``canonical_solution``,
  ``test``, ``entry_point``; JSONL, optionally gzipped) -> ``python_tests`` items whose tests are
  ``test`` + ``check(<entry_point>)``, run in the sandbox.  The prompt's final newline is moved to
  the completion: with byte-level BPE a prompt that ends in a bare newline token tells the model the
  next line starts at column 0 (docs/gate.md, eval set format), which wrecks every completion.

``--verify`` runs every item's checker on its reference (HumanEval: the canonical solution) and
fails on any that does not pass: a converter bug or a broken problem shows up before a gate run.
Every problem of the input is reported at once with its line number (exit 2).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from vllm_lookahead.gate.checkers import check
from vllm_lookahead.gate.evalset import EvalSetError, load_eval_set

SHORTCUTS = ("checker", "regex", "exact", "json_schema", "tests")
JSONL_KEYS = {"id", "task", "prompt", "max_tokens", "reference", "response_format", "meta", "regex_mode",
              "json_prefix", *SHORTCUTS}


class ConvertError(ValueError):
    """The input cannot be converted; the message lists every problem with its line."""


def _lines(path: Path) -> list[tuple[int, Any, str | None]]:
    """(line number, parsed object or None, error) for every non-blank line."""
    if not path.is_file():
        raise ConvertError(f"input {path} does not exist")
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append((n, json.loads(line), None))
            except json.JSONDecodeError as e:
                out.append((n, None, f"not JSON ({e.msg})"))
    return out


def _checker(obj: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    given = [k for k in SHORTCUTS if k in obj]
    if len(given) != 1:
        return None, (f"needs exactly one checker ({', '.join(SHORTCUTS)}), got {given or 'none'}")
    k = given[0]
    v = obj[k]
    if k == "checker":
        return v, None
    if k == "regex":
        return {"type": "regex", "pattern": v, "mode": obj.get("regex_mode", "search")}, None
    if k == "exact":
        return {"type": "exact", "answer": v}, None
    if k == "json_schema":
        c = {"type": "json_schema", "schema": v}
        if obj.get("json_prefix"):
            c["prefix"] = obj["json_prefix"]
        return c, None
    if not isinstance(v, str) or not v.strip():
        return None, "tests must be non-empty Python source"
    return {"type": "python_tests", "tests": v}, None


def from_jsonl(path: Path, task: str, max_tokens: int | None) -> list[dict[str, Any]]:
    items, errors = [], []
    for n, obj, err in _lines(path):
        where = f"{path}:{n}"
        if err:
            errors.append(f"{where}: {err}")
            continue
        if not isinstance(obj, dict):
            errors.append(f"{where}: expected a JSON object")
            continue
        unknown = set(obj) - JSONL_KEYS
        if unknown:
            errors.append(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(JSONL_KEYS)}")
        checker, why = _checker(obj)
        if why:
            errors.append(f"{where}: {why}")
            continue
        t = obj.get("task") or task
        item = {"id": str(obj.get("id") or f"{t}-{n:05d}"), "task": t, "prompt": obj.get("prompt"), "checker": checker}
        for key in ("reference", "response_format", "meta"):
            if key in obj:
                item[key] = obj[key]
        mt = obj.get("max_tokens", max_tokens)
        if mt is not None:
            item["max_tokens"] = mt
        items.append(item)
    if errors:
        raise ConvertError(_joined(path, errors))
    return items


def from_humaneval(path: Path, task: str, max_tokens: int | None, timeout_s: float) -> list[dict[str, Any]]:
    items, errors = [], []
    for n, obj, err in _lines(path):
        where = f"{path}:{n}"
        if err:
            errors.append(f"{where}: {err}")
            continue
        missing = [k for k in ("task_id", "prompt", "test", "entry_point")
                   if not isinstance(obj, dict) or not isinstance(obj.get(k), str) or not obj.get(k)]
        if missing:
            errors.append(f"{where}: HumanEval problem needs non-empty string(s) {missing}")
            continue
        prompt = obj["prompt"]
        lead = ""
        if prompt.endswith("\n"):  # the newline goes to the completion (see the module docstring)
            prompt, lead = prompt[:-1], "\n"
        item: dict[str, Any] = {
            "id": obj["task_id"].replace("/", "-"), "task": task, "prompt": prompt,
            "checker": {"type": "python_tests", "tests": obj["test"] + f"\n\ncheck({obj['entry_point']})\n",
                        "timeout_s": timeout_s},
            "max_tokens": max_tokens or 384, "meta": {"entry_point": obj["entry_point"], "source": "humaneval"}}
        if isinstance(obj.get("canonical_solution"), str):
            item["reference"] = lead + obj["canonical_solution"]
        items.append(item)
    if errors:
        raise ConvertError(_joined(path, errors))
    return items


def profiles_policy(path: Path, max_profiles: int, min_share: float) -> tuple[str, str]:
    """(policy YAML, one-line summary) with the T>0 sampling profiles of a production sample file."""
    from vllm_lookahead.gate.profiles import profiles_from_samples

    samplings, errors = [], []
    for n, obj, err in _lines(path):
        if err or not isinstance(obj, dict) or not isinstance(obj.get("sampling"), dict):
            errors.append(f"{path}:{n}: {err or 'not a sample (no sampling object)'}")
            continue
        samplings.append(obj["sampling"])
    if errors:
        raise ConvertError(_joined(path, errors))
    profiles, shares, total = profiles_from_samples(samplings, max_profiles, min_share)
    greedy = len(samplings) - total
    if not profiles:
        raise ConvertError(f"{path}: no T>0 samples among {len(samplings)} (the gate's sampled run needs a "
                           "temperature > 0; keep the default profiles)")
    lines = [f"# T>0 sampling profiles of {path.name}: {total} T>0 samples, {greedy} greedy; written by",
             "# `vllm-lookahead gate convert --from samples`.  Use: vllm-lookahead gate --policy THIS_FILE ...",
             "# Sample j of every item is drawn with profile j mod len(profiles) (equal weight, whatever the share).",
             "criteria:", "  sampled:", "    profiles:"]
    for p, share in zip(profiles, shares):
        fields = {k: v for k, v in p.to_json().items() if v != getattr(type(p), k, None)}
        fields = {"temperature": p.temperature, **fields}
        body = ", ".join(f"{k}: {v}" for k, v in fields.items())
        lines.append(f"      - {{{body}}}  # {share:.1%} of T>0 samples")
    summary = f"{len(profiles)} profile(s) covering {sum(shares):.1%} of {total} T>0 samples"
    return "\n".join(lines) + "\n", summary


def _joined(path: Path, errors: list[str]) -> str:
    shown = "\n  ".join(errors[:20])
    more = f"\n  ... and {len(errors) - 20} more" if len(errors) > 20 else ""
    return f"{path} has {len(errors)} problem(s):\n  {shown}{more}"


def write(items: list[dict[str, Any]], out: Path) -> None:
    """Write atomically, then load with the gate's own loader (every problem reported at once)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".partial")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        for it in items:
            f.write(json.dumps(it, ensure_ascii=False) + "\n")
    try:
        load_eval_set(tmp)
    except EvalSetError as e:
        os.unlink(tmp)
        raise ConvertError(str(e).replace(tmp, str(out))) from None
    os.replace(tmp, out)


def verify(items: list[dict[str, Any]]) -> list[str]:
    """Items whose reference fails their own checker (or that have none)."""
    bad = []
    for it in items:
        if "reference" not in it:
            bad.append(f"{it['id']}: no reference to verify")
            continue
        res = check(it["prompt"], it["reference"], it["checker"])
        if not res.passed:
            bad.append(f"{it['id']}: reference fails its checker ({res.detail[:200]})")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="vllm-lookahead gate convert", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("input", help="input file (JSONL; .gz allowed)")
    ap.add_argument("--from", dest="fmt", required=True, choices=["jsonl", "humaneval", "samples"],
                    help="input format (samples: production samples -> a policy file with their sampling profiles)")
    ap.add_argument("-o", "--output", required=True,
                    help="gate eval set to write (JSONL); with --from samples, the policy file to write (YAML)")
    ap.add_argument("--task", default=None, help="task name (default: custom for jsonl, humaneval)")
    ap.add_argument("--max-tokens", type=int, default=None, help="max_tokens for items without one")
    ap.add_argument("--timeout", type=float, default=10.0, help="humaneval: sandbox seconds per test run")
    ap.add_argument("--verify", action="store_true", help="check every reference passes its own checker")
    ap.add_argument("--max-profiles", type=int, default=4, help="samples: at most this many profiles (default 4)")
    ap.add_argument("--min-share", type=float, default=0.02,
                    help="samples: a profile needs this share of the T>0 samples (default 0.02 = 2%%)")
    args = ap.parse_args(argv)
    src, out = Path(args.input), Path(args.output)
    try:
        if args.max_tokens is not None and args.max_tokens < 1:
            raise ConvertError("--max-tokens must be >= 1")
        if args.fmt == "samples":
            if args.max_profiles < 1 or not 0 <= args.min_share < 1:
                raise ConvertError("--max-profiles must be >= 1 and --min-share in [0, 1)")
            text, summary = profiles_policy(src, args.max_profiles, args.min_share)
            from vllm_lookahead.gate.policy import validate

            validate(yaml.safe_load(text))  # the file is known to load before it is written
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
            print(f"wrote {summary} to {out}; use: vllm-lookahead gate --policy {out} ...")
            return 0
        if args.fmt == "jsonl":
            items = from_jsonl(src, args.task or "custom", args.max_tokens)
        else:
            items = from_humaneval(src, args.task or "humaneval", args.max_tokens, args.timeout)
        if not items:
            raise ConvertError(f"{src} has no items")
        if args.verify:
            bad = verify(items)
            if bad:
                raise ConvertError(_joined(src, bad) + "\n(nothing written)")
        write(items, out)
    except ConvertError as e:
        print(f"vllm-lookahead gate convert: error: {e}", file=sys.stderr)
        return 2
    tasks = sorted({it["task"] for it in items})
    print(f"wrote {len(items)} items ({', '.join(tasks)}) to {out}" + (" ; every reference passes" if args.verify else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
