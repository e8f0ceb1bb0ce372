"""Why the sidecar's T>0 chart uses ``ert_tokens`` 1e9 and ``shift`` 0.04: delay vs false alarms.

The PIT chart (``PitCusum``) sees a fault as a per-token drift of x = (u - 1/2) sqrt(12).  How much
drift a fault of a given size (excess log-prob, nats/token) makes is measured, not assumed: a
least-squares slope through the origin over every faulty arm of the recorded real-stream runs
(``sidecar_conformance*.json`` at T=1: the draft-temperature faults), one slope for
sharper (T x < 1) and one for flatter (T x > 1) faults.  For each (ERT, shift) on a grid this
computes, with the same Siegmund approximations as the sidecar and ``sidecar_conformance.py``:

- samples to alarm (median-like: the ARL under the fault's drift) at 0.085 / 0.1 / 0.15 nat/token;
- false alarms per 1M samples of an exact decoder whose scorer is off by a small per-token drift
  (0, 0.005, 0.0084 = the tightest 95% bound measured on a real exact stream, 0.012).

No vLLM here: seconds of arithmetic on the recorded results.

    python benchmarks/sidecar_chart_tradeoff.py --json benchmarks/results/sidecar_chart_tradeoff.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def arl(drift: float, k: float, h: float) -> float:
    """Siegmund's ARL (tokens) of a one-sided CUSUM, N(drift, 1) increments, reference k, threshold h."""
    hp, d = h + 1.166, drift - k
    if abs(d) < 1e-12:
        return hp * hp
    return (math.exp(-2 * d * hp) + 2 * d * hp - 1) / (2 * d * d)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ert", default="1e9,3e8,1e8", help="comma-separated ERTs in tokens")
    ap.add_argument("--shift", default="0.03,0.035,0.04,0.05", help="comma-separated chart shifts")
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)
    from quality_sidecar.detectors.cusum import gauss_threshold

    points, tok_per_sample, files = [], [], []
    for f in sorted(RESULTS.glob("sidecar_conformance*.json")):
        d = json.loads(f.read_text())
        if d.get("temperature") != 1.0 or d.get("top_p") != 1.0:
            continue
        files.append(f.name)
        for a in d["arms"]:
            if a["arm"].startswith("draft_temp") and a.get("pit_mean_u") is not None:
                points.append((a["arm"], a["excess_logprob_nats_per_token"], (a["pit_mean_u"] - 0.5) * math.sqrt(12)))
                tok_per_sample.append(a["tokens"] / a["samples"])
    def fit(pts: list[tuple[str, float, float]]) -> float:  # |drift of x| per nat/token, through the origin
        return abs(sum(e * x for _, e, x in pts) / sum(e * e for _, e, _ in pts))

    slopes = {"sharper": fit([p for p in points if p[1] > 0]), "flatter": fit([p for p in points if p[1] < 0])}
    tps = sum(tok_per_sample) / len(tok_per_sample)
    drifts = (0.0, 0.005, 0.0084, 0.012)
    grid = []
    for ert in (float(v) for v in args.ert.split(",")):
        for shift in (float(v) for v in args.shift.split(",")):
            k = shift / 2
            h = gauss_threshold(k, 2 * ert)
            delays = {direction: {f"{n:g}": arl(sl * n, k, h) / tps for n in (0.085, 0.1, 0.15)}
                      for direction, sl in slopes.items()}
            fa = {f"{m:g}": 1e6 * tps * (1 / arl(m, k, h) + 1 / arl(-m, k, h)) for m in drifts}
            grid.append({"ert_tokens": ert, "shift": shift, "threshold": h,
                         "samples_to_alarm_at_nats_per_token": delays,
                         "false_alarms_per_1M_samples_at_drift": fa})
    out = {"benchmark": "sidecar_chart_tradeoff", "command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
           "inputs": files, "faulty_arms": [{"arm": a, "excess_nats_per_token": e, "x_drift_per_token": x}
                                            for a, e, x in points],
           "abs_x_drift_per_nat": slopes, "tokens_per_sample": tps, "scorer_drifts_per_token": list(drifts), "grid": grid,
           "method": "Siegmund ARL for Gaussian increments (as PitCusum's thresholds); drift per nat fitted "
                     "through the origin over the faulty arms of the T=1 real-stream runs"}
    Path(args.json).write_text(json.dumps(out, indent=1))
    for g in grid:
        print(f"ERT {g['ert_tokens']:.0e} tokens, shift {g['shift']}: samples to alarm "
              + " / ".join(f"{v:.0f} @{n} nat" for n, v in g["samples_to_alarm_at_nats_per_token"]["sharper"].items())
              + "; false alarms per 1M samples at drift "
              + " / ".join(f"{v:.2g} @{m}" for m, v in g["false_alarms_per_1M_samples_at_drift"].items()))
    print(f"|drift of x| per nat/token {slopes} over {len(points)} draft-temperature arms; wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
