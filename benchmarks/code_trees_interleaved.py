"""Two versions of this package, one benchmark: the same decoders on an old and a new code tree, run
chunk by chunk in one invocation (``bench --interleave chunks`` across code trees).

Why: ``vllm-lookahead bench`` runs the code tree it is imported from, so "the redesign is as fast as
the code it replaced" would otherwise compare two runs made at different times on a shared VM whose
speed moves by tens of percent.  Here each tree gets its own worker process (its own engines, its own
imports of ``vllm_lookahead``), and the parent sends every chunk of prompts to every (tree, method)
in a rotating order, one at a time, exactly as ``--interleave chunks`` does for methods.

    .venv/bin/python benchmarks/code_trees_interleaved.py --old 2bc9080 --prompts open,copy --n 128 \\
        --repeats 5 --json benchmarks/results/old_vs_new_k8_r5.json

The old tree is ``git archive``-d into a temporary directory; the new one is this checkout.  Greedy
outputs of every (tree, method) are compared with the new tree's ``none``, token for token.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _worker(tree: str, conn: Any, model: str, bench_argv: list[str]) -> None:
    """One code tree's engines, driven over ``conn``: ``("engines", bs, specs, prompts)`` builds and
    warms one engine per spec and answers the prompts that fit; ``("run", i, lo, hi)`` runs a chunk on
    engine ``i``; ``("entries",)`` answers each engine's record (token ids included) and frees them."""
    sys.path.insert(0, tree)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import vllm_lookahead
    from vllm_lookahead import bench

    assert Path(vllm_lookahead.__file__).resolve().is_relative_to(Path(tree).resolve()), vllm_lookahead.__file__
    from vllm import SamplingParams

    args = bench.build_parser().parse_args(bench_argv)
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    engines: list[Any] = []
    measured: list[Any] = []
    prompts: list[str] = []
    while True:
        msg = conn.recv()
        if msg[0] == "engines":
            _, bs, specs, prompts = msg
            engines = [bench._engine(model, bench.parse_spec(t), bs, [bs], args) for t in specs]
            prompts = bench._fitting(engines[0][0], prompts, max(bench.parse_spec(t).k for t in specs),
                                     args.max_tokens)
            # no name may keep an engine past this step: freeing the previous round's last engine
            # after new ones exist tears down vLLM's process-wide parallel state under them
            for e in engines:
                e[0].generate(bench.WARMUP_PROMPTS, sp, use_tqdm=False)
            del e
            measured = [bench._Measured() for _ in specs]
            conn.send(prompts)
        elif msg[0] == "run":
            _, i, lo, hi = msg
            measured[i].run(engines[i][0], prompts[lo:hi], sp, None)
            conn.send(None)
        elif msg[0] == "entries":
            out = [m.entry(drafter) for m, (_, drafter) in zip(measured, engines)]
            engines, measured = [], []
            gc.collect()
            conn.send(out)
        else:
            conn.send(None)
            return


def _export_tree(ref: str, into: Path) -> str:
    """``git archive`` of ``ref`` extracted under ``into``; answers the full commit id."""
    commit = subprocess.run(["git", "rev-parse", ref], cwd=REPO, check=True, capture_output=True,
                            text=True).stdout.strip()
    tar = into / "tree.tar"
    subprocess.run(["git", "archive", "-o", str(tar), commit], cwd=REPO, check=True)
    with tarfile.open(tar) as t:
        t.extractall(into / "tree", filter="data")
    tar.unlink()
    return commit


