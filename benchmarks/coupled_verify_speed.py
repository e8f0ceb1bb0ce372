"""Coupled verification (``vllm/coupled_verify.py``) against vLLM's rejection sampler, on the same steps.

Why paired: on a shared 2-core machine whole-run tokens/s of the same engine vary by 30-50% between
minutes, far more than a verifier can change them.  So every T>0 drafted step runs *both* verifiers on
the same logits and drafts, in alternating order (even steps vLLM's first, odd steps coupled first):
vLLM's ``RejectionSampler`` on copies of the seeded requests' generators (and with the global RNG state
restored after it, so the step's real output -- the coupled one -- is what it is without this benchmark),
then the coupled verifier, whose output the engine keeps.  Per step this records both verifiers' wall
time and how many drafts each accepted.  Two numbers per batch size come out of that:

* ``speed_delta_pct``: (coupled - vLLM) verifier time summed over the drafted steps, as a percentage of the
  measured generation wall time -- how much faster (<0) or slower (>0) the whole run is with the coupled
  verifier than it would be with vLLM's, on the same steps;
* ``acceptance``: accepted / drafted for each verifier on the same drafts (both accept a point-mass draft
  with probability p(draft), so they agree up to sampling noise; ``acceptance_z`` is the paired z).

Drafts at fixed floors (``measured_floor=false``): the verifier's cost per drafted step is what is
measured, so every step that can draft does.  ``--repeats`` runs per batch size, each on a fresh engine.

    python benchmarks/coupled_verify_speed.py --json benchmarks/results/coupled_verify_speed.json
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import shlex
import statistics
import sys
import time
from typing import Any

SPEC = "lookahead:k=8,measured_floor=false"


def _accepted(out: Any, num_draft: list[int]) -> int:
    """Drafts accepted in a ``SamplerOutput``: emitted tokens per row minus the one bonus/recovered token."""
    from vllm_lookahead.core.verify import PLACEHOLDER

    ids = out.sampled_token_ids
    emitted = (ids != PLACEHOLDER).sum(dim=1).tolist()
    return sum(max(e - 1, 0) for e, n in zip(emitted, num_draft) if n)


class PairedVerifier:
    """Wraps ``coupled_verify.sampler_output``: times vLLM's rejection sampler on the same step first or
    after (alternating), without letting it touch any generator the real output draws from."""

    def __init__(self, coupled: Any):
        self.coupled, self.steps = coupled, []

    def __call__(self, runner: Any, logits: Any, sd: Any) -> Any:
        import torch

        md = runner.input_batch.sampling_metadata
        num_draft = list(sd.num_draft_tokens)
        rs_first = len(self.steps) % 2 == 0
        result: dict[str, Any] = {}

        def run_rs() -> None:
            gens = {}
            for i, g in md.generators.items():
                gens[i] = torch.Generator()
                gens[i].set_state(g.get_state())
            state, lg = torch.get_rng_state(), logits.clone()
            rs_md = dataclasses.replace(md, generators=gens)
            t0 = time.perf_counter()
            out = runner.rejection_sampler(sd, None, lg, rs_md)
            result["rs_s"] = time.perf_counter() - t0
            result["rs_accepted"] = _accepted(out, num_draft)
            torch.set_rng_state(state)

        if rs_first:
            run_rs()
        t0 = time.perf_counter()
        out = self.coupled(runner, logits, sd)
        result["coupled_s"] = time.perf_counter() - t0
        result["coupled_accepted"] = _accepted(out, num_draft)
        if not rs_first:
            run_rs()
        self.steps.append({"rows": len(num_draft), "drafted": sum(num_draft), **result})
        return out


def run_once(args: argparse.Namespace, batch: int, prompts: list[str]) -> dict[str, Any]:
    from vllm import SamplingParams

    from vllm_lookahead.decoders import parse_spec
    from vllm_lookahead.engine import make_llm
    from vllm_lookahead.prompts import load_heldout_prompts
    from vllm_lookahead.vllm import coupled_verify

    original = coupled_verify.sampler_output
    paired = PairedVerifier(original)
    llm = make_llm(args.model, parse_spec(SPEC), max_model_len=1024, max_num_seqs=batch)
    try:
        warm = load_heldout_prompts(batch, "open")  # compile / allocate outside the measured run
        llm.generate(warm, SamplingParams(temperature=args.temperature, max_tokens=16), use_tqdm=False)
        params = [SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens,
                                 seed=100 + i) for i in range(len(prompts))]
        coupled_verify.sampler_output = paired
        t0 = time.perf_counter()
        outs = []
        for i in range(0, len(prompts), batch):  # static batches of `batch` requests
            outs += llm.generate(prompts[i:i + batch], params[i:i + batch], use_tqdm=False)
        wall = time.perf_counter() - t0
    finally:
        coupled_verify.sampler_output = original
        del llm
        gc.collect()
    steps = paired.steps
    rs_s, c_s = sum(s["rs_s"] for s in steps), sum(s["coupled_s"] for s in steps)
    drafted = sum(s["drafted"] for s in steps)
    # the coupled verifier ran inside the measured wall time, vLLM's on top of it: without this benchmark
    # the run would take wall - rs_s (coupled) or wall - c_s (vLLM's)
    coupled_wall, rs_wall = wall - rs_s, wall - c_s
    return {"batch": batch, "wall_s": round(wall, 3), "tokens": sum(len(o.outputs[0].token_ids) for o in outs),
            "drafted_steps": len(steps), "drafted": drafted,
            "coupled_accepted": sum(s["coupled_accepted"] for s in steps),
            "rs_accepted": sum(s["rs_accepted"] for s in steps),
            "coupled_verify_ms_per_step": round(1e3 * c_s / max(len(steps), 1), 4),
            "rs_verify_ms_per_step": round(1e3 * rs_s / max(len(steps), 1), 4),
            "coupled_verify_ms_median_step": round(1e3 * statistics.median(s["coupled_s"] for s in steps), 4) if steps else None,
            "rs_verify_ms_median_step": round(1e3 * statistics.median(s["rs_s"] for s in steps), 4) if steps else None,
            "speed_delta_pct": round(100 * (coupled_wall - rs_wall) / rs_wall, 3),
            "token_ids": [list(o.outputs[0].token_ids) for o in outs]}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def stat(key: str) -> dict[str, float]:
        v = [r[key] for r in runs]
        return {"median": statistics.median(v), "min": min(v), "max": max(v)}

    drafted = sum(r["drafted"] for r in runs)
    a_c, a_r = sum(r["coupled_accepted"] for r in runs), sum(r["rs_accepted"] for r in runs)
    p_c, p_r = a_c / max(drafted, 1), a_r / max(drafted, 1)
    pooled = (a_c + a_r) / max(2 * drafted, 1)
    se = math.sqrt(max(2 * pooled * (1 - pooled) / max(drafted, 1), 1e-12))
    return {"speed_delta_pct": stat("speed_delta_pct"), "coupled_verify_ms_per_step": stat("coupled_verify_ms_per_step"),
            "rs_verify_ms_per_step": stat("rs_verify_ms_per_step"), "drafted": drafted,
            "acceptance": {"coupled": round(p_c, 4), "vllm_rejection_sampler": round(p_r, 4),
                           "acceptance_z": round((p_c - p_r) / se, 2)},
            "repeats_identical": all(r["token_ids"] == runs[0]["token_ids"] for r in runs)}


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF model directory (default: the bundled demo model)")
    ap.add_argument("--n", type=int, default=32, help="seeded copy prompts per run (default 32)")
    ap.add_argument("--batches", default="1,8,32", help="comma list of batch sizes (default 1,8,32)")
    ap.add_argument("--temperature", type=float, default=0.8, help="(default 0.8)")
    ap.add_argument("--top-p", type=float, default=1.0, help="(default 1.0)")
    ap.add_argument("--max-tokens", type=int, default=96, help="output tokens per request (default 96)")
    ap.add_argument("--repeats", type=int, default=3, help="fresh engines per batch size, interleaved (default 3)")
    ap.add_argument("--json", default=None, help="write the results JSON here")
    args = ap.parse_args(argv)
    from vllm_lookahead.decoders import DEMO_MODEL
    from vllm_lookahead.prompts import load_heldout_prompts

    args.model = args.model or str(DEMO_MODEL)
    prompts = load_heldout_prompts(args.n, "copy")
    batches = [int(b) for b in args.batches.split(",")]
    runs: dict[int, list[dict]] = {b: [] for b in batches}
    for rep in range(args.repeats):
        for b in (batches if rep % 2 == 0 else batches[::-1]):
            r = run_once(args, b, prompts)
            runs[b].append(r)
            print(f"batch {b:3d} repeat {rep}: {r['drafted_steps']} drafted steps, verify "
                  f"{r['coupled_verify_ms_per_step']:.3f} ms coupled vs {r['rs_verify_ms_per_step']:.3f} ms vLLM "
                  f"per step, run {r['speed_delta_pct']:+.2f}% with coupled", file=sys.stderr, flush=True)
    summary = {str(b): summarise(rs) for b, rs in runs.items()}
    for rs in runs.values():
        for r in rs:
            del r["token_ids"]
    result = {"benchmark": "coupled_verify_speed",
              "command": shlex.join(["python", "benchmarks/coupled_verify_speed.py",
                                     *(sys.argv[1:] if argv is None else argv)]),
              "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "model": args.model, "spec": SPEC,
              "n_prompts": len(prompts), "prompts": "copy", "temperature": args.temperature, "top_p": args.top_p,
              "max_tokens": args.max_tokens, "seeded": True, "machine": f"{os.cpu_count()} CPU cores (shared)",
              "runs": {str(b): rs for b, rs in runs.items()}, "summary": summary}
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
