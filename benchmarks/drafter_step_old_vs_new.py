"""The drafter's own step time on two code trees, interleaved: ``LookaheadDrafter.step`` (or an old tree's
``step_arrays``) on the same fixed token stream, old and new in alternating processes, ``--repeats`` times.

Why next to ``code_trees_interleaved.py``: a change inside the drafter moves the proposer's time per step
only, a few microseconds out of milliseconds, and an engine run on a shared machine needs many prompts to
resolve that; this times exactly those calls (no engine), each tree in its own process (its own imports
and numba cache), paired by repeat.  The drafts of both trees are compared too.

    .venv/bin/python benchmarks/drafter_step_old_vs_new.py --old 59b87b2 --repeats 5 \\
        --json benchmarks/results/ingest_verb_drafter_old_vs_new.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def stream(tree: str, batch: int, steps: int, k: int, seed: int) -> dict:
    """One tree's drafter over a fixed stream: ``batch`` requests over a 12-token vocabulary (contexts and
    memory match often), a random prefix of every draft accepted, a request replaced every 13 steps."""
    import random

    import numpy as np

    sys.path.insert(0, tree)
    import vllm_lookahead
    from vllm_lookahead.core import LookaheadConfig, LookaheadDrafter

    assert Path(vllm_lookahead.__file__).resolve().is_relative_to(Path(tree).resolve()), vllm_lookahead.__file__

    d = LookaheadDrafter(LookaheadConfig(), k)
    tick = iter(range(10**9))
    d.clock = lambda: 0.01 * next(tick)  # the measured floor and the guard see the same step times in every run
    step = getattr(d, "step_arrays", None) or d.step  # (the old tree's name of the one driver)
    rng = random.Random(seed)
    ctxs = [[rng.randrange(12) for _ in range(rng.randint(8, 40))] for _ in range(batch)]
    plen, ids = [len(c) for c in ctxs], [f"r{i}" for i in range(batch)]
    news: list[list[int]] = [[] for _ in range(batch)]
    ver = [0] * batch
    tokens = np.zeros((batch, 64 + 40 + steps * (k + 1)), dtype=np.int32)
    spent, digest = 0.0, hashlib.sha256()
    for s in range(steps):
        for i, c in enumerate(ctxs):
            tokens[i, : len(c)] = c
        num = np.array([len(c) for c in ctxs], dtype=np.int32)
        t0 = time.perf_counter()
        drafts = step(ids, tokens, num, news, ver, np.array(plen, dtype=np.int32), lambda rid: None)
        spent += time.perf_counter() - t0
        digest.update(repr(drafts).encode())
        for i, dr in enumerate(drafts):
            news[i] = dr[: rng.randint(0, len(dr))] + [rng.randrange(12)]
            ctxs[i] += news[i]
            ver[i] = len(dr)
        if s % 13 == 12:
            j = rng.randrange(batch)
            ids[j], ctxs[j] = f"n{s}", [rng.randrange(12) for _ in range(rng.randint(8, 40))]
            plen[j], news[j], ver[j] = len(ctxs[j]), [], 0
    return {"us_per_step": 1e6 * spent / steps, "drafts_sha256": digest.hexdigest()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="git ref of the old code tree")
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)  # tree batch steps k seed: one timed stream
    args = ap.parse_args(argv)
    if args.worker:
        tree, batch, steps, k, seed = args.worker
        print(json.dumps(stream(tree, int(batch), int(steps), int(k), int(seed))))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="old-drafter-"))
    try:
        commit = subprocess.run(["git", "rev-parse", args.old], cwd=REPO, check=True, capture_output=True,
                                text=True).stdout.strip()
        subprocess.run(["git", "archive", "-o", str(tmp / "t.tar"), commit, "vllm_lookahead"], cwd=REPO, check=True)
        with tarfile.open(tmp / "t.tar") as t:
            t.extractall(tmp / "tree", filter="data")
        trees = {"old": str(tmp / "tree"), "new": str(REPO)}
        runs: dict[str, dict[str, list[dict]]] = {}
        for rep in range(args.repeats + 1):  # repeat 0 warms numba's caches, not recorded
            for bs in args.batch_sizes.split(","):
                order = ("old", "new") if rep % 2 else ("new", "old")
                for name in order:
                    out = subprocess.run([sys.executable, __file__, "--old", args.old, "--json", str(args.json),
                                          "--worker", trees[name], bs, str(args.steps), str(args.k), "0"],
                                         check=True, capture_output=True, text=True).stdout
                    if rep:
                        runs.setdefault(bs, {}).setdefault(name, []).append(json.loads(out.splitlines()[-1]))
                print(f"[drafter] repeat {rep}/{args.repeats} batch {bs} done", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results = {}
    for bs, by in runs.items():
        ratios = [n["us_per_step"] / o["us_per_step"] for o, n in zip(by["old"], by["new"])]
        results[bs] = {"old_us_per_step": [r["us_per_step"] for r in by["old"]],
                       "new_us_per_step": [r["us_per_step"] for r in by["new"]],
                       "new_over_old_time": {"median": statistics.median(ratios), "min": min(ratios),
                                             "max": max(ratios), "all": ratios},
                       "drafts_identical": len({r["drafts_sha256"] for r in by["old"] + by["new"]}) == 1}
    out = {"command": "python benchmarks/drafter_step_old_vs_new.py " + " ".join(argv if argv is not None
                                                                                  else sys.argv[1:]),
           "what": "LookaheadDrafter step time (default config) on a fixed token stream, old and new code "
                   "trees in alternating processes, paired by repeat; no engine",
           "code": {"old": commit, "new": subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                                                         text=True).stdout.strip()},
           "steps": args.steps, "k": args.k, "repeats": args.repeats,
           "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "results": results}
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({bs: r["new_over_old_time"] | {"identical": r["drafts_identical"]} for bs, r in results.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
