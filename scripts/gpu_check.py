"""The verdict of ``scripts/gpu_check.sh``: read the two bench JSONs it wrote, check, summarise.

    python scripts/gpu_check.py --fp32 FP32.json --seeded SEEDED.json --bench BENCH.json --json SUMMARY.json

Checks (exit 1 when one fails, so the script's exit status is the answer):

* **fp32 exactness**: every method's greedy output equals ``none``'s at the same batch size, for
  every prompt and batch size (``exact_vs_none == 1.0``); the 2D method must really have taken its
  2D step (its ``lade2d`` counters are not empty), else exactness would be vacuous.
* **seeded T>0 exactness** (float32, a seed per request): lookahead's output equals ``none``'s for every
  prompt and batch size -- coupled verification samples each position as plain decoding does.
* **bf16 match vs A/A**: in bfloat16, outputs differ from ``none`` through numerics alone; the yardstick
  is ``none`` against itself at another batch size (A/A).  A method fails when its mismatch rate
  exceeds ``max(2 x the worst A/A mismatch rate, 2 / prompts)``: a screen for a gross loss of
  exactness, not a proof (the sidecar's conformance tests are the statistical check).
* **speed** is reported (median [min, max] tokens/s over the repeats, speed-up over ``none`` of the same
  repeat), not judged: the goal depends on model and GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _rows(bench: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(r["method"], bs, m) for r in bench["results"] for bs, m in r["by_batch_size"].items()]


def check_fp32(bench: dict[str, Any], label: str = "fp32") -> tuple[list[dict[str, Any]], list[str]]:
    """Per method and batch size: exact share and whether the 2D step ran; failures as messages."""
    if bench.get("dtype") != "float32":
        return [], [f"{label} check: bench ran in {bench.get('dtype')}, expected float32"]
    table, failures = [], []
    methods = {r["method"] for r in bench["results"]}
    if "none" not in methods or len(methods) < 2:
        failures.append(f"{label} check: needs `none` and at least one other method, got {sorted(methods)}")
    for method, bs, m in _rows(bench):
        exact = m.get("exact_vs_none")
        lade2d = m.get("lade2d")
        row = {"method": method, "batch_size": int(bs), "exact_vs_none": exact,
               "lade2d_request_steps": (lade2d or {}).get("request_steps")}
        table.append(row)
        if method == "none":
            continue
        if exact is None or exact < 1.0:
            failures.append(f"{label}: {method} at batch {bs}: {exact} of outputs equal `none` (must be 1.0)")
        if method.startswith("lookahead2d") and not lade2d:
            failures.append(f"fp32: {method} at batch {bs} never took the 2D step (exactness vacuous)")
    return table, failures


def check_bf16(bench: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """Match rate of every method next to the A/A rate of ``none``."""
    if bench.get("dtype") != "bfloat16":
        return [], [f"bf16 check: bench ran in {bench.get('dtype')}, expected bfloat16"]
    none = next((r for r in bench["results"] if r["method"] == "none"), None)
    if none is None:
        return [], ["bf16 check: `none` missing from the bench"]
    aa = [m["exact_vs_none_bs1"] for m in none["by_batch_size"].values()
          if m.get("exact_vs_none_bs1") is not None]
    worst_aa_mismatch = 1.0 - min(aa) if aa else 0.0
    n = max(1, int(bench.get("n_prompts") or 1))
    allowed = max(2.0 * worst_aa_mismatch, 2.0 / n)
    table, failures = [], []
    for method, bs, m in _rows(bench):
        exact = m.get("exact_vs_none")
        table.append({"method": method, "batch_size": int(bs), "match_vs_none": exact,
                      "aa_none_vs_none_bs1": none["by_batch_size"][bs].get("exact_vs_none_bs1"),
                      "allowed_mismatch": allowed})
        if method != "none" and (exact is None or 1.0 - exact > allowed):
            failures.append(f"bf16: {method} at batch {bs}: match {exact} (allowed mismatch {allowed:.3f}, "
                            f"worst A/A mismatch {worst_aa_mismatch:.3f})")
    return table, failures


def speed_table(bench: dict[str, Any]) -> list[dict[str, Any]]:
    """Tokens/s and speed-up over ``none``; with one repeat (smoke) the single run's figures."""
    none = next((r for r in bench["results"] if r["method"] == "none"), None)
    out = []
    for method, bs, m in _rows(bench):
        tps = m.get("tokens_per_s_median", m.get("tokens_per_s"))
        speedup = m.get("speedup_vs_none_median")
        if speedup is None and none is not None and tps:
            base = none["by_batch_size"].get(bs, {}).get("tokens_per_s")
            speedup = tps / base if base else None
        out.append({"method": method, "batch_size": int(bs), "tokens_per_s_median": tps,
                    "tokens_per_s_min": m.get("tokens_per_s_min"), "tokens_per_s_max": m.get("tokens_per_s_max"),
                    "speedup_vs_none_median": speedup,
                    "speedup_vs_none_min": m.get("speedup_vs_none_min"),
                    "speedup_vs_none_max": m.get("speedup_vs_none_max"),
                    "compression": m.get("compression"), "acceptance_rate": m.get("acceptance_rate")})
    return out


