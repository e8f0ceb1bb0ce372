"""Power of the gate's T>0 check against faults that change only sampled outputs, and its A/A
false-FAIL rate for exact decoders (issue 13).

Design (CPU is scarce): every decoder's engine runs ONCE, drawing ``samples_per_item x R`` samples per
item of the default eval set at the policy's temperature; sample indices [r S, (r+1) S) form
replicate r, i.e. one gate's worth of T>0 samples (S = the policy's samples_per_item).  The samples of
one run are independent draws, so the R replicates are R independent gate decisions per decoder.
The baseline (``none``, seed 0) runs once and its replicate r is the baseline arm of every
candidate's replicate r; every candidate runs with engine seed 1 (so ``none`` vs ``none`` is a true
A/A).  ONE scoring engine (no speculation, prefix caching) scores every run.  The ``sampled``
criterion is then computed exactly as the gate does (``analysis._sampled`` + ``sampled_passes``),
except that the ``unit_tests`` checker (a sandboxed subprocess per sample) counts as not passed in
both arms, to save ~1 s per sample; its Fisher p-value is still one of the Holm-adjusted family.

    python benchmarks/gate_conformance_power.py --replicates 5 --out benchmarks/results/gate_conformance_power.json
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

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

FAULTY = "custom:vllm_lookahead.gate.faulty."


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(Path(__file__).resolve().parents[1] / "models" / "demo-code-4l"))
    ap.add_argument("--replicates", type=int, default=5)
    ap.add_argument("--factors", default="0.7,0.8,0.9,0.95,1.1,1.25")
    ap.add_argument("--exact", default="none,lookahead:k=4",
                    help="exact decoders (A/A): comma-separated specs, or ';'-separated when a spec has commas "
                         "(\"lookahead:k=4,policy=chain;none\")")
    ap.add_argument("--real-bug", type=int, default=1, help="include OriginalExpandKernelProposer (1/0)")
    ap.add_argument("--samples-per-item", type=int, default=None, help="override the policy's value")
    ap.add_argument("--out", default="benchmarks/results/gate_conformance_power.json")
    ap.add_argument("--cache", default=None, help="directory: keep each decoder's generated samples there (pickle) "
                                                   "and reuse them on a re-run with the same settings")
    args = ap.parse_args()

    import numpy as np

    from vllm_lookahead.decoders import parse_spec
    from vllm_lookahead.gate import analysis
    from vllm_lookahead.gate.checkers import CheckResult
    from vllm_lookahead.gate.engine import EngineOptions, GateEngine, RunResult
    from vllm_lookahead.gate.evalset import DEFAULT_EVAL_SET, load_eval_set
    from vllm_lookahead.gate.policy import load_policy

    pol = load_policy()
    sp = pol["criteria"]["sampled"]
    if args.samples_per_item:
        sp["samples_per_item"] = args.samples_per_item
    S, R, T = sp["samples_per_item"], args.replicates, sp["temperature"]
    items = load_eval_set(DEFAULT_EVAL_SET)
    by_id = {it.id: it for it in items}
    opts = EngineOptions(args.model, "float32", 0, None, 48)
    specs = [("baseline none (seed 0)", "none", 0)]
    specs += [(f"A/A {s} (seed 1)", s, 1) for s in args.exact.split(";" if ";" in args.exact else ",") if s]
    specs += [(f"DraftTemperature factor={f}", FAULTY + f"DraftTemperatureProposer:k=4,factor={f}", 1)
              for f in args.factors.split(",") if f]
    specs += [("real bug: original CPU expand kernel", FAULTY + "OriginalExpandKernelProposer:k=4", 1)] if args.real_bug else []

    runs: dict[str, RunResult] = {}
    wall: dict[str, float] = {}
    cache = Path(args.cache) if args.cache else None
    for label, spec, seed in specs:
        key = cache / (hashlib.sha1(json.dumps([label, spec, seed, S * R, T, args.model]).encode()).hexdigest()[:12]
                       + ".pkl") if cache else None
        if key is not None and key.exists():
            runs[label], wall[label] = pickle.loads(key.read_bytes())
            print(f"{label}: from {key}", file=sys.stderr)
            continue
        t0 = time.perf_counter()
        with GateEngine(dataclasses.replace(opts, seed=seed), parse_spec(spec)) as eng:
            runs[label] = eng.run_batch(label, items, temperature=T, samples=S * R)
        wall[label] = time.perf_counter() - t0
        print(f"{label}: {wall[label]:.0f} s", file=sys.stderr)
        if key is not None:
            key.parent.mkdir(parents=True, exist_ok=True)
            key.write_bytes(pickle.dumps((runs[label], wall[label])))

    t0 = time.perf_counter()
    with GateEngine(opts, parse_spec("none"), prefix_caching=True) as eng:
        scoring_s = eng.score(list(runs.values()), T)
    scoring_wall = time.perf_counter() - t0
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
        keep = [i for i, x in enumerate(run.records) if r * S <= x.sample < (r + 1) * S]
        sub = dataclasses.replace(run, records=[dataclasses.replace(run.records[i], sample=run.records[i].sample - r * S)
                                                for i in keep])
        sub.scores = [{**run.scores[i], "sample": run.scores[i]["sample"] - r * S} for i in keep]
        sub.scoring_s = run.scoring_s
        return sub

    base = runs["baseline none (seed 0)"]
    base_reps = [replicate(base, r) for r in range(R)]
    base_scored = [analysis._score(by_id, b, clfs) for b in base_reps]
    results: dict[str, Any] = {}
    for label, spec, _ in specs[1:]:
        reps = []
        for r in range(R):
            c = replicate(runs[label], r)
            smp = analysis._sampled(base_scored[r], analysis._score(by_id, c, clfs), base_reps[r], c, sp,
                                    pol["multiple_testing"], names)
            minp, ok = analysis.sampled_passes(smp, sp["alpha"])
            conf = smp["conformance"]
            reps.append({"verdict": "PASS" if ok else "FAIL", "min_p_adjusted": minp,
                         "p_adjusted": smp["p_adjusted"], "shift": conf["shift"],
                         "mean_token_logprob": conf["mean_token_logprob"], "mean_pit": conf["mean_pit"],
                         "pit_baseline_control_p": conf["pit_baseline_control"]["p_value"],
                         "excess_candidate": conf["excess_candidate"],
                         "excess_baseline_control_p": conf["excess_baseline_control"]["p_value"],
                         "out_of_support": conf["out_of_support"]})
        # effect on all R x S samples at once: the best estimate of the fault's mean-log-prob shift
        allc = analysis._conformance(runs[label])
        allb = analysis._conformance(base)
        from quality_sidecar.detectors.conformance import likelihood_shift

        sh = likelihood_shift(allb["by_item"], allc["by_item"])
        fails = sum(x["verdict"] == "FAIL" for x in reps)
        # the excess test's power predicted from all R x S samples: per replicate z ~ N(mu n / sd, 1),
        # rejected at Holm's strictest step (alpha / m), i.e. a lower bound on its own contribution
        from gate_power_at_size import excess_power  # this script's directory is on sys.path

        ex_sum, ex_var, ex_n = allc["excess"]
        z_mean = (ex_sum / R) / math.sqrt(ex_var / R) if ex_var > 0 else 0.0
        predicted = excess_power(z_mean, sp["alpha"], len(reps[0]["p_adjusted"]))
        results[label] = {
            "spec": spec, "fail_fraction": fails / R, "fails": fails, "replicates": R,
            "shift_nats_per_token_all_samples": {"effect": sh.effect, "ci_low": sh.ci_low, "ci_high": sh.ci_high},
            "mean_pit_all_samples": allc["mean_pit"],
            "excess_nats_per_token_all_samples": ex_sum / max(1, ex_n),
            "excess_z_per_replicate_expected": z_mean,
            "excess_test_power_predicted_at_alpha_over_m": predicted,
            "excess_fail_fraction": sum(x["p_adjusted"]["excess_candidate_z"] < sp["alpha"] for x in reps) / R,
            "median_p_adjusted": {k: float(np.median([x["p_adjusted"][k] for x in reps]))
                                  for k in reps[0]["p_adjusted"]},
            "engine_wall_s": wall[label], "per_replicate": reps}
        print(f"{label}: FAIL {fails}/{R}, shift {sh.effect:+.4f} nats/token", file=sys.stderr)

    out = {
        "command": "python " + " ".join(sys.argv),
        "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpu_count": os.cpu_count(), "note": "2-core machine shared with other jobs; timings are upper bounds"},
        "model": args.model, "eval_set": str(DEFAULT_EVAL_SET), "n_items": len(items),
        "samples_per_item": S, "temperature": T, "alpha": sp["alpha"], "multiple_testing": pol["multiple_testing"],
        "replicates": R,
        "design": "one engine run per decoder with samples_per_item x replicates samples; replicate r = samples "
                  "[r S, (r+1) S), paired with the baseline's replicate r; candidates at engine seed 1, baseline "
                  "seed 0; one scoring engine for all runs; unit_tests checker not run (pass = false in both arms)",
        "baseline_mean_token_logprob": analysis._conformance(base)["mean_token_logprob"],
        "scoring": {"samples": n_samples, "seconds": scoring_s, "engine_wall_s": scoring_wall,
                    "ms_per_sample": 1000 * scoring_s / max(1, n_samples),
                    "max_row_vs_vllm_logprob_diff": max(r.scoring_check or 0 for r in runs.values())},
        "results": results,
    }
    Path(args.out).write_text(json.dumps(out, indent=1, default=float))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
