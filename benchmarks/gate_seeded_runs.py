"""The gate's default run, repeated: exact lookahead's false FAILs over independent runs, and each fault's verdict.

Each run is the real ``vllm-lookahead gate`` command (default policy and eval set, in-process, both
arms built afresh) with its own ``--seed``: the engine seed and every per-request seed of the T>0
samples differ between runs, so the runs are independent decisions.  The exact candidate runs
``--runs`` times (seeds 0..runs-1); every fault runs once (seed 0); ``--dtype`` sets both arms' engines
(float32 or bfloat16).  Recorded per run: the verdict, the failed criteria, the ``seeded_exact`` block (pairs, mismatches, the seeded A/A, coupling), the
``sampled`` adjusted p-values, the T>0 tokens and impossible (out-of-support) tokens per arm and the wall time.

"Seeded samples needed" (per fault): the smallest number n of the run's seeded pairs, taken in the
order a smaller gate would have them (sample 0 of every item, then sample 1, ...), on which
``seeded_exact`` would FAIL (excess mismatch > the policy's maximum or one-sided Fisher p < alpha,
against the A/A pairs among the same n): the seeded evidence the fault needs.

    python benchmarks/gate_seeded_runs.py --runs 20 --json benchmarks/results/gate_seeded_runs.json

Each run's report directory is kept under ``--work`` (per dtype, SPEC and seed) and reused when it is
there, so the runs can be spread over several invocations at once (e.g. one with ``--faults ''``, one
with ``--runs 0``, one with ``--descending``; a run another invocation holds is left to it) and a last
one collects them all.  ``--resume FILE`` takes the runs of an earlier result file (same dtype and
candidates) as they are and runs only the seeds it lacks: the runs of one plan spread over sessions.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout first: tests.faults (CONTRIBUTING.md)

F = "custom:tests.faults."
EXACT = "lookahead:k=8"
FAULTS = [F + "DraftTemperatureProposer:k=4,factor=0.8", F + "RecoveredFromTargetProposer:k=4",
          F + "IgnoreTruncationProposer:k=4,param=top_p", F + "IgnoreTruncationProposer:k=4,param=top_k",
          F + "ReusedRandomnessProposer:k=4", F + "CoupledDraftTemperatureProposer:k=8,factor=0.8"]


def run_gate(candidate: str, seed: int, dtype: str, work: Path, collect: bool = False) -> dict[str, Any] | None:
    """One ``vllm-lookahead gate`` run (or its kept report): exit code, the gate's wall time, report.json;
    None when another invocation is running it (or, with ``collect``, when it has not run)."""
    report = work / dtype / f"{re.sub(r'[^A-Za-z0-9=.,_-]+', '_', candidate)}-seed{seed}"
    cached = (report / "report.json").exists()
    if not cached and collect:
        return None
    if not cached:
        lock = report.with_name(report.name + ".running")
        report.parent.mkdir(parents=True, exist_ok=True)
        try:
            lock.mkdir()
        except FileExistsError:
            return None
        try:
            cmd = [sys.executable, "-m", "vllm_lookahead.cli", "gate", "--candidate", candidate, "--seed", str(seed),
                   "--dtype", dtype, "--report", str(report)]
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
        finally:
            lock.rmdir()
        if proc.returncode not in (0, 1):
            raise SystemExit(f"gate exited {proc.returncode} for {candidate} seed {seed}:\n{proc.stderr[-3000:]}")
    rep = json.loads((report / "report.json").read_text())
    return {"rc": 0 if rep["verdict"] == "PASS" else 1, "wall_s": round(rep["meta"]["wall_s"], 1), "report": rep,
            "cached": cached}


def samples_needed(report: dict[str, Any], item_ids: list[str], per_item: int, max_excess: float,
                   alpha: float) -> dict[str, Any]:
    """The smallest n (seeded pairs, sample-major order) on which seeded_exact would FAIL."""
    from vllm_lookahead.gate.stats import fisher_greater_p

    sx = report["seeded_exact"]
    cand = set(sx["candidate"]["diverged"])
    aa = set(sx["aa"]["diverged"]) if sx.get("aa") else set()
    mm = aa_mm = 0
    for n, key in enumerate((f"{i}#{j}" for j in range(per_item) for i in item_ids), start=1):
        mm, aa_mm = mm + (key in cand), aa_mm + (key in aa)
        if mm / n - aa_mm / n > max_excess or fisher_greater_p(mm, n, aa_mm, n) < alpha:
            return {"seeded_samples": n, "mismatches": mm, "aa_mismatches": aa_mm}
    return {"seeded_samples": None, "note": f"seeded_exact would not FAIL on the run's {per_item * len(item_ids)} pairs"}


def summary(candidate: str, seed: int, r: dict[str, Any]) -> dict[str, Any]:
    rep = r["report"]
    conf = (rep.get("sampled") or {}).get("conformance") or {}
    crits = {c["name"]: c for c in rep["criteria"]}
    sx = rep.get("seeded_exact") or {}
    return {"candidate": candidate, "seed": seed, "rc": r["rc"], "verdict": rep["verdict"], "failed": rep["failed"],
            "wall_s": r["wall_s"],
            "seeded_exact": {"required": crits["seeded_exact"]["required"], "passed": crits["seeded_exact"]["passed"],
                             "detail": crits["seeded_exact"]["detail"],
                             "pairs": sx.get("candidate", {}).get("n"),
                             "mismatches": sx.get("candidate", {}).get("mismatches"),
                             "aa_pairs": (sx.get("aa") or {}).get("n"),
                             "aa_mismatches": (sx.get("aa") or {}).get("mismatches"),
                             "p_value": sx.get("p_value"), "coupled": sx.get("coupled"),
                             "verifier_steps": sx.get("verifier_steps")},
            "sampled_p_adjusted": (rep.get("sampled") or {}).get("p_adjusted"),
            "impossible_tokens": {arm: {"tokens": conf.get("tokens", {}).get(arm),
                                        "out_of_support": conf.get("out_of_support", {}).get(arm)}
                                  for arm in ("baseline", "candidate")}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="independent runs of the exact candidate (seeds 0..N-1)")
    ap.add_argument("--exact", default=EXACT, help="the exact candidate SPEC")
    ap.add_argument("--faults", default=";".join(FAULTS), help="fault SPECs, ';'-separated (one run each, seed 0)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="both arms' engine dtype")
    ap.add_argument("--descending", action="store_true", help="the exact runs from the last seed down")
    ap.add_argument("--collect", action="store_true", help="start no run: collect the kept reports only")
    ap.add_argument("--work", default=".bench-work/gate-runs", help="report directories, kept and reused")
    ap.add_argument("--resume", metavar="FILE", help="an earlier result file: its runs are kept, their seeds not rerun")
    ap.add_argument("--json", required=True, help="result file")
    args = ap.parse_args(argv)

    from tqdm import tqdm

    from vllm_lookahead.gate.evalset import DEFAULT_EVAL_SET, load_eval_set
    from vllm_lookahead.gate.policy import load_policy

    pol = load_policy()
    per_item = pol["criteria"]["sampled"]["samples_per_item"]
    item_ids = [it.id for it in load_eval_set(DEFAULT_EVAL_SET)]
    faults = [s for s in args.faults.split(";") if s.strip()]
    seeds = range(args.runs - 1, -1, -1) if args.descending else range(args.runs)
    exact_runs, fault_runs, earlier = [], [], None
    if args.resume:
        earlier = json.loads(Path(args.resume).read_text())
        if earlier["dtype"] != args.dtype or earlier["exact"]["candidate"] != args.exact:
            raise SystemExit(f"--resume {args.resume}: dtype {earlier['dtype']} / candidate "
                             f"{earlier['exact']['candidate']} differ from this plan's {args.dtype} / {args.exact}")
        exact_runs = [r for r in earlier["exact"]["per_run"] if r["seed"] < args.runs]
        fault_runs = [r for r in earlier["faults"] if r["candidate"] in faults]
    done = {("exact", r["seed"]) for r in exact_runs} | {(r["candidate"], 0) for r in fault_runs}
    plan = [(kind, spec, seed) for kind, spec, seed in
            [("exact", args.exact, seed) for seed in seeds] + [(f, f, 0) for f in faults] if (kind, seed) not in done]
    t0 = time.time()
    for kind, spec, seed in tqdm(plan, desc="gate runs", unit="run"):
        r = run_gate(spec, seed, args.dtype, Path(args.work), args.collect)
        if r is None:
            tqdm.write(f"{spec} seed {seed}: " + ("not run yet" if args.collect else "running in another invocation"))
            continue
        row = summary(spec, seed, r)
        if kind == "exact":
            exact_runs.append(row)
        else:
            c = pol["criteria"]
            row["seeded_samples_needed"] = samples_needed(r["report"], item_ids, per_item,
                                                          c["seeded_exact"]["max_excess_mismatch"], pol["alpha"])
            fault_runs.append(row)
        tqdm.write(f"{spec} seed {seed}: {row['verdict']} failed={row['failed']} "
                   f"seeded {row['seeded_exact']['mismatches']}/{row['seeded_exact']['pairs']} differ "
                   f"(A/A {row['seeded_exact']['aa_mismatches']}/{row['seeded_exact']['aa_pairs']}), gate {r['wall_s']:.0f} s"
                   + (" (kept report)" if r["cached"] else ""))
    exact_runs.sort(key=lambda r: r["seed"])
    passes = sum(r["verdict"] == "PASS" for r in exact_runs)
    out = {"command": shlex.join(["python", "benchmarks/gate_seeded_runs.py",
                                  *(sys.argv[1:] if argv is None else argv)]),
           "runs_planned": {"exact": args.runs, "faults": len(faults)},
           "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "gate_command": f"python -m vllm_lookahead.cli gate --candidate SPEC --seed SEED --dtype {args.dtype} "
                           "--report DIR (default policy, default eval set, in-process)", "dtype": args.dtype,
           "items": len(item_ids), "samples_per_item": per_item,
           "profiles": pol["criteria"]["sampled"]["profiles"], "alpha": pol["alpha"],
           "seeded_exact_policy": pol["criteria"]["seeded_exact"],
           "exact": {"candidate": args.exact, "runs": len(exact_runs), "passes": passes,
                     "seeded_exact_required_in": sum(bool(r["seeded_exact"]["required"]) for r in exact_runs),
                     "seeded_mismatches_total": sum(r["seeded_exact"]["mismatches"] or 0 for r in exact_runs),
                     "seeded_pairs_total": sum(r["seeded_exact"]["pairs"] or 0 for r in exact_runs),
                     "aa_mismatches_total": sum(r["seeded_exact"]["aa_mismatches"] or 0 for r in exact_runs),
                     "aa_pairs_total": sum(r["seeded_exact"]["aa_pairs"] or 0 for r in exact_runs),
                     "impossible_tokens_total": {arm: {key: sum((r.get("impossible_tokens") or {}).get(arm, {}).get(key)
                                                                or 0 for r in exact_runs)
                                                       for key in ("tokens", "out_of_support")}
                                                 for arm in ("baseline", "candidate")},
                     "per_run": exact_runs},
           "faults": fault_runs, "wall_s_this_invocation": round(time.time() - t0, 1),
           "resumed_from": earlier and {"command": earlier["command"], "when_utc": earlier["when_utc"],
                                        **({"resumed_from": earlier["resumed_from"]} if earlier.get("resumed_from") else {})},
           "machine": "2 CPU cores (shared); wall times (the gate's own, report meta.wall_s) are upper bounds"}
    Path(args.json).write_text(json.dumps(out, indent=1))
    print(f"exact {args.exact}: PASS {passes}/{len(exact_runs)}; faults: "
          + ", ".join(f"{r['candidate'].split('faults.')[-1]} {r['verdict']}" for r in fault_runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
