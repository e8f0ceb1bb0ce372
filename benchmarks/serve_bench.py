"""Serving benchmark: none vs lookahead vs vLLM's ngram / suffix, served over HTTP and measured by
vLLM's own client, at several concurrencies and temperatures.

Why: ``vllm-lookahead bench`` drives an in-process engine (``vllm.LLM``); users run ``vllm serve``
behind HTTP, sampling at T > 0, with many clients.  This starts ``vllm-lookahead serve MODEL`` once
per method, all of them up for the whole run (an idle server costs memory, not CPU), waits for
/health, and runs vLLM's serving benchmark (``vllm bench serve`` = ``vllm/benchmarks/serve.py``,
called in this process: the CPU wheel's ``vllm`` console script fails at start-up) on the repo's
held-out prompts as a custom JSONL dataset.  The methods are interleaved cell by cell (their order
rotating), so the runs a ratio pairs are seconds apart, not a server restart apart: on a shared
machine whose speed drifts by tens of percent between minutes that is what keeps a ratio honest.
Each (repeat, concurrency, temperature) cell gets its own slice of prompts, the same for every method:
a server never sees a prompt twice, so decoders with cross-request memory (lookahead's, suffix's global
tree) and the prefix cache are not credited with having seen the answer.  Concurrency ``all`` = every
request at once (saturation).

    python benchmarks/serve_bench.py --prompts open --n 64 --max-tokens 128 \\
        --methods none,lookahead:k=8,ngram:k=8,suffix:k=8 --max-concurrency 1,8,32,all \\
        --temperatures 0,0.7,1.0 --repeats 3 --json benchmarks/results/serve_bench_open.json

``--prompts 'open copy@1'`` adds copy-heavy cells at concurrency 1 to the same servers (each set its own
prompts, a cell per set x concurrency x temperature).

Writes one JSON: the command, per (repeat, method, prompt set, concurrency, temperature) the output
tokens/s, TPOT and TTFT (median and p99, ms) with ratios to ``none`` of the same repeat and cell, and per
(method, prompt set, temperature) and concurrency their median with min/max over the repeats.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vllm_lookahead.bench import _load, _split_specs, code_version, machine  # noqa: E402 (after the path set-up)
from vllm_lookahead.decoders import DEFAULT_DECODER, DecoderSpec, SpecError, parse_spec  # noqa: E402

# vLLM client result key -> ours (units in the name)
CLIENT_KEYS = {"output_throughput": "output_tokens_per_s", "median_tpot_ms": "tpot_ms_median",
               "p99_tpot_ms": "tpot_ms_p99", "median_ttft_ms": "ttft_ms_median", "p99_ttft_ms": "ttft_ms_p99",
               "median_itl_ms": "itl_ms_median", "request_throughput": "requests_per_s",
               "total_output_tokens": "output_tokens", "completed": "completed", "failed": "failed",
               "duration": "duration_s", "spec_decode_acceptance_rate": "acceptance_percent",
               "spec_decode_acceptance_length": "acceptance_length"}
# figures summarised over the repeats; *_vs_none: this method's over `none`'s, same repeat and cell
# (tokens/s: > 1 is faster; TPOT / TTFT: < 1 is faster)
SUMMARY_KEYS = ("output_tokens_per_s", "tpot_ms_median", "ttft_ms_median", "tpot_ms_p99", "ttft_ms_p99",
                "output_tokens_per_s_vs_none", "tpot_vs_none", "ttft_vs_none")
RATIOS = {"output_tokens_per_s_vs_none": "output_tokens_per_s", "tpot_vs_none": "tpot_ms_median",
          "ttft_vs_none": "ttft_ms_median"}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="benchmarks/serve_bench.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF model directory (default: the bundled demo model)")
    ap.add_argument("--prompts", default="open",
                    help="prompt sets, space separated, each open | copy | mixed (held-out stdlib test/ code) or a "
                         "JSONL file with a 'prompt' field, optionally @CONC+CONC to run it at those concurrencies "
                         "only (e.g. 'open copy@1+8'); default open"),
    ap.add_argument("--n", type=int, default=64, help="requests per (concurrency, temperature) cell (default 64)")
    ap.add_argument("--methods", default=f"none,{DEFAULT_DECODER},ngram:k=8,suffix:k=8",
                    help="decoder SPECs, comma separated (docs/gate.md); the first must be none")
    ap.add_argument("--max-concurrency", default="1,8,32,all",
                    help="client concurrencies, comma separated; 'all' = every request at once (saturation)")
    ap.add_argument("--temperatures", default="0,0.7,1.0", help="sampling temperatures, comma separated")
    ap.add_argument("--top-p", type=float, default=None, help="top-p for every request (default: the server's)")
    ap.add_argument("--top-k", type=int, default=None, help="top-k for every request (default: the server's)")
    ap.add_argument("--max-tokens", type=int, default=128, help="output tokens per request (at most; EOS ends it)")
    ap.add_argument("--ignore-eos", action="store_true",
                    help="generate exactly --max-tokens per request (every method does the same work)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="repeats, each on its own prompts, methods interleaved cell by cell (default 3)")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                    help="extra argument for every `vllm-lookahead serve` (repeatable), e.g. --serve-arg=--enforce-eager")
    ap.add_argument("--seed", type=int, default=0, help="prompt selection and server seed (default 0)")
    ap.add_argument("--json", type=Path, default=None, help="write the results JSON here")
    ap.add_argument("--workdir", type=Path, default=None, help="dataset and server logs (default: a temporary directory)")
    return ap


def parse_concurrency(text: str) -> list[int | None]:
    """'1,8,all' -> [1, 8, None]: None = no limit, every request sent at once."""
    out: list[int | None] = []
    for piece in text.split(","):
        piece = piece.strip().lower()
        if piece in ("all", "inf", "saturation"):
            out.append(None)
        elif piece.isdigit() and int(piece) >= 1:
            out.append(int(piece))
        else:
            raise ValueError(f"--max-concurrency: {piece!r} is neither an integer >= 1 nor 'all'")
    return out


def parse_prompt_sets(text: str, concurrencies: list[int | None]) -> list[tuple[str, list[int | None]]]:
    """``--prompts``: (prompt set, its concurrencies) per space-separated item ``SET[@CONC+CONC...]``."""
    out = []
    for item in text.split():
        name, _, conc = item.partition("@")
        out.append((name, parse_concurrency(conc.replace("+", ",")) if conc else concurrencies))
    if not out:
        raise ValueError("--prompts: no prompt set given")
    return out


def parse_temperatures(text: str) -> list[float]:
    out = [float(t) for t in text.split(",") if t.strip()]
    if not out or any(t < 0 for t in out):
        raise ValueError(f"--temperatures: need numbers >= 0, got {text!r}")
    return out


def serve_args(spec: DecoderSpec, args: argparse.Namespace) -> list[str]:
    """``vllm-lookahead serve`` flags selecting ``spec``: the same speculative / additional config
    ``vllm.LLM`` gets from the SPEC in ``bench`` (decoders.py), spelled as ``--speculative-config``
    JSON, so the served methods are exactly the benchmarked ones."""
    out = ["--max-model-len", str(args.max_model_len), "--seed", str(args.seed), *args.serve_arg]
    for key, value in spec.engine_kwargs().items():
        out += ["--" + key.replace("_", "-"), json.dumps(value)]
    return out


def client_argv(base_url: str, model: str, dataset: Path, n: int, concurrency: int | None, temperature: float,
                args: argparse.Namespace) -> list[str]:
    """``vllm bench serve`` arguments for one cell: greedy or sampled alike for every method; prompts
    sent as they are (completions, no chat template) in file order."""
    argv = ["--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions", "--model", model,
            "--dataset-name", "custom", "--dataset-path", str(dataset), "--num-prompts", str(n),
            "--custom-output-len", str(args.max_tokens), "--skip-chat-template", "--disable-shuffle",
            "--temperature", str(temperature), "--percentile-metrics", "ttft,tpot,itl",
            "--metric-percentiles", "50,99", "--disable-tqdm", "--seed", str(args.seed)]
    if concurrency is not None:
        argv += ["--max-concurrency", str(concurrency)]
    if args.top_p is not None:
        argv += ["--top-p", str(args.top_p)]
    if args.top_k is not None:
        argv += ["--top-k", str(args.top_k)]
    if args.ignore_eos:
        argv.append("--ignore-eos")
    return argv


def run_client(argv: list[str], log: Path) -> dict[str, Any]:
    """vLLM's serving benchmark, in this process (its tables go to ``log``); our keys of its result."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    with open(log, "a") as f, contextlib.redirect_stdout(f):
        result = bench_main(parser.parse_args(argv))
    return {ours: result.get(theirs) for theirs, ours in CLIENT_KEYS.items()}


