"""Predicted power of the gate's excess test at other fault sizes, from a measured power run.

Why: a replicate run measures power at the fault sizes it generated (each ~10 min of CPU per decoder);
the excess test's z grows linearly with the fault size (its mean is the fault size in nats/token,
its standard error is set by the number and spread of the scored tokens, which a small fault does not
change), so the expected per-replicate z measured at one size scales to others.  Power is computed at
Holm's strictest step (alpha / m, two-sided), i.e. a lower bound on what the gate's family gives the
excess test.

    python benchmarks/gate_power_at_size.py --input benchmarks/results/archive/gate_conformance_power_excess_s6_r8.json \\
        --sizes 0.03,0.04,0.05,0.06 --json benchmarks/results/archive/gate_power_at_size_s6.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def excess_power(z: float, alpha: float, m: int) -> float:
    """Two-sided power of a z test whose statistic is N(z, 1), at Holm's strictest step alpha / m."""
    from scipy import stats

    z_crit = float(stats.norm.isf(alpha / m / 2))
    return float(stats.norm.sf(z_crit - abs(z)) + stats.norm.cdf(-z_crit - abs(z)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", required=True, help="a gate_conformance_power JSON with the excess fields")
    ap.add_argument("--sizes", default="0.03,0.04,0.05,0.06", help="fault sizes, nats/token (excess log-prob)")
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)
    from scipy import stats

    d = json.loads(Path(args.input).read_text())
    alpha = d["alpha"]
    out = {}
    for label, r in d["results"].items():
        if "excess_z_per_replicate_expected" not in r or not r["spec"].startswith("custom:"):
            continue  # exact decoders have no fault size to scale
        m = len(r["median_p_adjusted"])
        z_crit = float(stats.norm.isf(alpha / m / 2))
        per_nat = abs(r["excess_z_per_replicate_expected"] / r["excess_nats_per_token_all_samples"])
        pred = {}
        for size in (float(x) for x in args.sizes.split(",")):
            pred[f"{size:g}"] = excess_power(per_nat * size, alpha, m)
        out[label] = {"measured_excess_nats_per_token": r["excess_nats_per_token_all_samples"],
                      "measured_fail_fraction": r["fail_fraction"], "replicates": r["replicates"],
                      "z_per_nat_per_replicate": per_nat, "tests_in_family": m, "z_crit": z_crit,
                      "predicted_excess_test_power_at_nats_per_token": pred}
        print(label, {k: round(v, 3) for k, v in pred.items()}, file=sys.stderr)
    res = {"benchmark": "gate_power_at_size", "command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
           "input": args.input, "samples_per_item": d["samples_per_item"], "temperature": d["temperature"],
           "alpha": alpha, "method": "per-replicate z of the excess test scaled linearly with the fault size; "
           "two-sided power at alpha/m (Holm's strictest step)", "results": out}
    Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
