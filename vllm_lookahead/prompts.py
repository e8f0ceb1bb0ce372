"""Held-out prompts for benchmarks, tests and the release gate.

The demo model never saw the CPython stdlib's ``test/`` sources (models/train_demo_model.py holds them
out), so code cut from them makes honest prompts:
  * ``open``: the first lines of a top-level function or class (header, docstring, a few body lines) --
    the model must write new code, so copying from the prompt explains only part of what it produces;
  * ``copy``: a snippet followed by its own first line again -- "repeat this code", where n-gram
    copying should shine.
Selection is deterministic for a given (kind, n, seed) on a given Python build.
"""

from __future__ import annotations

import ast
import json
import random
import sysconfig
from pathlib import Path


def stdlib_test_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]) / "test"


def _top_level_blocks(source: str) -> list[list[str]]:
    """Source lines of each top-level def/class (and methods of top-level classes)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    out: list[list[str]] = []
    nodes: list[ast.AST] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            nodes.append(node)
        elif isinstance(node, ast.ClassDef):
            nodes.extend(n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    for node in nodes:
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
        end = getattr(node, "end_lineno", None) or node.lineno
        block = lines[start:end]
        indent = len(block[0]) - len(block[0].lstrip()) if block else 0
        out.append([ln[indent:] for ln in block])
    return out


def _candidate_files(seed: int) -> list[Path]:
    files = sorted(p for p in stdlib_test_dir().rglob("*.py") if p.stat().st_size < 400_000)
    random.Random(seed).shuffle(files)
    return files


def load_heldout_prompts(n: int, kind: str = "open", seed: int = 0, max_chars: int = 1200) -> list[str]:
    """``n`` prompts of ``kind`` ("open", "copy" or "mixed") from the held-out stdlib ``test/`` code."""
    if kind == "mixed":
        a = load_heldout_prompts((n + 1) // 2, "open", seed, max_chars)
        b = load_heldout_prompts(n // 2, "copy", seed + 1, max_chars)
        return [p for pair in zip(a, b) for p in pair] + a[len(b):]
    if kind not in ("open", "copy"):
        raise ValueError(f"unknown prompt kind {kind!r}: use open, copy or mixed")
    rng = random.Random(seed)
    prompts: list[str] = []
    seen: set[str] = set()
    for path in _candidate_files(seed):
        try:
            source = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        blocks = [b for b in _top_level_blocks(source) if 6 <= len(b) <= 80]
        rng.shuffle(blocks)
        for block in blocks[:2]:
            if kind == "open":
                cut = min(len(block) - 2, rng.randint(2, 6))
                text = "\n".join(block[:cut]) + "\n"
            else:
                snippet = "\n".join(block[: min(len(block), 14)])
                text = snippet + "\n\n\n" + block[0] + "\n"
            if len(text) > max_chars or text in seen:
                continue
            seen.add(text)
            prompts.append(text)
            if len(prompts) >= n:
                return prompts
    if len(prompts) < n:
        raise ValueError(f"only {len(prompts)} {kind} prompts available from {stdlib_test_dir()}, asked for {n}")
    return prompts


def read_prompts_jsonl(path: str | Path) -> list[str]:
    """Prompts from a JSONL file, one object with a ``"prompt"`` string per line."""
    prompts = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i}: not JSON ({e.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise ValueError(f'{path}:{i}: expected an object with a "prompt" string')
        prompts.append(obj["prompt"])
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts
