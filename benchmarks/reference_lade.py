"""Compression of the full-LADE reference decoder vs plain prompt lookup, exact match vs greedy.

    .venv/bin/python benchmarks/reference_lade.py --model models/demo-code-4l --prompts open copy \
        --n 50 --max-tokens 128 --configs 5,3,5 7,4,7 15,5,15 \
        --json benchmarks/results/reference_lade.json

For each prompt set: plain greedy (the oracle, compression 1.0 by definition), each LADE W,N,G
(both branches in one forward, prompt pool on unless --no-prompt-pool), and prompt lookup with k
draft tokens (no Jacobi; n-gram from prompt + output, vLLM's ``ngram`` rule) -- all in the same run on
the same prompts.  Compression = generated tokens / target forward passes (prefill included), an
upper bound on the speed-up; exact = share of prompts whose output equals greedy token for token.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoTokenizer

from vllm_lookahead.lade2d.reference import load_model
from vllm_lookahead.lade2d.reference.bench import LadeConfig, model_eos, run_prompt_set
from vllm_lookahead.prompts import load_heldout_prompts, read_prompts_jsonl


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model directory (config.json + tokenizer)")
    ap.add_argument("--prompts", nargs="+", default=["open"],
                    help="one or more of: open, copy, mixed (held-out stdlib test/ code) or FILE.jsonl")
    ap.add_argument("--n", type=int, default=50, help="prompts per held-out set (JSONL: first n)")
    ap.add_argument("--max-tokens", type=int, default=128, help="new tokens per prompt")
    ap.add_argument("--configs", nargs="+", default=["5,3,5", "7,4,7"], help="LADE W,N,G settings")
    ap.add_argument("--lookup-k", type=int, nargs="*", default=None,
                    help="prompt-lookup draft lengths (default: N-1 of each config)")
    ap.add_argument("--lookup-ngram", default="1,3", help="prompt-lookup min,max match length")
    ap.add_argument("--no-prompt-pool", action="store_true", help="LADE pool from the window only")
    ap.add_argument("--eos", default="auto", help="EOS id: auto (model config), none, or an integer")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 is fastest here)")
    ap.add_argument("--seed", type=int, default=0, help="prompt selection and LADE window init")
    ap.add_argument("--json", type=Path, default=None, help="write results here")
    args = ap.parse_args(argv)
    if args.n < 1 or args.max_tokens < 1:
        ap.error("--n and --max-tokens must be >= 1")
    try:
        args.configs = [LadeConfig.parse(c) for c in args.configs]
        lo, hi = (int(x) for x in args.lookup_ngram.split(","))
    except ValueError as e:
        ap.error(str(e))
    args.lookup_ngram = (lo, hi)
    if args.lookup_k is None:
        args.lookup_k = sorted({c.ngram - 1 for c in args.configs})
    return args


def _load_prompts(spec: str, n: int, seed: int) -> list[str]:
    if spec in ("open", "copy", "mixed"):
        return load_heldout_prompts(n, spec, seed=seed)
    path = Path(spec)
    if not path.exists():
        raise SystemExit(f"--prompts {spec!r}: not open/copy/mixed and no such file")
    return read_prompts_jsonl(path)[:n]


def _eos(spec: str, model) -> int | None:
    if spec == "none":
        return None
    if spec == "auto":
        return model_eos(model)
    return int(spec)


def _python() -> str:
    """The interpreter as the user would type it (relative to the working directory when inside it)."""
    exe = Path(sys.executable)
    try:
        return str(exe.relative_to(Path.cwd()))
    except ValueError:
        return str(exe)


def _label(row: dict) -> str:
    if row["method"] == "lade":
        return f"LADE W={row['W']} N={row['N']} G={row['G']}"
    if row["method"] == "prompt_lookup":
        return f"prompt lookup k={row['k']}"
    return "greedy"


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_model(args.model, args.dtype)
    tok = AutoTokenizer.from_pretrained(args.model)
    eos = _eos(args.eos, model)
    sets = {spec: [tok(p)["input_ids"] for p in _load_prompts(spec, args.n, args.seed)] for spec in args.prompts}
    per_set = 1 + len(args.configs) + len(args.lookup_k)
    total = sum(len(v) for v in sets.values()) * per_set
    results = []
    t0 = time.time()
    with tqdm(total=total, unit="decode", desc="reference decoders") as bar:
        for spec, prompts in sets.items():
            bar.set_postfix_str(spec)
            for row in run_prompt_set(
                model, prompts, args.max_tokens, args.configs, args.lookup_k,
                lookup_ngram=args.lookup_ngram, eos_token_id=eos,
                prompt_pool=not args.no_prompt_pool, seed=args.seed, progress=bar.update,
            ):
                results.append({"prompt_set": spec, **row})

    print(f"\n{'prompts':8} {'method':26} {'compression':>24} {'exact vs greedy':>16} {'tokens/s':>10}")
    for row in results:
        print(f"{row['prompt_set']:8} {_label(row):26} {row['compression']:>11.3f} tokens/forward "
              f"{100 * row['exact_match']:>14.1f} % {row['tokens_per_second']:>10.1f}")
    print(f"wall time: {time.time() - t0:.1f} s")
    if args.json:
        out = {
            "command": " ".join(shlex.quote(a) for a in [_python(), *sys.argv]),
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "model": str(args.model),
            "settings": {
                "n": args.n, "max_tokens": args.max_tokens, "dtype": args.dtype, "threads": args.threads,
                "seed": args.seed, "eos_token_id": eos, "prompt_pool": not args.no_prompt_pool,
                "lookup_ngram": list(args.lookup_ngram),
            },
            "definitions": {
                "compression": "generated tokens / target forward passes (prefill counted), summed over prompts",
                "exact_match": "fraction of prompts whose output equals plain greedy token for token",
                "tokens_per_second": "wall-clock, HF transformers on CPU; not a serving speed",
            },
            "machine": {"platform": platform.platform(), "torch": torch.__version__},
            "results": results,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
