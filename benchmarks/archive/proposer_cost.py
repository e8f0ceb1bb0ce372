"""Proposer CPU time per request row at a full batch, without an engine (issue 14, item 3).

Why separate from the bench: the bench's wall-clock proposer share is inflated by whatever else runs on
the machine; this replays the drafter alone and counts its *process CPU time* (``time.process_time``),
which load moves less than wall time (it still varies ~30% with cache and core contention;
repeats give the spread).  Rows: ``--batch`` held-out prompts (real token ids from the demo tokenizer)
decoding side by side; each step a random prefix of every draft is accepted and the rest of the argmax
is random, so every source (context, memory, pool, Jacobi) keeps working.

    python benchmarks/proposer_cost.py --batch 32 --steps 96 --json benchmarks/results/proposer_cost.json

``--evict-mb N`` streams an N MiB buffer through the caches between two steps, as the engine's forward
pass streams weights and activations: inside the engine the drafter runs on cold caches, and a warm
replay under-states its cost (batch 1: ~3x, benchmarks/results/README.md, "cold caches").
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np


def replay(policy: str, prompts: list[list[int]], steps: int, k: int, seed: int, evict_mb: int = 0,
           overrides: dict | None = None) -> dict[str, float]:
    from vllm_lookahead.core import LookaheadConfig, LookaheadDrafter, RowStep

    # the drafting path is what is measured: on random tokens the busy-batch guard (policies chain/ema)
    # would soon switch drafting off, and the replay would time the guard's choice, not the upkeep --
    # so the guard starts above any batch replayed here (unless --set says otherwise)
    settings = {"guard_batch_size": 1 << 30, **(overrides or {})}
    drafter = LookaheadDrafter(LookaheadConfig(policy=policy, **settings), k)
    # between two steps the engine runs a forward pass that streams the weights and activations through
    # the CPU caches; --evict-mb streams a buffer of that size instead, so the replay pays the same cold
    # caches as the engine's proposer does (without it the replay measures a warm drafter)
    junk = np.ones(evict_mb * (1 << 18), dtype=np.float32) if evict_mb else None
    rng = random.Random(seed)
    ctxs = [list(p) + [1] for p in prompts]
    plen = [len(p) for p in prompts]
    ids = [f"r{i}" for i in range(len(prompts))]
    # the engine's way where it takes it (LookaheadDrafter.batch_path): the runner's token array as it
    # is, one row per request, read in place by step_arrays
    arrays = drafter.batch_path(len(prompts))
    tokens = np.zeros((len(prompts), max(plen) + 1 + steps * (k + 1)), dtype=np.int32)
    for i, c in enumerate(ctxs):
        tokens[i, : len(c)] = c

    def step(news: list[list[int]], verified: list[int], argmaxes: list) -> list[list[int]]:
        if arrays:
            return drafter.step_arrays(ids, tokens, np.array([len(c) for c in ctxs]), news, np.array(verified),
                                       np.array(plen), lambda rid: None)
        return drafter.step([RowStep(ids[i], np.array(c), len(c), news[i], verified[i], argmaxes[i], plen[i])
                             for i, c in enumerate(ctxs)])

    cpu = 0.0
    rows_done = 0
    t0 = time.process_time()
    drafts = step([[1]] * len(ctxs), [0] * len(ctxs), [None] * len(ctxs))
    first = time.process_time() - t0  # one-off prompt indexing
    for _ in range(steps):
        news, verified, argmaxes = [], [], []
        for i, d in enumerate(drafts):
            a = rng.randint(0, len(d))
            new = d[:a] + [rng.randrange(1000)]
            argmaxes.append(np.array(new + [rng.randrange(1000) for _ in range(len(d) - a)]))
            tokens[i, len(ctxs[i]) : len(ctxs[i]) + len(new)] = new
            ctxs[i].extend(new)
            news.append(new)
            verified.append(len(d))
        if junk is not None:
            junk *= np.float32(1.0)
        t0 = time.process_time()
        drafts = step(news, verified, argmaxes)
        cpu += time.process_time() - t0
        rows_done += len(news)
    return {"policy": policy, "path": "step_arrays" if arrays else "step", "us_per_row": 1e6 * cpu / rows_done,
            "us_per_step": 1e6 * cpu / steps, "prompt_indexing_ms_total": 1000 * first, "rows": rows_done}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/demo-code-4l")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=96)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--policies", default="cost,ema")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--evict-mb", type=int, default=0,
                    help="stream a buffer of this many MiB through the caches between steps, as a forward pass does")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a LookaheadConfig override (repeatable), e.g. --set pool_max_batch=0")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    from vllm_lookahead.decoders import lookahead_overrides

    overrides = lookahead_overrides(args.k, args.set)
    from transformers import AutoTokenizer

    from vllm_lookahead.prompts import load_heldout_prompts

    tok = AutoTokenizer.from_pretrained(args.model)
    prompts = [tok(p).input_ids for p in load_heldout_prompts(args.batch, "open", seed=0)]
    out = {}
    for policy in args.policies.split(","):
        runs = [replay(policy, prompts, args.steps, args.k, seed, args.evict_mb, overrides)
                for seed in range(args.repeats)]
        vals = sorted(r["us_per_row"] for r in runs)
        steps = sorted(r["us_per_step"] for r in runs)
        out[policy] = {"us_per_row_median": vals[len(vals) // 2], "us_per_row_min": vals[0],
                       "us_per_row_max": vals[-1], "us_per_step_median": steps[len(steps) // 2], "runs": runs}
        print(f"{policy}: {vals[len(vals) // 2]:.1f} us CPU per row (min {vals[0]:.1f}, max {vals[-1]:.1f}), "
              f"{steps[len(steps) // 2]:.1f} us per step")
    if args.json:
        from vllm_lookahead.bench import code_version

        args.json.write_text(json.dumps({"command": "python benchmarks/proposer_cost.py " + " ".join(
            argv if argv is not None else sys.argv[1:]), "batch": args.batch, "steps": args.steps, "k": args.k,
            "evict_mb": args.evict_mb, "overrides": overrides,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "code": code_version(),
            "results": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
