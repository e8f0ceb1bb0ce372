"""What one draft token costs a vLLM step on this machine, by batch size (issue 14).

A draft token is worth its row when its commit probability beats (its cost x the tokens/s the step serves
otherwise): the break-even that policy "chain"'s floors stand for.  This measures the cost side inside the
engine: a proposer that always drafts exactly ``n`` tokens per request (the last token repeated, so
nearly all are rejected and every step commits ~1 token -- the steps stay comparable across ``n``) runs
the same prompts for several ``n``, next to ``none`` in the same invocation; per ``n``, the median over
repeats of the wall time per engine step and of the time in ``execute_model``.  The slope over ``n`` is the
cost of a draft token; ``n`` = 0 next to ``none`` is what vLLM's speculative path costs a step even
without drafts (its rejection sampler and metadata run for every step once speculation is configured).

    python benchmarks/draft_row_cost.py --batch-sizes 1,32 --drafts 0,2,4,8 --repeats 3 \\
        --json benchmarks/results/draft_row_cost.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


class FixedDraft:
    """A vLLM proposer (``custom_class``) drafting ``FIXED_DRAFT_N`` copies of each request's last token."""

    def __init__(self, vllm_config: Any) -> None:
        self.n = int(os.environ.get("FIXED_DRAFT_N", "0"))

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load."""

    def propose(self, sampled_token_ids: list[list[int]], *args: Any, **kwargs: Any) -> list[list[int]]:
        return [[int(s[-1])] * self.n if s else [] for s in sampled_token_ids]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/demo-code-4l")
    ap.add_argument("--prompts", default="open", help="open, copy or mixed (held-out prompts)")
    ap.add_argument("--n", type=int, default=32, help="prompts per run")
    ap.add_argument("--batch-sizes", default="1,32", help="comma-separated max_num_seqs values")
    ap.add_argument("--drafts", default="0,2,4,8", help="comma-separated draft lengths (k is the largest)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    import numpy as np
    from tqdm import tqdm
    from vllm import SamplingParams

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from vllm_lookahead.decoders import parse_spec
    from vllm_lookahead.engine import make_llm
    from vllm_lookahead.prompts import load_heldout_prompts
    from vllm_lookahead.vllm.step_counter import StepCounter

    prompts = load_heldout_prompts(args.n, args.prompts, seed=0)
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    drafts = [int(x) for x in args.drafts.split(",")]
    k = max(max(drafts), 1)
    runs = [("none", -1)] + [(f"custom:draft_row_cost.FixedDraft:k={k}", n) for n in drafts]
    results: dict[str, Any] = {}
    bar = tqdm(total=len(args.batch_sizes.split(",")) * len(runs), desc="engines", unit="engine")
    for bs in (int(x) for x in args.batch_sizes.split(",")):
        rows = []
        for spec, n in runs:
            os.environ["FIXED_DRAFT_N"] = str(max(n, 0))
            llm = make_llm(args.model, parse_spec(spec), max_num_seqs=bs)
            llm.generate(["def warm_up(x):\n    return x + 1\n"], sp, use_tqdm=False)
            walls, steps_s, steps = [], [], []
            for _ in range(args.repeats):
                with StepCounter() as c:
                    t0 = time.perf_counter()
                    llm.generate(prompts, sp, use_tqdm=False)
                    wall = time.perf_counter() - t0
                walls.append(1000 * wall / c.steps)
                steps_s.append(1000 * c.seconds / c.steps)
                steps.append(c.steps)
            rows.append({"method": "none" if n < 0 else f"{n} draft tokens", "draft_tokens": n if n >= 0 else None,
                         "wall_ms_per_step_median": float(np.median(walls)), "wall_ms_per_step_min": min(walls),
                         "wall_ms_per_step_max": max(walls), "execute_model_ms_median": float(np.median(steps_s)),
                         "engine_steps": steps})
            del llm
            gc.collect()
            bar.update()
        spec_rows = [r for r in rows if r["draft_tokens"] is not None]
        x = np.array([r["draft_tokens"] for r in spec_rows], dtype=float)
        y = np.array([r["wall_ms_per_step_median"] for r in spec_rows])
        slope = float(np.polyfit(x, y, 1)[0]) if len(x) > 1 else None
        results[str(bs)] = {"rows": rows, "ms_per_draft_token_per_step": slope,
                            "ms_per_draft_token_per_request": slope / bs if slope is not None else None,
                            "spec_path_without_drafts_ms": spec_rows[0]["wall_ms_per_step_median"]
                            - rows[0]["wall_ms_per_step_median"] if spec_rows and spec_rows[0]["draft_tokens"] == 0
                            else None}
    bar.close()
    out = {"command": "python benchmarks/draft_row_cost.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "model": args.model,
           "prompts": args.prompts, "n": args.n, "max_tokens": args.max_tokens, "repeats": args.repeats,
           "by_batch_size": results,
           "definition": "wall ms per engine step (median of repeats) for a proposer drafting exactly n tokens per "
                         "request, nearly all rejected; ms_per_draft_token_per_step: the least-squares slope over n "
                         "(each of the batch's requests drafts n); spec_path_without_drafts_ms: n=0 minus none"}
    for bs, r in results.items():
        print(f"batch {bs}: " + ", ".join(f"{row['method']} {row['wall_ms_per_step_median']:.3f} ms/step"
                                          for row in r["rows"]))
        if r["ms_per_draft_token_per_step"] is not None:
            print(f"  one more draft token per request: +{1000 * r['ms_per_draft_token_per_step']:.0f} us per step "
                  f"({1000 * r['ms_per_draft_token_per_request']:.1f} us per draft token); speculation without "
                  f"drafts: +{1000 * (r['spec_path_without_drafts_ms'] or 0):.0f} us per step")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