def _median_range(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "all": values}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="git ref of the old code tree (e.g. 2bc9080)")
    ap.add_argument("--methods", default="none,lookahead:k=8", help="decoder specs, comma-separated")
    ap.add_argument("--prompts", default="open,copy", help="prompt sets, comma-separated (bench --prompts)")
    ap.add_argument("--n", type=int, default=128, help="prompts per set (default 128)")
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args(argv)

    from vllm_lookahead import bench
    from vllm_lookahead.decoders import DEMO_MODEL

    model = str(DEMO_MODEL)
    methods = [m for m in args.methods.split(",") if m]
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    bench_argv = ["--max-tokens", str(args.max_tokens), "--seed", str(args.seed)]
    tmp = Path(tempfile.mkdtemp(prefix="old-tree-"))
    old_commit = _export_tree(args.old, tmp)
    trees = {"old": str(tmp / "tree"), "new": str(REPO)}
    code = {"old": {"commit": old_commit}, "new": bench.code_version()}
    ctx = mp.get_context("spawn")
    conns, procs = {}, {}
    for name, tree in trees.items():
        parent, child = ctx.Pipe()
        procs[name] = ctx.Process(target=_worker, args=(tree, child, model, bench_argv), daemon=True)
        procs[name].start()
        conns[name] = parent
    units = [(name, i) for name in trees for i in range(len(methods))]  # (tree, method index)
    load: list[dict[str, Any]] = []
    records: dict[str, Any] = {}
    t_start = time.time()
    try:
        for pset in args.prompts.split(","):
            prompts = bench.load_prompts(pset, args.n, args.seed)
            per_rep: list[dict[str, dict[str, Any]]] = []
            for rep in range(args.repeats):
                this: dict[str, dict[str, Any]] = {}
                for bs in batch_sizes:
                    chunk = bench.interleave_chunk(bs)
                    print(f"[trees] {pset} repeat {rep + 1}/{args.repeats} batch size {bs}: {len(units)} "
                          f"(tree, method) units in chunks of {chunk} prompts x {args.max_tokens} tokens "
                          f"({time.time() - t_start:.0f} s so far)", file=sys.stderr, flush=True)
                    before = bench._load()
                    fitted = {}
                    for name in trees:
                        conns[name].send(("engines", bs, methods, prompts))
                        fitted[name] = conns[name].recv()
                    assert fitted["old"] == fitted["new"], "the trees chose different prompt sets"
                    for u, lo, hi in bench.interleaved_order(len(fitted["new"]), len(units), chunk, rep):
                        name, i = units[u]
                        conns[name].send(("run", i, lo, hi))
                        conns[name].recv()
                    for name in trees:
                        conns[name].send(("entries",))
                        for i, entry in enumerate(conns[name].recv()):
                            this.setdefault(f"{name}/{methods[i]}", {})[str(bs)] = entry
                    load.append({"prompts": pset, "repeat": rep + 1, "batch_size": bs, "before": before,
                                 "after": bench._load()})
                per_rep.append(this)
            records[pset] = _summarise(per_rep, methods, batch_sizes)
    finally:
        for name in trees:
            if procs[name].is_alive():
                conns[name].send(("exit",))
            procs[name].join(timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)
    out = {
        "command": "python benchmarks/code_trees_interleaved.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "what": "the same decoders on two code trees of this package, chunk-interleaved in one invocation",
        "model": model, "methods": methods, "n_prompts": args.n, "max_tokens": args.max_tokens,
        "batch_sizes": batch_sizes, "repeats": args.repeats, "dtype": "float32",
        "chunk_requests": {str(bs): bench.interleave_chunk(bs) for bs in batch_sizes},
        "code": code, "machine": bench.machine(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": time.time() - t_start, "load": load, "results": records,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    _print(records, methods, batch_sizes)
    print(f"[trees] wrote {args.json}", file=sys.stderr)
    return 0


def _summarise(per_rep: list[dict[str, dict[str, Any]]], methods: list[str], batch_sizes: list[int]) -> dict:
    """Per (tree, method) and batch size: tokens/s by repeat, the ratio to ``none`` of the same tree and
    repeat, outputs identical to the new tree's ``none``; per method: new over old, paired by repeat."""
    out: dict[str, Any] = {"by_unit": {}, "new_over_old": {}}
    ref = "new/" + methods[0]
    for unit in per_rep[0]:
        tree = unit.split("/")[0]
        row = {}
        for bs in map(str, batch_sizes):
            tps = [r[unit][bs]["tokens_per_s"] for r in per_rep]
            over_none = [r[unit][bs]["tokens_per_s"] / r[f"{tree}/{methods[0]}"][bs]["tokens_per_s"] for r in per_rep]
            same = [sum(a == b for a, b in zip(r[unit][bs]["token_ids"], r[ref][bs]["token_ids"]))
                    / len(r[ref][bs]["token_ids"]) for r in per_rep]
            row[bs] = {"tokens_per_s": _median_range(tps), "over_none_same_tree": _median_range(over_none),
                       "compression": statistics.median(r[unit][bs]["compression"] for r in per_rep),
                       "identical_to_new_none": min(same), "requests": per_rep[0][unit][bs]["requests"]}
        out["by_unit"][unit] = row
    for m in methods:
        out["new_over_old"][m] = {
            str(bs): _median_range([r[f"new/{m}"][str(bs)]["tokens_per_s"] / r[f"old/{m}"][str(bs)]["tokens_per_s"]
                                    for r in per_rep]) for bs in batch_sizes}
    return out


def _print(records: dict[str, Any], methods: list[str], batch_sizes: list[int]) -> None:
    for pset, rec in records.items():
        print(f"\n{pset}: tokens/s median [min, max] over repeats; x none of the same tree; identical to new none")
        for unit, row in rec["by_unit"].items():
            cells = [f"bs{bs} {row[str(bs)]['tokens_per_s']['median']:.0f} tokens/s "
                     f"({row[str(bs)]['over_none_same_tree']['median']:.2f}x, "
                     f"{100 * row[str(bs)]['identical_to_new_none']:.0f}% identical)" for bs in batch_sizes]
            print(f"  {unit:24s} " + " | ".join(cells))
        for m in methods:
            r = rec["new_over_old"][m]
            print(f"  new/old {m:16s} " + " | ".join(
                f"bs{bs} {r[str(bs)]['median']:.3f}x [{r[str(bs)]['min']:.3f}, {r[str(bs)]['max']:.3f}]"
                for bs in batch_sizes))


if __name__ == "__main__":
    sys.exit(main())
