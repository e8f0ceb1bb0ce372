"""Impossible tokens on real vLLM streams: exact decoders give none, a decoder that ignores top-p / top-k
at its draft positions alarms the sidecar within a few samples.

On the demo model, held-out open prompts, one production-like sampler (default T=1, top-p 0.9,
top-k 50), each arm's samples are scored as the sidecar scores them (top-K prompt log-probs of a
no-speculation engine, ``score_topk``) and as the gate does (full rows, ``score_full``); the impossible
tokens of each are counted by the parameter that excludes them.  For every faulty arm the sidecar's
``ImpossibleTokenChart`` is run on streams that interleave it 1:1 with the ``none`` arm (the baseline
arm of a canary) and score a fraction (default: all, the sidecar's default) of each: the number of candidate
samples *in the stream* to the first alarm, median and p90 over random orders.  Every exact arm gets
the same chart against the ``none`` arm's control: alarms there are false alarms.  The sidecar's
``RepeatChart`` (samples of one prompt repeating) runs on the same 1:1 streams (every prompt is sampled
``--samples-per-prompt`` times).

    python benchmarks/impossible_tokens.py --json benchmarks/results/impossible_tokens.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout first: tests.faults, tests.support (CONTRIBUTING.md)

FAULTY = "custom:tests.faults."
DEFAULT_ARMS = [
    "none=none",
    "lookahead=lookahead:k=8",
    "top_p_ignored=" + FAULTY + "IgnoreTruncationProposer:k=4,param=top_p",
    "top_k_ignored=" + FAULTY + "IgnoreTruncationProposer:k=4,param=top_k",
    "reused_rng=" + FAULTY + "ReusedRandomnessProposer:k=4",
]


def first_alarms(cand: list[dict], base: list[dict], fraction: float, n_streams: int, seed: int) -> dict[str, Any]:
    """Candidate samples (in the stream, before the ``fraction`` selection) to the first alarm of a
    fresh ``ImpossibleTokenChart`` fed the selected samples of a 1:1 baseline/candidate stream."""
    from quality_sidecar.baseline_scoring import IMPOSSIBLE_ALPHA, ConformanceConfig
    from quality_sidecar.detectors.conformance_charts import ImpossibleTokenChart

    floor = ConformanceConfig().impossible_floor_per_token
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_streams):
        chart = ImpossibleTokenChart(IMPOSSIBLE_ALPHA, floor)
        ci, bi = rng.permutation(len(cand)), rng.permutation(len(base))
        first = math.inf
        for j in range(min(len(ci), len(bi))):
            if rng.random() < fraction:
                b = base[bi[j]]
                chart.update("baseline", b["n"], b["reasons"])
            if rng.random() < fraction:
                c = cand[ci[j]]
                if chart.update("candidate", c["n"], c["reasons"]).alarm_new:
                    first = j + 1
                    break
        out.append(first)
    d = np.array(out, float)
    return {"median_candidate_samples_to_alarm": float(np.median(d)), "p90": float(np.quantile(d, 0.9)),
            "alarmed_streams": int(np.isfinite(d).sum()), "streams": n_streams,
            "horizon_candidate_samples": min(len(cand), len(base)), "fraction_scored": fraction}


def repeat_alarms(cand: list[dict], base: list[dict], n_streams: int, seed: int) -> dict[str, Any]:
    """The sidecar's ``RepeatChart`` on 1:1 streams of the two arms in random orders: candidate samples
    to the first ``repeated_samples`` alarm (inf: none), and the repeat rates it saw."""
    from quality_sidecar.detectors.repeats import RepeatChart

    rng = np.random.default_rng(seed)
    firsts, rates = [], []
    for _ in range(n_streams):
        chart = RepeatChart()
        ci, bi = rng.permutation(len(cand)), rng.permutation(len(base))
        first = math.inf
        for j in range(min(len(ci), len(bi))):
            b, c = base[bi[j]], cand[ci[j]]
            chart.update("baseline", b["prompt_key"], b["output_key"])
            r = chart.update("candidate", c["prompt_key"], c["output_key"])
            if r.alarm_new and first == math.inf:
                first = j + 1
        firsts.append(first)
        a = chart.arms
        rates.append([a[x]["repeats"] / max(1, a[x]["comparisons"]) for x in ("baseline", "candidate")])
    d = np.array(firsts, float)
    return {"median_candidate_samples_to_alarm": float(np.median(d)), "alarmed_streams": int(np.isfinite(d).sum()),
            "streams": n_streams, "repeat_rate_baseline": float(np.mean([x[0] for x in rates])),
            "repeat_rate_candidate": float(np.mean([x[1] for x in rates]))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model dir (default: the demo model)")
    ap.add_argument("--prompts", type=int, default=800, help="held-out open prompts")
    ap.add_argument("--samples-per-prompt", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--top-k", type=int, default=50)
    ap.add_argument("--batch", type=int, default=32, help="max_num_seqs of the sampling engines")
    ap.add_argument("--top-logprobs", type=int, default=20, help="K of the sidecar's scorer")
    ap.add_argument("--fraction", type=float, default=1.0, help="share of each arm the sidecar scores (its default)")
    ap.add_argument("--streams", type=int, default=200, help="random orders per faulty arm")
    ap.add_argument("--arms", default=";".join(DEFAULT_ARMS), help="name=spec[@dtype];...")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=".bench-work/impossible")
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)

    sys.path.insert(0, str(Path(__file__).parent))
    from sidecar_conformance import generate, parse_arm, score

    from quality_sidecar.detectors.conformance_scoring import SamplerParams, score_topk
    from vllm_lookahead.decoders import DEMO_MODEL
    from vllm_lookahead.prompts import load_heldout_prompts

    model = args.model or str(DEMO_MODEL)
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    prompts = load_heldout_prompts(args.prompts, "open", seed=3)
    params = SamplerParams(args.temperature, top_k=args.top_k, top_p=args.top_p)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    arms: dict[str, Any] = {}
    per_sample: dict[str, list[dict]] = {}
    t_all = time.time()
    for name, spec, dtype in (parse_arm(a) for a in args.arms.split(";") if a.strip()):
        key = hashlib.sha1(json.dumps([spec, dtype, args.prompts, args.samples_per_prompt, args.max_tokens,
                                       args.temperature, args.top_p, args.top_k, args.top_logprobs, args.seed,
                                       model]).encode()).hexdigest()[:12]
        cache = work / f"{name}-{key}.json"
        if cache.exists():
            rows = json.loads(cache.read_text())
        else:
            t0 = time.time()
            rows = generate(model, spec, dtype, prompts, args)
            rows = score(model, dtype, rows, args.top_logprobs, params, full_oos=True)
            print(f"[{name}] generated and scored in {time.time() - t0:.0f} s", file=sys.stderr)
            cache.write_text(json.dumps(rows))
        rng = np.random.default_rng(args.seed)
        topk_reasons: dict[str, int] = {}
        full_reasons: dict[str, int] = {}
        samples, tokens = [], 0
        for r in rows:
            if not r["output_ids"]:
                continue
            s = score_topk(np.array(r["top_ids"]), np.array(r["top_lp"], float), r["output_ids"], r["tok_lp"],
                           params, rng, vocab_size=vocab)
            for acc, reasons in ((topk_reasons, s.oos_reasons), (full_reasons, r["full_oos"])):
                for k, v in reasons.items():
                    acc[k] = acc.get(k, 0) + v
            samples.append({"n": s.n_tokens, "reasons": s.oos_reasons, "prompt_key": str(r["prompt_index"]),
                            "output_key": repr(r["output_ids"])})
            tokens += s.n_tokens
        per_sample[name] = samples
        arms[name] = {"spec": spec, "dtype": dtype, "samples": len(samples), "tokens": tokens,
                      "impossible_tokens_sidecar_topk": sum(topk_reasons.values()),
                      "impossible_by_reason_sidecar_topk": topk_reasons,
                      "impossible_tokens_gate_full_rows": sum(full_reasons.values()),
                      "impossible_by_reason_gate_full_rows": full_reasons,
                      "impossible_per_token_full_rows": sum(full_reasons.values()) / max(1, tokens)}
    base = per_sample.get("none")
    if base is not None:
        for name, samples in per_sample.items():
            if name != "none":
                arms[name]["sidecar_chart_vs_none"] = first_alarms(samples, base, args.fraction, args.streams,
                                                                   args.seed)
                arms[name]["repeated_samples_vs_none"] = repeat_alarms(samples, base, 20, args.seed)
    out = {"command": shlex.join(["python", "benchmarks/impossible_tokens.py", *(sys.argv[1:] if argv is None else argv)]),
           "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "model": model,
           "sampler": {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k},
           "prompts": args.prompts, "samples_per_prompt": args.samples_per_prompt, "max_tokens": args.max_tokens,
           "top_logprobs": args.top_logprobs, "wall_s": time.time() - t_all, "arms": arms}
    Path(args.json).write_text(json.dumps(out, indent=1))
    for name, a in arms.items():
        ch = a.get("sidecar_chart_vs_none") or {}
        print(f"{name:16s} {a['tokens']:>8d} tokens  impossible: sidecar {a['impossible_tokens_sidecar_topk']:>6d}  "
              f"gate {a['impossible_tokens_gate_full_rows']:>6d}  "
              f"first alarm (candidate samples): median {ch.get('median_candidate_samples_to_alarm', '-')}, "
              f"p90 {ch.get('p90', '-')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
