"""How long the release gate takes, and how small a regression it can detect (minimum detectable effect).

Runs the full gate (default: bundled eval set, baseline `none` vs candidate `ngram:k=4`; pass
`--candidate lookahead:k=4` once the proposer is installed) and records:
  * wall time per phase (engine start-ups, batched runs, the one-at-a-time A/A run, T>0 samples,
    analysis + report) and the gate's total, with baseline and candidate side by side;
  * the minimum detectable pass-rate delta (two-sided exact-McNemar approximation of Connor 1987,
    alpha from the policy, 80% power) for the eval-set size at the observed discordance and at
    assumed discordance rates, including the one-sided case where every discordant pair is a
    regression (p_d = delta);
  * the smallest fraction of changed T=0 outputs the exact-match criterion catches with 80% power
    (candidate mismatches above the A/A rate by more than the tolerance).

Usage: python benchmarks/gate_cost.py [--model DIR] [--candidate SPEC] [--limit N] [--out FILE]
Writes JSON (default benchmarks/results/gate_cost.json) including the command that produced it.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def exact_match_mde(n: int, aa_mismatches: int, tolerance: float, power: float = 0.8) -> float | None:
    """Smallest fraction f of changed outputs such that P(excess > tolerance) >= power."""
    from scipy import stats

    need = math.floor((tolerance + aa_mismatches / n) * n) + 1  # mismatches that exceed the tolerance
    for f1000 in range(1, 1001):
        f = f1000 / 1000
        if stats.binom.sf(need - 1, n, f) >= power:
            return f
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models" / "demo-code-4l"))
    ap.add_argument("--candidate", default="ngram:k=4")
    ap.add_argument("--baseline", default="none")
    ap.add_argument("--limit", type=int, default=None, help="items per task (default: the whole set)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gate_cost.json"))
    ap.add_argument("--report", default="/tmp/gate-cost-report")
    args = ap.parse_args(argv)

    from vllm_lookahead.decoders import parse_spec
    from vllm_lookahead.gate import stats
    from vllm_lookahead.gate.evalset import DEFAULT_EVAL_SET, load_eval_set
    from vllm_lookahead.gate.policy import load_policy
    from vllm_lookahead.gate.run import (
        GateInputs,
        evaluate,
        preflight,
        run_baseline,
        run_candidate,
        score_samples,
    )

    pol = load_policy()
    items = load_eval_set(DEFAULT_EVAL_SET, limit=args.limit)
    inp = GateInputs(Path(args.model), items, DEFAULT_EVAL_SET.name, parse_spec(args.baseline),
                     parse_spec(args.candidate), pol)
    clfs = preflight(inp)
    t0 = time.perf_counter()
    base = run_baseline(inp)
    t1 = time.perf_counter()
    cand = run_candidate(inp)
    t2 = time.perf_counter()
    score_s = score_samples(inp, [base.sampled, cand.sampled])  # T>0 scoring, as run_gate does
    t2s = time.perf_counter()
    result, _paths = evaluate(inp, base, cand, clfs, Path(args.report), t2s - t0)
    t3 = time.perf_counter()

    n = len(items)
    alpha = pol["alpha"]
    pd_obs = result["mde"]["observed_discordance"]
    aa_mm = result["exact_match"]["aa"]["mismatches"]
    mde = {f"p_d={pd:.2f}": stats.mcnemar_mde(n, pd, alpha=alpha) for pd in (0.05, 0.10, 0.20, 0.30)}
    # all discordant pairs are regressions: p_d = delta; smallest delta with enough power
    one_way = next((d / 1000 for d in range(1, 1001)
                    if stats.mcnemar_mde(n, d / 1000, alpha=alpha) is not None
                    and stats.mcnemar_mde(n, d / 1000, alpha=alpha) <= d / 1000 + 1e-12), None)
    lat = result["latency"]
    out = {
        "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"python": platform.python_version(), "cpu_count": __import__("os").cpu_count(),
                    "note": "2-core machine shared with other jobs; timings are upper bounds"},
        "model": args.model, "baseline": args.baseline, "candidate": args.candidate, "n_items": n,
        "verdict": result["verdict"], "failed": result["failed"],
        "wall_s": {"total_gate": t3 - t0, "baseline_arm": t1 - t0, "candidate_arm": t2 - t1,
                   "t_above_0_scoring_with_engine_start": t2s - t2, "t_above_0_scoring": score_s,
                   "analysis_and_report": t3 - t2s, "engine_start_baseline": base.startup_s,
                   "engine_start_candidate": cand.startup_s, **result["meta"]["run_wall_s"],
                   "baseline_sampled": base.sampled.wall_s if base.sampled else None,
                   "candidate_sampled": cand.sampled.wall_s if cand.sampled else None},
        "minimum_detectable_effect": {
            "alpha": alpha, "power": 0.8, "n_items": n,
            "observed_discordance": pd_obs,
            "pass_rate_delta_at_observed_discordance": stats.mcnemar_mde(n, max(pd_obs, 1e-9), alpha=alpha),
            "pass_rate_delta_by_assumed_discordance": mde,
            "pass_rate_delta_all_regressions": one_way,
            "changed_output_fraction_exact_match": exact_match_mde(
                n, aa_mm, pol["criteria"]["exact_match"]["max_excess_mismatch"]),
            "aa_mismatches": aa_mm,
        },
        "side_by_side": {
            arm: {"batch_tokens_per_s": lat[arm]["batch_tokens_per_s"], "batch1_tokens_per_s": lat[arm].get("seq_tokens_per_s"),
                  "ttft_p50_s": lat[arm]["ttft_s"]["p50"], "tpot_p50_s": lat[arm]["tpot_s"]["p50"],
                  "tpot_p95_s": lat[arm]["tpot_s"]["p95"], "acceptance_rate": lat[arm]["acceptance_rate"],
                  "compression_tokens_per_step": lat[arm]["compression"],
                  "pass_rate": result["pass_rate"]["overall"]["base_rate" if arm == "baseline" else "cand_rate"]}
            for arm in ("baseline", "candidate")},
        "per_task_pass_rate": {r["task"]: {"baseline": r["base_rate"], "candidate": r["cand_rate"], "n": r["n"]}
                               for r in result["pass_rate"]["per_task"]},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: out[k] for k in ("verdict", "n_items", "wall_s", "minimum_detectable_effect")}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
