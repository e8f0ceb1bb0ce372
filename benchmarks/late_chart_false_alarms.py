"""False alarms of the sidecar's late-draft-position chart on long exact streams.

The chart sees only tokens committed at draft position >= 2: about 0.1 per sample at the gate's
sampling profiles, on the gate's eval set and on held-out copy prompts alike (how many depends on how
much the drafter drafts, so on the batch and on the machine's load).  The 95% bound of a stream's
per-token drift narrows with the square root of their number, so certifying <= 1 false alarm per 1M
samples takes ~10k samples or more (``--n`` x ``--samples``), in one stream or several pooled.  A
rate per sample scales with the late tokens per sample (more chances to alarm per sample).

One engine run of the exact decoder (default ``lookahead:k=8``) draws ``--samples`` samples per prompt
with the gate's default sampling profiles; one scoring engine (no speculation) scores them; then
``gate_conformance_power.late_chart_false_alarms`` (Siegmund's run length at the drift's point
estimate and at its 95% bound) at each ``--late-shifts`` value.

    python benchmarks/late_chart_false_alarms.py --n 400 --samples 24 \\
        --out benchmarks/results/late_chart_false_alarms_copy.json

Independent exact streams of the same decoder add up: ``--pool A.json B.json ...`` writes the chart's
rates on the union of their late tokens (from each file's sums; no engine), in samples at the
richest stream's late tokens per sample (the conservative choice: more chances to alarm per sample).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(Path(__file__).resolve().parents[1] / "models" / "demo-code-4l"))
    ap.add_argument("--spec", default="lookahead:k=8", help="the exact decoder (default: the README's)")
    ap.add_argument("--prompts", default="copy", help="held-out prompt kind: copy | open | mixed (default copy)")
    ap.add_argument("--n", type=int, default=400, help="prompts (default 400)")
    ap.add_argument("--samples", type=int, default=6, help="samples per prompt, cycling through the profiles")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--late-shifts", default="0.2", help="late chart shifts (default: the sidecar's 0.2)")
    ap.add_argument("--pool", nargs="+", type=Path, default=None, metavar="JSON",
                    help="no run: pool these result files' late tokens (independent exact streams)")
    ap.add_argument("--out", required=True, type=Path, help="JSON result file")
    args = ap.parse_args()
    if args.pool:
        return pool(args.pool, args.out)

    # this script's directory is on sys.path
    from gate_conformance_power import late_chart_false_alarms

    from quality_sidecar.baseline_scoring import ConformanceConfig
    from vllm_lookahead.decoders import parse_spec
    from vllm_lookahead.gate.engine import EngineOptions, GateEngine
    from vllm_lookahead.gate.evalset import EvalItem
    from vllm_lookahead.gate.policy import load_policy
    from vllm_lookahead.gate.profiles import parse_profiles
    from vllm_lookahead.prompts import load_heldout_prompts

    profiles = parse_profiles(load_policy()["criteria"]["sampled"]["profiles"])
    prompts = load_heldout_prompts(args.n, args.prompts, seed=args.seed)
    items = [EvalItem(f"{args.prompts}-{i}", args.prompts, p, {"type": "python_syntax"}, max_tokens=args.max_tokens)
             for i, p in enumerate(prompts)]
    opts = EngineOptions(args.model, "float32", args.seed, 2048, args.max_tokens, kv_cache_gib="2")
    t0 = time.perf_counter()
    with GateEngine(opts, parse_spec(args.spec)) as eng:
        run = eng.run_batch("exact", items, profiles=profiles, samples=args.samples)
    gen_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with GateEngine(opts, parse_spec("none"), prefix_caching=True) as eng:
        eng.score([run])
    score_s = time.perf_counter() - t0
    tokens = sum(len(r.token_ids) for r in run.records)
    by_shift = {str(sh): late_chart_false_alarms(run, float(sh)) for sh in args.late_shifts.split(",") if sh.strip()}
    out = {
        "command": "python " + " ".join(sys.argv),
        "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpu_count": os.cpu_count(), "note": "2-core machine; timings are upper bounds"},
        "model": args.model, "decoder": args.spec, "prompts": f"{len(prompts)} held-out {args.prompts} prompts",
        "n_prompts": len(prompts), "samples_per_prompt": args.samples, "bound_confidence_percent": 95,
        "profiles": [p.label for p in profiles], "max_tokens": args.max_tokens,
        "samples": len(run.records), "tokens": tokens,
        "scoring_check_max_abs_logprob_diff": run.scoring_check,
        "sidecar_default_late_shift": ConformanceConfig().late_shift,
        "generation_wall_s": gen_s, "scoring_wall_s": score_s,
        "late_chart": by_shift,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, default=float) + "\n")
    report(by_shift)
    print(f"wrote {args.out}", file=sys.stderr)


def pool(files: list[Path], out_path: Path) -> None:
    """The late chart's rates on the union of several exact streams' late tokens (their sums add)."""
    from gate_conformance_power import late_chart_rates  # this script's directory is on sys.path

    from quality_sidecar.baseline_scoring import ConformanceConfig

    runs = [json.loads(f.read_text()) for f in files]
    decoders = {r["decoder"] for r in runs}
    if len(decoders) != 1:
        sys.exit(f"--pool: one decoder's streams only, got {sorted(decoders)}")
    shifts = sorted(set.intersection(*(set(r["late_chart"]) for r in runs)), key=float)
    if not shifts:
        sys.exit("--pool: the files share no late shift")
    by_shift = {}
    for sh in shifts:
        parts = [r["late_chart"][sh]["sums"] for r in runs]
        sums = {k: sum(p[k] for p in parts) for k in ("s", "v", "n", "s2", "samples")}
        richest = max(p["n"] / p["samples"] for p in parts)
        by_shift[sh] = late_chart_rates(sums, float(sh), samples_per_late_token=1.0 / richest)
    out = {
        "command": "python " + " ".join(sys.argv),
        "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "pooled_files": [str(f) for f in files], "decoder": decoders.pop(),
        "streams": [{"file": str(f), "prompts": r["prompts"], "samples": r["samples"], "tokens": r["tokens"],
                     "profiles": r["profiles"]} for f, r in zip(files, runs)],
        "samples": sum(r["samples"] for r in runs), "tokens": sum(r["tokens"] for r in runs),
        "bound_confidence_percent": 95, "sidecar_default_late_shift": ConformanceConfig().late_shift,
        "late_tokens_per_sample_note": "rates per sample at the richest stream's late tokens per sample",
        "late_chart": by_shift,
    }
    out_path.write_text(json.dumps(out, indent=1, default=float) + "\n")
    report(by_shift)
    print(f"wrote {out_path}", file=sys.stderr)


def report(by_shift: dict) -> None:
    for sh, r in by_shift.items():
        if r:
            print(f"late shift {sh}: {r['late_tokens']} late tokens in {r['samples']} samples; drift "
                  f"{r['x_mean_per_token']:+.4f} sd/token (95% bound {r['x_mean_abs_bound95']:.4f}); false alarms per "
                  f"1M samples {r['per_1M_samples_at_mean']:.3g} at the drift, {r['per_1M_samples_at_bound95']:.3g} "
                  "at its 95% bound", file=sys.stderr)


if __name__ == "__main__":
    main()
