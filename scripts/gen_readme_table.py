#!/usr/bin/env python3
"""Generate the "current default vs none / ngram / suffix" table of README.md and benchmarks/results/README.md.

Source: per model and prompt set, the newest JSON in ``benchmarks/results/`` (top level, not ``archive/``)
that is one ``vllm-lookahead bench`` invocation comparing ``none``, ``ngram:k=K``, ``suffix:k=K`` and the
default ``lookahead:k=K`` (no config overrides in the SPEC; more baselines, e.g. suffix at another k, may
run beside them and count as peers in "over the best baseline"; lookahead at another k may run beside
``vllm_lookahead.decoders.DEFAULT_DECODER``) at batch sizes 1, 8 and 32, methods
interleaved chunk by chunk (``--interleave chunks``), with at least 3 repeats.  "Newest" is the file's own
``time`` field.  Record a new such run after a change of the default and this table follows it.

Every figure printed is a value of that file (medians, minima and maxima over its repeats), so
``tests/test_results_provenance.py`` can check it; the file is named on every row.

    python scripts/gen_readme_table.py           # rewrite the marked blocks
    python scripts/gen_readme_table.py --check   # exit 1 if a block differs from what would be written

The blocks are delimited by ``<!-- table:begin -->`` and ``<!-- table:end -->`` (README.md: the short
form; benchmarks/results/README.md: with the commands and code versions).

A second block, ``<!-- served:begin -->`` ... ``<!-- served:end -->``, is the served comparison: per model,
the newest ``benchmarks/serve_bench.py`` JSON (vLLM's own client against ``vllm-lookahead serve``) with
``none`` first and at least 3 repeats -- one row per prompt set, temperature and method, tokens/s over
``none``'s of the same repeat at each client concurrency.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
TARGETS = {ROOT / "README.md": False, RESULTS / "README.md": True}  # path -> detailed block
BEGIN, END = "<!-- table:begin -->", "<!-- table:end -->"
SERVED_BEGIN, SERVED_END = "<!-- served:begin -->", "<!-- served:end -->"
SERVE_CLIENT = "vllm.benchmarks.serve (vllm bench serve)"
BATCHES = ("1", "8", "32")
PROMPT_ORDER = ("open", "copy")
sys.path.insert(0, str(ROOT))

# the default decoder is the row shown for a file that also ran lookahead at another k (listed as "also run")
from vllm_lookahead.decoders import DEFAULT_DECODER  # noqa: E402 (after the path set-up; no vLLM)


def _spec_k(method: str, name: str) -> str | None:
    m = re.fullmatch(rf"{name}:k=(\d+)", method)
    return m.group(1) if m else None


def headline(data: object) -> list[dict] | None:
    """The records of none, ngram:k=K, suffix:k=K and the default lookahead:k=K of one bench invocation
    (K: lookahead's), or None when the file is not such a comparison.  Greedy runs only (files
    without ``sampling`` predate it and are greedy): "outputs identical to `none`" means nothing at T > 0."""
    if not isinstance(data, dict) or not isinstance(data.get("results"), list) or "command" not in data:
        return None
    recs = [r for r in data["results"] if isinstance(r, dict) and isinstance(r.get("method"), str)]
    if not recs or recs[0]["method"] != "none":
        return None
    looks = [r for r in recs if r["method"].startswith("lookahead")]
    if len(looks) > 1:
        looks = [r for r in looks if r["method"] == DEFAULT_DECODER]
    if len(looks) != 1 or _spec_k(looks[0]["method"], "lookahead") is None:
        return None
    k = _spec_k(looks[0]["method"], "lookahead")
    peers = [next((r for r in recs if r["method"] == f"{name}:k={k}"), None) for name in ("ngram", "suffix")]
    if None in peers:
        return None
    if data.get("interleave") != "chunks" or (data.get("repeats") or 0) < 3:
        return None
    if (data.get("sampling") or {}).get("temperature", 0.0) != 0.0:  # greedy only: its last column is exactness
        return None
    out = [recs[0], *peers, looks[0]]
    for r in out:
        by = r.get("by_batch_size") or {}
        if not all(b in by and "speedup_vs_none_median" in by[b] for b in BATCHES):
            return None
    return out


def qualifies(data: object) -> bool:
    """One bench invocation of the default lookahead against none / ngram / suffix at the same k."""
    return headline(data) is not None


def prompt_set(data: dict) -> str:
    """The row label: the prompt set, prefixed by the model's name unless it is the bundled demo model."""
    prompts = str(data.get("prompts"))
    prompts = Path(prompts).stem if prompts.endswith(".jsonl") else prompts
    model = Path(str(data.get("model") or "demo-code-4l")).name
    return prompts if model == "demo-code-4l" else f"{model}, {prompts}"