def summarize(fp32: dict[str, Any], seeded: dict[str, Any], bench: dict[str, Any]) -> dict[str, Any]:
    fp32_table, f1 = check_fp32(fp32)
    seeded_table, f3 = check_fp32(seeded, "seeded T>0")
    sampling = seeded.get("sampling") or {}
    if not sampling.get("temperature") or sampling.get("request_seed") is None:
        f3.append("seeded T>0 check: the bench was not run at T>0 with --request-seed")
    bf16_table, f2 = check_bf16(bench)
    return {"passed": not (f1 or f2 or f3), "failures": f1 + f3 + f2,
            "commands": {"fp32": fp32.get("command"), "seeded": seeded.get("command"), "bench": bench.get("command")},
            "machine": bench.get("machine"), "repeats": bench.get("repeats"),
            "fp32_exactness": fp32_table, "seeded_fp32_exactness": seeded_table, "bf16_match": bf16_table,
            "speed_bf16": speed_table(bench)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/gpu_check.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fp32", type=Path, required=True, help="bench JSON of the float32 exactness run")
    ap.add_argument("--seeded", type=Path, required=True, help="bench JSON of the seeded T>0 float32 run")
    ap.add_argument("--bench", type=Path, required=True, help="bench JSON of the bfloat16 speed run")
    ap.add_argument("--json", type=Path, required=True, help="write the summary here")
    ap.add_argument("--mode", default="gpu", help="recorded in the summary (gpu | smoke)")
    ap.add_argument("--command", default=None, help="the gpu_check.sh command line, recorded in the summary")
    args = ap.parse_args(argv)
    try:
        fp32, bench = json.loads(args.fp32.read_text()), json.loads(args.bench.read_text())
        seeded = json.loads(args.seeded.read_text())
    except (OSError, ValueError) as e:
        print(f"gpu_check: cannot read the bench results: {e}", file=sys.stderr)
        return 2
    summary = {"command": args.command, "mode": args.mode, **summarize(fp32, seeded, bench)}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(summary, indent=1) + "\n")
    for row in summary["fp32_exactness"]:
        print(f"fp32  {row['method']:<45} batch {row['batch_size']:>3}: exact {row['exact_vs_none']}")
    for row in summary["seeded_fp32_exactness"]:
        print(f"seeded {row['method']:<44} batch {row['batch_size']:>3}: exact {row['exact_vs_none']}")
    for row in summary["bf16_match"]:
        print(f"bf16  {row['method']:<45} batch {row['batch_size']:>3}: match {row['match_vs_none']} "
              f"(A/A {row['aa_none_vs_none_bs1']})")
    for row in summary["speed_bf16"]:
        sp = row["speedup_vs_none_median"]
        print(f"speed {row['method']:<45} batch {row['batch_size']:>3}: {row['tokens_per_s_median']:.0f} tok/s, "
              f"x none {'-' if sp is None else f'{sp:.2f}'}")
    for f in summary["failures"]:
        print(f"FAIL: {f}", file=sys.stderr)
    print(f"gpu_check: {'PASS' if summary['passed'] else 'FAIL'} -> {args.json}")
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
