"""Where a run's time goes, by batch-size bucket: every engine step's rows, draft tokens and wall time.

``bench`` gives one tokens/s per method and batch size; when a decoder loses at a batch size this says
in which phase of the run -- the prefill steps, the full batch, or the tail as requests finish and the
batch shrinks through the power-of-two buckets (the drafter's own buckets: ``core.row_price.batch_bucket``).
Every run gets a fresh in-process engine (vLLM's step is wrapped here), as ``bench`` does: an engine
kept from the last repeat would draft the same prompts' outputs from its output memory.  Every repeat
runs each method on the same prompts, the order rotating.

    python benchmarks/step_time_by_bucket.py --model DIR --prompts .bench-work/real/real_chat.jsonl \
        --methods "none;lookahead:k=8" --batch-size 32 --repeats 3 --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from vllm_lookahead.core.row_price import batch_bucket


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per bucket ("prefill" for steps that carry prompt tokens): steps, seconds, ms per step, draft
    tokens and rows per step -- means over the repeats."""
    agg: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0, 0])
    for run in runs:
        for rows, drafts, prompt, dt in run["steps"]:
            a = agg["prefill" if prompt else str(batch_bucket(rows))]
            a[0] += 1
            a[1] += dt
            a[2] += drafts
            a[3] += rows
    n = len(runs)
    return {k: {"steps": a[0] / n, "seconds": a[1] / n, "ms_per_step": 1000 * a[1] / a[0],
                "draft_tokens_per_step": a[2] / a[0], "rows_per_step": a[3] / a[0]}
            for k, a in sorted(agg.items(), key=lambda kv: (kv[0] != "prefill", int(kv[0]) if kv[0].isdigit() else 0))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model directory")
    ap.add_argument("--prompts", required=True, help="JSONL with a 'prompt' field (e.g. benchmarks/real_model_prompts.py's)")
    ap.add_argument("--n", type=int, default=0, help="prompts (the file's, cycled to this many; default: the file's)")
    ap.add_argument("--methods", default="none;lookahead:k=8", help="decoder SPECs, ';'-separated")
    ap.add_argument("--batch-size", type=int, default=32, help="max_num_seqs; all prompts submitted at once")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
    from vllm import SamplingParams
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_lookahead.decoders import parse_spec
    from vllm_lookahead.engine import make_llm
    from vllm_lookahead.vllm.step_counter import carries_prompt_tokens

    lines = [json.loads(x)["prompt"] for x in Path(args.prompts).read_text().splitlines() if x.strip()]
    prompts = [lines[i % len(lines)] for i in range(args.n or len(lines))]
    steps: list[tuple[int, int, bool, float]] = []
    orig = GPUModelRunner.execute_model

    def timed(runner: Any, so: Any, *a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return orig(runner, so, *a, **k)
        finally:
            rows = len(so.num_scheduled_tokens)
            drafts = sum(len(d) for d in so.scheduled_spec_decode_tokens.values())
            steps.append((rows, drafts, carries_prompt_tokens(so), time.perf_counter() - t))

    GPUModelRunner.execute_model = timed
    specs = [s.strip() for s in args.methods.split(";") if s.strip()]
    sp = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in specs}
    for rep in range(args.repeats):
        for s in specs[rep % len(specs):] + specs[: rep % len(specs)]:
            llm = make_llm(args.model, parse_spec(s), max_model_len=2048, max_num_seqs=args.batch_size)
            llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm-up
            steps.clear()
            t = time.perf_counter()
            out = llm.generate(prompts, sp, use_tqdm=False)
            wall = time.perf_counter() - t
            del llm
            gc.collect()
            tokens = sum(len(o.outputs[0].token_ids) for o in out)
            runs[s].append({"wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall, "steps": list(steps)})
            print(f"[step_time_by_bucket] repeat {rep + 1}/{args.repeats} {s}: {wall:.2f} s, {tokens / wall:.1f} tokens/s, "
                  f"{len(steps)} steps", flush=True)
    result = {"command": "python benchmarks/step_time_by_bucket.py " + shlex.join(sys.argv[1:] if argv is None else argv),
              "model": args.model, "n_prompts": len(prompts), "batch_size": args.batch_size, "max_tokens": args.max_tokens,
              "repeats": args.repeats, "time_utc": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
              "load_average_after": os.getloadavg(),
              "methods": {s: {"tokens_per_s_all": [r["tokens_per_s"] for r in rs], "wall_s_all": [r["wall_s"] for r in rs],
                              "by_bucket": summarize(rs), "by_bucket_per_repeat": [summarize([r]) for r in rs],
                              "steps_per_repeat": [r["steps"] for r in rs]} for s, rs in runs.items()}}
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    for s, m in result["methods"].items():
        print(f"== {s}: tokens/s {', '.join(f'{x:.1f}' for x in m['tokens_per_s_all'])}")
        for b, row in m["by_bucket"].items():
            print(f"   {b:>7}: {row['steps']:6.1f} steps  {row['seconds']:6.2f} s  {row['ms_per_step']:6.1f} ms/step  "
                  f"{row['draft_tokens_per_step']:5.1f} draft tokens/step  {row['rows_per_step']:5.1f} rows/step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
