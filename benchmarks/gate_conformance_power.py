"""Power of the gate's ``sampled`` criterion against each T>0 fault, and its A/A false-FAIL rate.

Design (CPU is scarce): every decoder's engine runs ONCE, drawing ``samples_per_item x R`` samples per
item of the default eval set with the default policy's sampling profiles (sample j uses profile
j % len(profiles), as in the gate); sample indices [r S, (r+1) S) form replicate r, i.e. one gate's
worth of T>0 samples (S = the policy's ``samples_per_item``, a multiple of the number of profiles, so
every replicate holds the same profile mix).  The samples of one run are independent draws (except
under the correlated-randomness fault, whose point is that they are not), so the R replicates are R
independent gate decisions per decoder.  The baseline (``none``, engine seed 0) runs once and its
replicate r is the baseline arm of every candidate's replicate r; every candidate runs at engine
seed 1 (so ``none`` vs ``none`` is a true A/A).  ONE scoring engine (no speculation, prefix caching)
scores every run.  The ``sampled`` criterion is then computed exactly as the gate does
(``analysis._sampled`` + ``criteria.sampled_passes``: every adjusted p-value, and no more
out-of-support tokens than the baseline arm), except that the ``unit_tests`` checker (a sandboxed subprocess per sample)
counts as not passed in both arms; its Fisher p-value stays in the Holm-adjusted family.

Per decoder: FAILs out of R with a Wilson 95% interval, which tests rejected in each replicate, the
fault's size on all R x S samples (excess nats/token overall, per profile and at draft positions >= 2,
out-of-support tokens per 1k, duplicate samples), and the excess tests' power predicted from all
samples (``gate_power_at_size.excess_power``).  Also the sidecar's late-draft-position chart on each
stream at each ``--late-shifts`` value: samples until it alarms (20 orders of the stream) and, on the
exact decoders, its false alarms per 1M samples.

    python benchmarks/gate_conformance_power.py --replicates 8 \\
        --out benchmarks/results/gate_fault_power_s6_r8.json --cache .bench-work/gate-power
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import pickle
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout first: tests.faults, tests.support (CONTRIBUTING.md)

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

F = "custom:tests.faults."
# the faults of issue 40's point 4 that the in-process gate can run (vLLM 0.32 refuses min_p with
# speculative decoding, so "min_p ignored" cannot be built as a proposer fault here)
FAULTS = (F + "IgnoreTruncationProposer:k=4,param=top_p;" + F + "IgnoreTruncationProposer:k=4,param=top_k;"
          + F + "RecoveredFromTargetProposer:k=4;" + F + "LateDraftTemperatureProposer:k=4,factor=0.7;"
          + F + "ReusedRandomnessProposer:k=4")
# the exact controls: no speculation, the default decoder, and the faults' own proposer with its fault
# switched off (factor 1.0: draft positions verified at the request's temperature) -- the matched null,
# which drafts as many tokens at the same positions as the faults do
EXACT = "none;lookahead:k=8;" + F + "LateDraftTemperatureProposer:k=4,factor=1.0"


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion k/n (95% by default)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def late_triples(run: Any) -> list[tuple[float, float, float] | None]:
    """Per scored sample, the (excess, null variance, tokens) sums of its tokens at draft position >= 2."""
    return [x.get("late_excess") if x.get("late_excess") and x["late_excess"][2] else None
            for x in run.scores or []]


def late_chart_false_alarms(run: Any, shift: float) -> dict[str, Any] | None:
    """The sidecar's late-draft-position chart on this exact stream: false alarms per 1M samples
    (``late_chart_rates`` on the stream's sums; None without late tokens)."""
    import numpy as np

    trip = [t for t in late_triples(run) if t]
    if not trip:
        return None
    s_, v_, n_ = (np.array([t[i] for t in trip], float) for i in range(3))
    sums = {"s": float(s_.sum()), "v": float(v_.sum()), "n": float(n_.sum()), "s2": float((s_ ** 2).sum()),
            "samples": len(run.scores or [])}
    return late_chart_rates(sums, shift)


def late_chart_rates(sums: dict[str, float], shift: float, samples_per_late_token: float | None = None) -> dict[str, Any]:
    """False alarms per 1M samples of ``ConformanceChart(late_shift=shift).late`` on a stream given by its sums.

    As ``sidecar_conformance.false_alarms`` certifies the other two charts: Siegmund's run length for
    Gaussian increments with the stream's per-token mean and sd, at the point estimate and at the 95%
    bound of |mean|, in samples via the stream's late tokens per sample.  Per sample the scorer keeps
    the sums (excess s, null variance v, tokens n) of its late tokens, so x = s / sqrt(vbar) has mean
    sum(s) / n / sqrt(vbar) with vbar = sum(v) / n, and sd^2 = sum(s^2) / sum(v) over samples (1 under
    the null: the sum of a sample's scores is a martingale with that predictable variance).  The sums of
    several exact streams add up (``pool``); ``samples_per_late_token`` overrides the stream's own
    ratio (a pooled certificate uses the richest stream's, the conservative choice)."""
    from sidecar_conformance import siegmund_arl_two_sided

    from quality_sidecar.detectors.conformance_charts import ConformanceChart

    n = sums["n"]
    vbar = sums["v"] / n
    mu = sums["s"] / n / math.sqrt(vbar)
    sd = math.sqrt(sums["s2"] / sums["v"])
    bound = abs(mu) + 1.96 * sd / math.sqrt(n)
    late = ConformanceChart(late_shift=shift).late
    per_sample = n / sums["samples"] if samples_per_late_token is None else 1.0 / samples_per_late_token
    rate = {key: 1e6 * per_sample / siegmund_arl_two_sided(m, d, late.threshold_, late.k_)
            for key, m, d in (("at_mean", mu, sd), ("at_bound95", bound, sd), ("exact_null", 0.0, 1.0))}
    return {"late_tokens": int(n), "samples": int(sums["samples"]), "late_tokens_per_sample": per_sample,
            "x_mean_per_token": mu, "x_sd": sd, "x_mean_abs_bound95": bound,
            **{f"per_1M_samples_{k}": v for k, v in rate.items()},
            "method": "Siegmund ARL for Gaussian increments (late chart's k, h at the default ert_tokens)",
            "sums": sums}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(Path(__file__).resolve().parents[1] / "models" / "demo-code-4l"))
    ap.add_argument("--replicates", type=int, default=8)
    ap.add_argument("--exact", default=EXACT, help="exact decoders (A/A), ';'-separated SPECs")
    ap.add_argument("--faults", default=FAULTS, help="faulty decoders, ';'-separated SPECs")
    ap.add_argument("--samples-per-item", type=int, default=None, help="override the policy's value")
    ap.add_argument("--items-per-task", type=int, default=None, help="a subset of the eval set (default: all of it)")
    ap.add_argument("--out", required=True, help="JSON result file")
    ap.add_argument("--late-shifts", default="0.04,0.1,0.2,0.3",
                    help="late-draft-position chart shifts to compare (samples to alarm on each stream, false alarms "
                         "per 1M samples on the exact ones); the sidecar's default is measured among them")
    ap.add_argument("--cache", default=None, help="directory: keep each decoder's generated samples there (pickle) "
                                                   "and reuse them on a re-run with the same settings")
    args = ap.parse_args()

    import numpy as np
    from gate_power_at_size import excess_power  # this script's directory is on sys.path

    from vllm_lookahead.decoders import parse_spec
    from vllm_lookahead.gate import analysis, criteria
    from vllm_lookahead.gate.checkers import CheckResult
    from vllm_lookahead.gate.engine import EngineOptions, GateEngine, RunResult
    from vllm_lookahead.gate.evalset import DEFAULT_EVAL_SET, load_eval_set
    from vllm_lookahead.gate.policy import load_policy
    from vllm_lookahead.gate.profiles import parse_profiles

    pol = load_policy()
    sp = pol["criteria"]["sampled"]
    if args.samples_per_item:
        sp["samples_per_item"] = args.samples_per_item
    profiles = parse_profiles(sp["profiles"])
    S, R = sp["samples_per_item"], args.replicates
    if S % len(profiles):
        sys.exit(f"samples_per_item {S} is not a multiple of the {len(profiles)} profiles")
    items = load_eval_set(DEFAULT_EVAL_SET, limit=args.items_per_task)
    by_id = {it.id: it for it in items}
    opts = EngineOptions(args.model, "float32", 0, None, 48, kv_cache_gib="2")
    specs = [("baseline none (seed 0)", "none", 0, "baseline")]
    specs += [(f"A/A {s} (seed 1)", s, 1, "exact") for s in args.exact.split(";") if s.strip()]
    specs += [(s.removeprefix(F), s, 1, "fault") for s in args.faults.split(";") if s.strip()]

    runs: dict[str, RunResult] = {}
    wall: dict[str, float] = {}
    cache = Path(args.cache) if args.cache else None
    prof_json = [p.to_json() for p in profiles]
    for label, spec, seed, _ in specs:
        key = cache / (hashlib.sha1(json.dumps([spec, seed, S * R, prof_json, args.model]).encode()).hexdigest()[:12]
                       + ".pkl") if cache else None
        if key is not None and key.exists():
            runs[label], wall[label] = pickle.loads(key.read_bytes())
            print(f"{label}: from {key}", file=sys.stderr)
            continue
        t0 = time.perf_counter()
        with GateEngine(dataclasses.replace(opts, seed=seed), parse_spec(spec)) as eng:
            runs[label] = eng.run_batch(label, items, profiles=profiles, samples=S * R)
        wall[label] = time.perf_counter() - t0
        print(f"{label}: {wall[label]:.0f} s", file=sys.stderr)
        if key is not None:
            key.parent.mkdir(parents=True, exist_ok=True)
            key.write_bytes(pickle.dumps((runs[label], wall[label])))

    scored_key = cache / ("scored-" + hashlib.sha1(json.dumps(
        [[s[1], s[2]] for s in specs] + [S * R, prof_json, args.model]).encode()).hexdigest()[:12] + ".pkl") \
        if cache else None
    if scored_key is not None and scored_key.exists():
        runs, scoring_s, scoring_wall = pickle.loads(scored_key.read_bytes())
        print(f"scores: from {scored_key}", file=sys.stderr)
    else:
        t0 = time.perf_counter()
        with GateEngine(opts, parse_spec("none"), prefix_caching=True) as eng:
            scoring_s = eng.score(list(runs.values()))
        scoring_wall = time.perf_counter() - t0
        if scored_key is not None:
            scored_key.write_bytes(pickle.dumps((runs, scoring_s, scoring_wall)))
    n_samples = sum(len(r.records) for r in runs.values())

    orig_check = analysis.check

    def check(prompt: str, text: str, checker: dict[str, Any]) -> CheckResult:
        if checker["type"] == "python_tests":
            return CheckResult(False, "not run in this benchmark (sandbox cost)")
        return orig_check(prompt, text, checker)

    analysis.check = check
    clfs = analysis.load_classifiers(pol["criteria"]["behaviour"]["classifiers"])
    names = [c.name for c in clfs]

    def replicate(run: RunResult, r: int) -> RunResult:
        assert run.scores is not None
        keep = [i for i, x in enumerate(run.records) if r * S <= x.sample < (r + 1) * S]
        sub = dataclasses.replace(run, records=[dataclasses.replace(run.records[i], sample=run.records[i].sample - r * S)
                                                for i in keep])
        sub.scores = [{**run.scores[i], "sample": run.scores[i]["sample"] - r * S} for i in keep]
        return sub

    def predicted(totals: tuple[float, float, int] | None, m: int) -> dict[str, float] | None:
        """Excess z expected per replicate (all R x S samples' sums / R) and the power it gives."""
        if not totals or totals[1] <= 0:
            return None
        z = (totals[0] / R) / math.sqrt(totals[1] / R)
        return {"nats_per_token": totals[0] / max(1, totals[2]), "tokens_per_replicate": totals[2] / R,
                "z_per_replicate": z, "power_at_alpha_over_m": excess_power(z, sp["alpha"], m)}

    def late_chart_delays(run: RunResult, shift: float, orders: int = 20) -> dict[str, Any]:
        """Samples until the late-draft-position chart (``ConformanceChart(late_shift=shift).late``, the
        sidecar's class) alarms on this stream: the run's order, then ``orders - 1`` random orders.  Each
        sample's late tokens enter as their sums (the chart tests at sample boundaries on the sums)."""
        from quality_sidecar.detectors.conformance_charts import ConformanceChart

        trip = late_triples(run)
        rng = np.random.default_rng(0)
        hits: list[int] = []
        for o in range(orders):
            chart = ConformanceChart(late_shift=shift).late
            for i, j in enumerate(rng.permutation(len(trip)) if o else range(len(trip))):
                t = trip[j]
                if t is None:
                    continue
                n = int(t[2])
                chart.update([(np.full(n, t[0] / n), np.full(n, t[1] / n))])
                if chart.alarm_:
                    hits.append(i + 1)
                    break
        return {"orders": orders, "alarmed": len(hits),
                "median_samples": float(np.median(hits)) if hits else None,
                "p90_samples": float(np.percentile(hits, 90)) if hits else None}

    shifts = [float(x) for x in args.late_shifts.split(",") if x.strip()]

    base = runs[specs[0][0]]
    base_reps = [replicate(base, r) for r in range(R)]
    base_scored = [analysis._score(by_id, b, clfs) for b in base_reps]
    allb = analysis._conformance(base)
    results: dict[str, Any] = {}
    for label, spec, _, kind in specs[1:]:
        reps = []
        for r in range(R):
            c = replicate(runs[label], r)
            smp = analysis._sampled(base_scored[r], analysis._score(by_id, c, clfs), base_reps[r], c, sp,
                                    pol["multiple_testing"], names)
            minp, ok = criteria.sampled_passes(smp, sp["alpha"])
            conf = smp["conformance"]
            reps.append({"verdict": "PASS" if ok else "FAIL", "min_p_adjusted": minp,
                         "rejected": sorted(k for k, p in smp["p_adjusted"].items() if p < sp["alpha"]),
                         "out_of_support": conf["out_of_support"], "p_adjusted": smp["p_adjusted"],
                         "excess_candidate": conf["excess_candidate"]["nats_per_token"],
                         "excess_late_draft": (conf.get("excess_late_draft") or {}).get("nats_per_token"),
                         "duplicate_samples": smp["rates"]["duplicate_samples"]})
        allc = analysis._conformance(runs[label])
        fails = sum(x["verdict"] == "FAIL" for x in reps)
        m = max(len(x["p_adjusted"]) for x in reps)
        ntok = max(1, allc["n_tokens"])
        results[label] = {
            "spec": spec, "kind": kind, "fails": fails, "replicates": R, "fail_fraction": fails / R,
            "fail_fraction_wilson95": wilson(fails, R),
            "size_all_samples": {
                "excess_nats_per_token": predicted(allc["excess"], m),
                "excess_late_draft": predicted(allc["late_excess"], m),
                "excess_per_profile": [{k: p[k] for k in ("profile", "tokens", "excess_nats_per_token")}
                                       for p in allc["profiles"]],
                "out_of_support_per_1k_tokens": {"candidate": 1000 * allc["out_of_support"] / ntok,
                                                 "baseline": 1000 * allb["out_of_support"] / max(1, allb["n_tokens"])},
                "out_of_support_reasons": allc["out_of_support_reasons"],
                "duplicate_samples_per_replicate": float(np.mean([x["duplicate_samples"]["candidate"] for x in reps]))},
            "rejected_tests_count": {k: sum(k in x["rejected"] for x in reps)
                                     for k in sorted({t for x in reps for t in x["rejected"]})},
            "late_chart_by_shift": {str(sh): {"samples_to_alarm": late_chart_delays(runs[label], sh),
                                              "false_alarms": (late_chart_false_alarms(runs[label], sh)
                                                               if kind == "exact" else None)} for sh in shifts},
            "oos_fails": sum(x["out_of_support"]["candidate"] > x["out_of_support"]["baseline"] for x in reps),
            "engine_wall_s": wall[label], "per_replicate": reps}
        print(f"{label}: FAIL {fails}/{R}", file=sys.stderr)

    aa = [v for v in results.values() if v["kind"] == "exact"]
    out = {
        "command": "python " + " ".join(sys.argv),
        "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpu_count": os.cpu_count(), "note": "2-core machine shared with other jobs; timings are upper bounds"},
        "model": args.model, "eval_set": str(DEFAULT_EVAL_SET), "n_items": len(items),
        "samples_per_item": S, "profiles": [p.label for p in profiles], "alpha": sp["alpha"],
        "multiple_testing": pol["multiple_testing"], "replicates": R,
        "design": "one engine run per decoder with samples_per_item x replicates samples; replicate r = samples "
                  "[r S, (r+1) S), paired with the baseline's replicate r; candidates at engine seed 1, baseline "
                  "seed 0; one scoring engine for all runs; unit_tests checker not run (pass = false in both arms)",
        "aa_false_fails": {"fails": sum(v["fails"] for v in aa), "decisions": sum(v["replicates"] for v in aa)},
        "baseline_out_of_support": allb["out_of_support"],
        "scoring": {"samples": n_samples, "seconds": scoring_s, "engine_wall_s": scoring_wall,
                    "ms_per_sample": 1000 * scoring_s / max(1, n_samples)},
        "results": results,
    }
    Path(args.out).write_text(json.dumps(out, indent=1, default=float))
    print(f"wrote {args.out}: A/A false FAILs {out['aa_false_fails']}", file=sys.stderr)


if __name__ == "__main__":
    main()
