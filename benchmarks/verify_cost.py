#!/usr/bin/env python3
"""What verifying a speculative step costs: the proposer's argmax verdict against vLLM's rejection sampler.

Why a component timing and not tokens/s: the verification is ~0.2 ms of a 3-4 ms step at batch 1, and
this 2-core VM's tokens/s moves by 10-15% between repeats of the same method, so a tokens/s run cannot
resolve it.  The time vLLM spends in ``GPUModelRunner.sample_tokens`` per engine step (sampling,
rejection sampling and the bookkeeping around them; with the option on, the argmax verdict that
replaces the rejection sampler is computed inside it too) and the plugin's own CPU time per step
(``PROFILE``: capture, verdict and proposer) are measured directly, on the same prompts, with the two
settings interleaved repeat by repeat.  The wrapper around ``sample_tokens`` is this script's own
measurement hook (a monkeypatch for the length of the run, like the bench's step counter); so is the
second arm's ``greedy_verify.argmax_is_the_verdict`` answering False (every step then goes to vLLM's
rejection sampler, as without the argmax verdict; the engine runs in this process).

    python benchmarks/verify_cost.py --repeats 3 --json benchmarks/results/verify_cost_k8.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

SPEC = "lookahead:k=8"
SPECS = ("lookahead:k=8", "lookahead:k=8 (vLLM's rejection sampler)")  # the second without the argmax verdict


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default="open", help="open | copy | mixed (held-out prompts)")
    ap.add_argument("--n", type=int, default=32, help="prompts per run (default 32)")
    ap.add_argument("--batch-sizes", default="1,32")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from tqdm import tqdm
    from vllm import SamplingParams
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_lookahead.bench import WARMUP_PROMPTS, load_prompts
    from vllm_lookahead.decoders import DEMO_MODEL, parse_spec
    from vllm_lookahead.engine import StepCounter, make_llm
    from vllm_lookahead.vllm import greedy_verify
    from vllm_lookahead.vllm.proposer import PROFILE

    argmax_verdict = greedy_verify.argmax_is_the_verdict

    clock = {"on": False, "s": 0.0}
    original = GPUModelRunner.sample_tokens

    def timed(self, *a, **kw):
        if not clock["on"]:
            return original(self, *a, **kw)
        t0 = time.perf_counter()
        try:
            return original(self, *a, **kw)
        finally:
            clock["s"] += time.perf_counter() - t0

    GPUModelRunner.sample_tokens = timed
    prompts = load_prompts(args.prompts, args.n, 0)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    runs: dict[str, dict[str, list[dict]]] = {s: {str(b): [] for b in sizes} for s in SPECS}
    outputs: dict[tuple[str, int], list] = {}
    jobs = [(r, b, s) for r in range(args.repeats) for b in sizes
            for s in (SPECS if r % 2 == 0 else SPECS[::-1])]  # order alternates by repeat
    try:
        for r, bs, spec in tqdm(jobs, desc="engines", unit="run"):
            greedy_verify.argmax_is_the_verdict = argmax_verdict if spec == SPECS[0] else (lambda *a: False)
            llm = make_llm(str(DEMO_MODEL), parse_spec(SPEC), dtype="float32", seed=0, enforce_eager=True,
                           max_num_seqs=bs, max_model_len=2048)
            llm.generate(WARMUP_PROMPTS, sp, use_tqdm=False)
            PROFILE.reset()
            clock["s"], clock["on"] = 0.0, True
            with StepCounter() as counter:
                t0 = time.perf_counter()
                outs = llm.generate(prompts, sp, use_tqdm=False)
                wall = time.perf_counter() - t0
            clock["on"] = False
            tokens = [list(o.outputs[0].token_ids) for o in outs]
            outputs.setdefault((spec, bs), tokens)
            steps = max(counter.steps, 1)
            runs[spec][str(bs)].append({
                "repeat": r + 1, "engine_steps": counter.steps, "tokens_per_s": sum(map(len, tokens)) / wall,
                "sample_tokens_ms_per_step": 1000 * clock["s"] / steps,
                "plugin_cpu_ms_per_step": 1000 * PROFILE.seconds / steps,
                "execute_model_ms_per_step": 1000 * counter.seconds / steps})
            del llm
            gc.collect()
    finally:
        GPUModelRunner.sample_tokens = original
        greedy_verify.argmax_is_the_verdict = argmax_verdict
    summary: dict[str, dict] = {}
    for spec in SPECS:
        summary[spec] = {}
        for bs in sizes:
            rows = runs[spec][str(bs)]
            cell = {}
            for key in ("sample_tokens_ms_per_step", "plugin_cpu_ms_per_step", "execute_model_ms_per_step", "tokens_per_s"):
                vals = [row[key] for row in rows]
                cell[key] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
            summary[spec][str(bs)] = cell
            print(f"{spec:<42} batch {bs:>3}: sample_tokens {cell['sample_tokens_ms_per_step']['median']:.3f} ms/step "
                  f"[{cell['sample_tokens_ms_per_step']['min']:.3f}, {cell['sample_tokens_ms_per_step']['max']:.3f}], "
                  f"plugin CPU {cell['plugin_cpu_ms_per_step']['median']:.3f} ms/step, "
                  f"{cell['tokens_per_s']['median']:.0f} tokens/s (median of {len(rows)})")
    identical = {str(bs): outputs[(SPECS[0], bs)] == outputs[(SPECS[1], bs)] for bs in sizes}
    print("outputs identical with the argmax verdict and with vLLM's rejection sampler:", identical)
    if args.json:
        args.json.write_text(json.dumps({
            "command": "python benchmarks/verify_cost.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "prompts": args.prompts, "n_prompts": len(prompts),
            "max_tokens": args.max_tokens, "repeats": args.repeats, "summary": summary, "runs": runs,
            "outputs_identical": identical}, indent=1) + "\n")
    return 0 if all(identical.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