def add_ratios(runs: list[dict[str, Any]]) -> None:
    """Each run's ``*_vs_none``: its figure over `none`'s of the same repeat, concurrency and
    temperature (paired: the repeat's servers ran minutes apart, the repeats may be an hour apart)."""
    base = {_cell(r, with_method=False): r for r in runs if r["method"] == "none"}
    for r in runs:
        ref = base.get(_cell(r, with_method=False))
        for ratio, key in RATIOS.items():
            a, b = r.get(key), None if ref is None else ref.get(key)
            r[ratio] = a / b if a is not None and b else None


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (method, prompt set, temperature), in first-seen order, one record with ``by_concurrency``
    ("1", "8", ..., "all"): every SUMMARY_KEYS figure's median, min, max and all values over the repeats
    (repeat order).  One record per row of a README table (tests/test_results_provenance.py)."""
    cells: dict[tuple, list[dict[str, Any]]] = {}
    for r in sorted(runs, key=lambda r: r["repeat"]):
        cells.setdefault(_cell(r), []).append(r)
    out: dict[tuple, dict[str, Any]] = {}
    for (method, name, conc, temp), reps in cells.items():
        entry = out.setdefault((method, name, temp), {"method": method, "prompts": name, "temperature": temp,
                                                      "by_concurrency": {}})
        figures: dict[str, Any] = {"repeats": len(reps), "failed": sum(r.get("failed") or 0 for r in reps)}
        for key in SUMMARY_KEYS:
            vals = [r[key] for r in reps if r.get(key) is not None]
            figures[key] = ({"median": float(np.median(vals)), "min": float(min(vals)), "max": float(max(vals)),
                             "all": [float(v) for v in vals]} if vals else None)
        entry["by_concurrency"][_conc(conc)] = figures
    return list(out.values())


def _cell(r: dict[str, Any], with_method: bool = True) -> tuple:
    key = (r.get("prompts"), r["max_concurrency"], r["temperature"])
    return ((r["method"], *key) if with_method else (r["repeat"], *key))


def _conc(c: int | None) -> str:
    return "all" if c is None else str(c)


def describe(r: dict[str, Any]) -> str:
    """One run, with units, for the progress log."""
    def f(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)
    return (f"repeat {r['repeat']} {r['method']} {r.get('prompts')} concurrency {_conc(r['max_concurrency'])} "
            f"T={r['temperature']}: "
            f"{f(r['output_tokens_per_s'], '.1f')} tokens/s ({f(r.get('output_tokens_per_s_vs_none'), '.2f')}x none), "
            f"TPOT p50 {f(r['tpot_ms_median'], '.1f')} ms, TTFT p50 {f(r['ttft_ms_median'], '.1f')} ms, "
            f"{r['completed']} requests, {r['failed']} failed")


def print_summary(summary: list[dict[str, Any]]) -> None:
    def mr(d: dict[str, float] | None, fmt: str, unit: str) -> str:
        return "-" if d is None else f"{d['median']:{fmt}}{unit} [{d['min']:{fmt}}, {d['max']:{fmt}}]"
    print(f"{'method':<24}{'prompts':>8}{'conc.':>6}{'T':>5}{'tokens/s median [min, max]':>30}{'x none [min, max]':>26}"
          f"{'TPOT p50 ms [min, max]':>28}{'TTFT p50 ms [min, max]':>30}")
    for e in summary:
        for conc, f in e["by_concurrency"].items():
            print(f"{e['method']:<24}{str(e.get('prompts'))[:8]:>8}{conc:>6}{e['temperature']:>5}"
                  f"{mr(f['output_tokens_per_s'], '.1f', ''):>30}{mr(f['output_tokens_per_s_vs_none'], '.2f', 'x'):>26}"
                  f"{mr(f['tpot_ms_median'], '.2f', ''):>28}{mr(f['ttft_ms_median'], '.1f', ''):>30}")


def load_cells(args: argparse.Namespace, model: str, name: str, n_cells: int) -> list[str]:
    """``n_cells`` x ``--n`` distinct prompts of set ``name`` (one slice per cell and repeat) that fit the
    context with room for the output and a draft."""
    from transformers import AutoTokenizer

    from vllm_lookahead.bench import load_prompts

    want = n_cells * args.n
    prompts = load_prompts(name, 2 * want, args.seed)
    tok = AutoTokenizer.from_pretrained(model)
    room = args.max_model_len - args.max_tokens - 24
    prompts = [p for p in prompts if len(tok(p).input_ids) <= room][:want]
    if len(prompts) < want:
        raise ValueError(f"{name}: {len(prompts)} prompts fit, {n_cells} cells x --n {args.n} = {want} needed")
    return prompts


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from tqdm import tqdm

    from tests.support.vllm_server import VllmServer
    from vllm_lookahead.decoders import DEMO_MODEL

    model = args.model or str(DEMO_MODEL)
    try:
        specs = [parse_spec(s) for s in _split_specs(args.methods)]
        concurrencies, temperatures = parse_concurrency(args.max_concurrency), parse_temperatures(args.temperatures)
        if specs[0].kind != "none" or args.repeats < 1 or args.n < 1:
            raise ValueError("the first method must be none (the ratios' reference); --repeats and --n >= 1")
        sets = parse_prompt_sets(args.prompts, concurrencies)
        cells = [(name, c, t) for name, concs in sets for t in temperatures for c in concs]
        per_set = {name: load_cells(args, model, name, args.repeats * sum(1 for cell in cells if cell[0] == name))
                   for name, _ in sets}
    except (SpecError, ValueError, OSError) as e:
        print(f"serve_bench: {e}", file=sys.stderr)
        return 2
    work = args.workdir or Path(tempfile.mkdtemp(prefix="serve_bench-"))
    work.mkdir(parents=True, exist_ok=True)
    datasets: dict[tuple[int, int], Path] = {}  # (repeat, cell) -> its prompts
    taken = dict.fromkeys(per_set, 0)
    for rep in range(1, args.repeats + 1):
        for i, (name, _, _) in enumerate(cells):
            path = datasets[rep, i] = work / f"rep{rep}-cell{i}.jsonl"
            chunk = per_set[name][taken[name]: taken[name] + args.n]
            taken[name] += args.n
            path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in chunk))
    warm = work / "warmup.jsonl"
    warm.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("def f(x):\n", "import os\n")))
    code, runs, load = code_version(), [], []
    # the KV cache size the caller set wins over the server helper's small test default (1 GiB)
    kv_env = {k: os.environ[k] for k in ("VLLM_CPU_KVCACHE_SPACE",) if k in os.environ}
    servers: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        for k, spec in enumerate(specs):
            print(f"[serve_bench] starting {spec.text}", file=sys.stderr, flush=True)
            (work / f"server{k}").mkdir(exist_ok=True)
            server = servers[spec.text] = VllmServer(model, kv_env, serve_args(spec, args), str(work / f"server{k}"))
            stack.callback(server.stop)
            server.start()
            run_client(client_argv(server.url, model, warm, 2, 1, 0.0, args), work / "client.log")
        bar = tqdm(total=args.repeats * len(specs) * len(cells), unit="run", desc="serve_bench")
        for rep in range(1, args.repeats + 1):
            before = _load()
            for i, (name, conc, temp) in enumerate(cells):
                shift = (rep - 1 + i) % len(specs)  # no method always first
                for spec in specs[shift:] + specs[:shift]:
                    bar.set_postfix_str(f"{spec.text} {name} concurrency {_conc(conc)} T={temp}")
                    got = run_client(client_argv(servers[spec.text].url, model, datasets[rep, i], args.n, conc, temp,
                                                 args), work / "client.log")
                    runs.append({"repeat": rep, "method": spec.text, "prompts": name, "max_concurrency": conc,
                                 "temperature": temp, **got})
                    bar.update(1)
            load.append({"repeat": rep, "before": before, "after": _load()})
            add_ratios([r for r in runs if r["repeat"] == rep])
            for r in runs:
                if r["repeat"] == rep:
                    bar.write(describe(r), file=sys.stderr)
        bar.close()
    summary = summarize(runs)
    print_summary(summary)
    out = {"command": "python benchmarks/serve_bench.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "model": model, "prompts": args.prompts, "requests_per_cell": args.n, "max_tokens": args.max_tokens,
           "ignore_eos": args.ignore_eos, "sampling": {"temperatures": temperatures, "top_p": args.top_p,
                                                       "top_k": args.top_k},
           "max_concurrency": concurrencies, "repeats": args.repeats, "ratios": RATIOS, "methods": [s.text for s in specs],
           "serve_args": {s.text: serve_args(s, args) for s in specs}, "client": "vllm.benchmarks.serve (vllm bench serve)",
           "machine": machine(), "code": code, "load": load,
           "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": runs, "summary": summary}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
        print(f"[serve_bench] wrote {args.json}", file=sys.stderr)
    failed = sum(r.get("failed") or 0 for r in runs)
    if failed:
        print(f"[serve_bench] {failed} requests failed (server logs in {work})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