def _newest(results: Path, qualify: object, key_of: object) -> dict[str, tuple[str, dict]]:
    """key -> (file name, data) of the newest JSON (its ``time``) for which ``qualify(data)`` holds, per
    ``key_of(data)``."""
    best: dict[str, tuple[str, str, dict]] = {}
    for path in sorted(results.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not qualify(data):  # type: ignore[operator]
            continue
        key = key_of(data)  # type: ignore[operator]
        stamp = str(data.get("time", ""))
        if key not in best or stamp > best[key][0]:
            best[key] = (stamp, path.name, data)
    return {k: (v[1], v[2]) for k, v in best.items()}


def select(results: Path = RESULTS) -> dict[str, tuple[str, dict]]:
    """Prompt set -> (file name, data) of the newest qualifying JSON."""
    best = _newest(results, qualifies, prompt_set)
    order = [p for p in PROMPT_ORDER if p in best] + sorted(p for p in best if p not in PROMPT_ORDER)
    return {p: best[p] for p in order}


def _x(v: float) -> str:
    return f"{v:.2f}x"


def _pct(v: float) -> str:
    """100% only when every output is identical (0.996 must not print as 100%)."""
    return "100%" if v == 1.0 else f"{100 * v:.1f}%"


def _row(prompts: str, name: str, rec: dict) -> str:
    method = rec["method"]
    by = rec["by_batch_size"]
    if method == "none":
        speed = " / ".join(f"{by[b]['tokens_per_s_median']:.0f}" for b in BATCHES) + " tokens/s"
        exact = "(reference)"
    else:
        speed = " / ".join(f"{_x(by[b]['speedup_vs_none_median'])} [{_x(by[b]['speedup_vs_none_min'])}, "
                           f"{_x(by[b]['speedup_vs_none_max'])}]" for b in BATCHES)
        exact = " / ".join(_pct(by[b]["exact_vs_none"]) for b in BATCHES)
    comp = " / ".join(f"{by[b]['compression_median']:.2f}" for b in BATCHES)
    shown = f"**{method}**" if method.startswith("lookahead") else method
    return f"| {prompts} (`{name}`) | {shown} | {speed} | {comp} | {exact} |"


def provenance(data: dict) -> list[str]:
    """The detailed block's lines under a file: when, where, which code, and its command."""
    code = data.get("code") or {}
    return [f"  Taken {data.get('time')} on {(data.get('machine') or {}).get('cpu_count')} CPU cores, "
            f"code `{str(code.get('commit', '?'))[:7]}`{' (dirty)' if code.get('dirty') else ''}:",
            f"  `{data['command']}`"]


def table(sources: dict[str, tuple[str, dict]], detailed: bool) -> str:
    lines = []
    if not sources:
        return "No qualifying result file in benchmarks/results/ (see scripts/gen_readme_table.py).\n"
    lines += [
        "| prompts (file) | method | tokens/s vs `none` of the same repeat, median [min, max]: batch 1 / 8 / 32 "
        "| compression, tokens per target forward (median): batch 1 / 8 / 32 | outputs identical to `none` |",
        "|---|---|---|---|---|",
    ]
    heads = {prompts: headline(data) or [] for prompts, (_name, data) in sources.items()}
    for prompts, (name, _data) in sources.items():
        for rec in heads[prompts]:
            lines.append(_row(prompts, name, rec))
    lines.append("")
    for prompts, (name, data) in sources.items():
        recs = heads[prompts]
        la = recs[3]["by_batch_size"]
        shown = {r["method"] for r in recs}
        extra = [r["method"] for r in data["results"] if r["method"] not in shown]
        best = [tuple(la[b].get(f"speedup_vs_best_baseline_{s}") for s in ("median", "min", "max"))
                for b in BATCHES]
        reps = data.get("repeats")
        line = (f"- {prompts} prompts (`{name}`): {data.get('n_prompts')} held-out prompts, at most "
                f"{data.get('max_tokens')} tokens each, float32, {reps} repeats with the methods interleaved "
                f"chunk by chunk" + (f" (also run: {', '.join(extra)})" if extra else ""))
        if all(v is not None for trio in best for v in trio):
            line += ("; lookahead's tokens/s over the best baseline's of the same repeat, median [min, max]: "
                     + " / ".join(f"{_x(m)} [{_x(lo)}, {_x(hi)}]" for m, lo, hi in best)
                     + " at batch 1 / 8 / 32")
        lines.append(line + ".")
        if detailed:
            lines += provenance(data)
    return "\n".join(lines) + "\n"


def served_qualifies(data: object) -> bool:
    """A serve_bench JSON (vLLM's client) with >= 3 repeats, ``none`` first, summary records per concurrency."""
    summary = data.get("summary") if isinstance(data, dict) else None
    return (isinstance(summary, list) and bool(summary) and data.get("client") == SERVE_CLIENT  # type: ignore[union-attr]
            and (data.get("repeats") or 0) >= 3 and summary[0].get("method") == "none"  # type: ignore[union-attr]
            and all("by_concurrency" in e for e in summary))


def served_select(results: Path = RESULTS) -> dict[str, tuple[str, dict]]:
    """Model -> (file name, data) of the newest qualifying serve_bench JSON."""
    best = _newest(results, served_qualifies, lambda d: Path(str(d.get("model") or "demo-code-4l")).name)
    return dict(sorted(best.items()))


def _mmx(d: dict | None, ratio: bool) -> str:
    if d is None:
        return "-"
    return (f"{_x(d['median'])} [{_x(d['min'])}, {_x(d['max'])}]" if ratio else f"{d['median']:.0f}")


def served_table(sources: dict[str, tuple[str, dict]], detailed: bool) -> str:
    if not sources:
        return "No qualifying serve_bench result in benchmarks/results/ (see scripts/gen_readme_table.py).\n"
    lines = []
    for model, (name, data) in sources.items():
        summary = data["summary"]
        concs = list(summary[0]["by_concurrency"])
        lines += [f"| {model}, prompts, T (file) | method | tokens/s vs `none` of the same repeat, median [min, max]: "
                  f"client concurrency {' / '.join(concs)} |", "|---|---|---|"]
        order = sorted(summary, key=lambda e: (str(e.get("prompts")), e["temperature"]))
        for e in order:
            by = e["by_concurrency"]
            if e["method"] == "none":
                cells = " / ".join(_mmx(by[c]["output_tokens_per_s"], False) if c in by else "-" for c in concs)
                cells += " tokens/s"
            else:
                cells = " / ".join(_mmx(by[c]["output_tokens_per_s_vs_none"], True) if c in by else "-" for c in concs)
            shown = f"**{e['method']}**" if e["method"].startswith("lookahead") else e["method"]
            lines.append(f"| {e.get('prompts')}, T={e['temperature']} (`{name}`) | {shown} | {cells} |")
        lines.append("")
        line = (f"- {model} (`{name}`): {data.get('requests_per_cell')} requests per cell (a server never sees a "
                f"prompt twice), at most {data.get('max_tokens')} tokens each, float32, {data.get('repeats')} "
                f"repeats with the methods' servers interleaved; concurrency all = every request at once.")
        lines.append(line)
        if detailed:
            lines += provenance(data)
    return "\n".join(lines) + "\n"


def render(text: str, block: str, begin: str = BEGIN, end: str = END) -> str:
    pat = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
    if not pat.search(text):
        raise SystemExit(f"markers {begin} ... {end} not found")
    return pat.sub(lambda _m: f"{begin}\n{block}{end}", text, count=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a marked block is out of date")
    args = ap.parse_args(argv)
    sources, served = select(), served_select()
    stale = []
    for path, detailed in TARGETS.items():
        text = path.read_text()
        new = render(render(text, table(sources, detailed)), served_table(served, detailed), SERVED_BEGIN, SERVED_END)
        if new != text:
            if args.check:
                stale.append(str(path.relative_to(ROOT)))
            else:
                path.write_text(new)
    if stale:
        print("out of date (run python scripts/gen_readme_table.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    print("sources: " + ", ".join(f"{p}={n}" for p, (n, _d) in {**sources, **served}.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
