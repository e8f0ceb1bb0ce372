"""Sampling-conformance detection power and false alarms on real vLLM streams (issue 13).

What it measures, on the demo model with held-out prompts at T > 0, through the same top-K scoring a
baseline vLLM server answers (``prompt_logprobs=K``, K = 20 by default = vLLM's ``max_logprobs``):
  1. real samples from exact decoders (no speculation, lookahead chain, lookahead 2D; float32 and
     bfloat16) and from faulty decoders of the T>0-only class (``tests.faults``: the
     temperature of draft positions scaled; vLLM's original CPU expand kernel, the real bug);
  2. each stream scored under the baseline model (a separate no-speculation engine of the stream's
     dtype: the sampler and the scorer are different engines, as in production);
  3. per stream: the fault size as the mean excess log-prob per token (log p(y) - E_sampler[log p],
     0 under exact sampling; from full rows, a low-variance estimate), the mean token log-prob and its
     shift vs the float32 no-speculation stream (paired by prompt; noisy), PIT statistics
     (Anderson-Darling p of all tokens), tokens skipped by top-K coarsening;
  4. the sidecar's chart (``ConformanceChart``: the PIT and the excess charts, with the sidecar's default ERT and shift) on streams resampled
     from the real scored samples: samples to the first alarm (median, p90 over bootstrap orders) for
     every faulty stream; for every exact stream the alarms on the recorded stream and false alarms
     per 1M samples from the measured per-token drift (see ``false_alarms``).

    python benchmarks/sidecar_conformance.py --json benchmarks/results/sidecar_conformance.json

Generation and scoring results are cached in --work (per arm and settings), so a re-run only redoes
the statistics.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout first: tests.faults, tests.support (CONTRIBUTING.md)

DEFAULT_ARMS = [
    "none=none",
    "lookahead=lookahead:k=4",
    "lookahead2d=lookahead2d:W=5,N=3,G=5",
    "none_bf16=none@bfloat16",
    "lookahead_bf16=lookahead:k=4@bfloat16",
    "draft_temp_0.95=custom:tests.faults.DraftTemperatureProposer:k=4,factor=0.95",
    "draft_temp_0.9=custom:tests.faults.DraftTemperatureProposer:k=4,factor=0.9",
    "draft_temp_0.8=custom:tests.faults.DraftTemperatureProposer:k=4,factor=0.8",
    "draft_temp_0.7=custom:tests.faults.DraftTemperatureProposer:k=4,factor=0.7",
    "draft_temp_1.25=custom:tests.faults.DraftTemperatureProposer:k=4,factor=1.25",
    "expand_bug_ngram=custom:tests.faults.OriginalExpandKernelProposer:k=4",
]


def parse_arm(text: str) -> tuple[str, str, str]:
    name, _, rest = text.partition("=")
    spec, _, dtype = rest.partition("@")
    return name, spec, dtype or "float32"


def _close(llm: Any) -> None:
    with contextlib.suppress(Exception):  # best effort
        llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def generate(model: str, spec_text: str, dtype: str, prompts: list[str], args: argparse.Namespace) -> list[dict]:
    from vllm import SamplingParams

    from vllm_lookahead.decoders import parse_spec
    from vllm_lookahead.engine import make_llm

    llm = make_llm(model, parse_spec(spec_text), dtype=dtype, seed=args.seed, max_model_len=1024,
                   max_num_seqs=args.batch)
    sp = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=getattr(args, "top_k", 0) or 0,
                        max_tokens=args.max_tokens)
    jobs = [p for _ in range(args.samples_per_prompt) for p in prompts]
    outs = llm.generate(jobs, sp)
    rows = [{"prompt_index": i % len(prompts), "prompt_ids": list(o.prompt_token_ids),
             "output_ids": list(o.outputs[0].token_ids), "finish_reason": o.outputs[0].finish_reason}
            for i, o in enumerate(outs)]
    _close(llm)
    return rows


def score(model: str, dtype: str, rows: list[dict], k: int, params: Any, llm: Any = None,
          full_oos: bool = False) -> list[dict]:
    """Top-K raw log-probs of every output position, from a no-speculation engine (prompt_logprobs),
    and, from the full rows of the same pass (``vllm_lookahead.vllm.prompt_scores``), each token's
    excess log-prob (log p(y) - E_sampler[log p]: the fault size in nats/token, see
    ``detectors.conformance_scoring.excess_logprob``).  The sidecar itself only ever sees the top K.  With
    ``full_oos`` each row also gets ``full_oos``: its impossible tokens by reason from the full rows
    (what the in-process gate sees)."""
    from vllm import SamplingParams

    from quality_sidecar.detectors.conformance_scoring import excess_logprob
    from vllm_lookahead.decoders import parse_spec
    from vllm_lookahead.engine import make_llm
    from vllm_lookahead.vllm.prompt_scores import scoring

    own = llm is None
    if own:
        llm = make_llm(model, parse_spec("none"), dtype=dtype, seed=0, max_model_len=1024, max_num_seqs=32,
                       extra={"max_logprobs": max(20, k)})
    sp = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=k)
    todo = [r for r in rows if r["output_ids"]]
    outs = []
    for c0 in range(0, len(todo), 128):  # bounded memory: 128 samples of full rows at a time
        part = todo[c0:c0 + 128]
        want = {tuple(r["prompt_ids"] + r["output_ids"]): len(r["output_ids"]) for r in part}
        with scoring(want) as stash:
            outs += llm.generate([{"prompt_token_ids": r["prompt_ids"] + r["output_ids"]} for r in part], sp,
                                 use_tqdm=False)
            for r in part:
                full = stash[tuple(r["prompt_ids"] + r["output_ids"])]
                r["excess"] = excess_logprob(full, r["output_ids"], params).tolist()
                if full_oos:
                    from quality_sidecar.detectors.conformance_scoring import score_full

                    r["full_oos"] = score_full(full, r["output_ids"], params, np.random.default_rng(0)).oos_reasons
    for r, o in zip(todo, outs):
        n_out = len(r["output_ids"])
        plp = o.prompt_logprobs[-n_out:]
        top_ids, top_lp, tok_lp = [], [], []
        for tok, d in zip(r["output_ids"], plp):
            items = sorted(d.items(), key=lambda kv: kv[1].rank)
            tops = [(t, lp.logprob) for t, lp in items if lp.rank <= k][:k]
            top_ids.append([t for t, _ in tops] + [-1] * (k - len(tops)))
            top_lp.append([v for _, v in tops] + [-math.inf] * (k - len(tops)))
            tok_lp.append(d[tok].logprob)
        r["top_ids"], r["top_lp"], r["tok_lp"] = top_ids, top_lp, tok_lp
    if own:
        _close(llm)
    return rows


def conformance(rows: list[dict], temperature: float, top_p: float, vocab: int, seed: int) -> dict[str, Any]:
    from quality_sidecar.detectors.conformance_scoring import SamplerParams, score_topk

    params = SamplerParams(temperature, top_p=top_p)
    rng = np.random.default_rng(seed)
    per = []
    for r in rows:
        if not r["output_ids"]:
            continue
        s = score_topk(np.array(r["top_ids"]), np.array(r["top_lp"], float), r["output_ids"], r["tok_lp"],
                       params, rng, vocab_size=vocab)
        per.append({"prompt_index": r["prompt_index"], "mean_lp": s.mean_logprob, "excess": r.get("excess", []),
                    "pit": s.pit, "n": s.n_tokens, "skipped": s.skipped, "oos": s.out_of_support,
                    "finish": r["finish_reason"], "score": s})
    return {"samples": per}


def _excess_summary(per: list[dict]) -> dict[str, Any]:
    """Fault size: mean excess log-prob per token (0 under exact sampling), with a 95% CI from a
    bootstrap over samples (tokens of one sample are not independent)."""
    ex = [np.asarray(p["excess"], float) for p in per if len(p["excess"])]
    if not ex:
        return {}
    sums, counts = np.array([e.sum() for e in ex]), np.array([len(e) for e in ex], float)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, len(ex), size=(2000, len(ex)))
    boot = sums[idx].sum(axis=1) / counts[idx].sum(axis=1)
    return {"excess_logprob_nats_per_token": float(sums.sum() / counts.sum()),
            "excess_logprob_ci95": [float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))]}


def bootstrap_delay(scores: list[Any], chart_kw: dict, n_streams: int, limit: int, seed: int) -> dict[str, Any]:
    """Samples to the first alarm of a fresh sidecar chart (``ConformanceChart``: PIT + excess) on
    streams drawn (with replacement) from the real scored samples of a faulty decoder; also each
    chart alone (its own alarm index inside the pair), to show which one carries the detection."""
    from quality_sidecar.detectors.conformance_charts import ConformanceChart

    rng = np.random.default_rng(seed)
    delays, by_chart = [], {"pit": [], "excess": []}
    for _ in range(n_streams):
        c = ConformanceChart(**chart_kw)
        c.update([scores[i] for i in rng.integers(0, len(scores), size=limit)])
        delays.append(c.alarm_index_ if c.alarm_index_ is not None else math.inf)
        for name, sub in (("pit", c.pit), ("excess", c.excess)):
            by_chart[name].append(sub.alarm_index_ if sub.alarm_index_ is not None else math.inf)
    d = np.array(delays, float)
    return {"median_samples_to_alarm": float(np.median(d)), "p90_samples_to_alarm": float(np.quantile(d, 0.9)),
            "fraction_alarmed_within_500": float((d <= 500).mean()), "streams": n_streams, "horizon_samples": limit,
            "chart": "ConformanceChart (PIT + excess, alarm if either)",
            "each_chart_median_samples_to_alarm": {k: float(np.median(v)) for k, v in by_chart.items()}}


def siegmund_arl_two_sided(m: float, sd: float, h: float, k: float) -> float:
    """Run length (in increments) of a two-sided CUSUM with reference k and threshold h on Gaussian
    increments N(m, sd^2): Siegmund's approximation per side, the sides combined as competing alarms."""
    def one(delta: float) -> float:  # ARL of increments N(delta, 1) after scaling by sd
        hp = h / sd + 1.166
        if abs(delta) < 1e-9:
            return hp * hp
        return (math.exp(-2 * delta * hp) + 2 * delta * hp - 1) / (2 * delta * delta)
    return 1.0 / (1.0 / one((m - k) / sd) + 1.0 / one((-m - k) / sd))


def false_alarms(scores: list[Any], chart_kw: dict) -> dict[str, Any]:
    """False alarms per 1M samples of the sidecar's chart pair on a token stream distributed like the real one.

    A bootstrap stream of a finite real sample would carry that sample's mean error as a permanent
    drift, so instead, for each of the two charts, the run length is computed for Gaussian increments
    with the real stream's measured per-token mean and sd (PIT: x = (u - 1/2) sqrt(12); excess:
    x = s / sqrt(mean v)) (Siegmund's approximation, two-sided), at the point estimate and at the 95%
    bound of |mean| that is worse for the chart (a bound set by how many real tokens there are, not
    by the decoder), then converted to samples with the stream's mean tokens per sample; the pair's
    rate is the sum of its charts' (union bound).  Under exact sampling the means are 0 and the sds 1.
    The pair is also run once over the real stream in its recorded order.
    """
    from quality_sidecar.detectors.conformance_charts import ConformanceChart

    c = ConformanceChart(**chart_kw)
    k, h = c.pit.k_, c.threshold_
    x_pit = (np.concatenate([s.pit for s in scores]) - 0.5) * math.sqrt(12)
    v = np.concatenate([s.excess_var for s in scores])
    x_ex = np.concatenate([s.excess for s in scores]) / math.sqrt(v.mean())
    per_sample = len(x_pit) / len(scores)

    def arl_two_sided(m: float, sd: float) -> float:
        return siegmund_arl_two_sided(m, sd, h, k)

    out: dict[str, Any] = {"tokens": len(x_pit), "tokens_per_sample": per_sample}
    tot = {"at_mean": 0.0, "at_bound95": 0.0, "exact_null": 0.0}
    for name, x in (("pit", x_pit), ("excess", x_ex)):
        mu, sd, n = float(x.mean()), float(x.std(ddof=1)), len(x)
        bound = abs(mu) + 1.96 * sd / math.sqrt(n)
        rates = {"at_mean": 1e6 * per_sample / arl_two_sided(mu, sd),
                 "at_bound95": 1e6 * per_sample / arl_two_sided(bound, sd),
                 "exact_null": 1e6 * per_sample / arl_two_sided(0.0, 1.0)}
        for key in tot:
            tot[key] += rates[key]
        out[name] = {"x_mean_per_token": mu, "x_sd": sd, "x_mean_abs_bound95": bound,
                     **{f"per_1M_samples_{key}": val for key, val in rates.items()}}
    c.update(scores)
    out.update({"alarms_on_the_recorded_stream": c.alarms_,
                "per_1M_samples_at_mean": tot["at_mean"], "per_1M_samples_at_bound95": tot["at_bound95"],
                "per_1M_samples_exact_null": tot["exact_null"],
                "method": "Siegmund ARL (tokens) for Gaussian increments with the stream's measured mean and sd, "
                          "per chart (thresholds at 2 x ert_tokens each); pair = sum of the two charts' rates"})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model dir (default: the demo model)")
    ap.add_argument("--prompts", type=int, default=250, help="held-out open prompts")
    ap.add_argument("--samples-per-prompt", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--batch", type=int, default=32, help="max_num_seqs of the sampling engines")
    ap.add_argument("--top-logprobs", type=int, default=20, help="K of the scorer (vLLM's default max_logprobs)")
    ap.add_argument("--arms", default=";".join(DEFAULT_ARMS),
                    help="';'-separated name=SPEC[@dtype]")
    ap.add_argument("--reference-arm", default="none")
    ap.add_argument("--ert-tokens", type=float, default=None, help="chart ERT in tokens (default: the sidecar's)")
    ap.add_argument("--shift", type=float, default=None, help="chart shift (default: the sidecar's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=".bench-work/conformance")
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)

    from quality_sidecar.baseline_scoring import ConformanceConfig
    from quality_sidecar.detectors.conformance_scoring import SamplerParams
    from quality_sidecar.detectors.conformance_stats import likelihood_shift, pit_test, pit_z
    from vllm_lookahead.decoders import DEMO_MODEL
    from vllm_lookahead.prompts import load_heldout_prompts

    model = args.model or str(DEMO_MODEL)
    cc = ConformanceConfig()
    chart_kw = {"ert_tokens": args.ert_tokens or cc.ert_tokens, "shift": args.shift or cc.shift}
    prompts = load_heldout_prompts(args.prompts, "open", seed=1)
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    flat = [parse_arm(a) for a in args.arms.split(";") if a.strip()]
    params = SamplerParams(args.temperature, top_p=args.top_p)
    t_start = time.time()
    streams: dict[str, dict[str, Any]] = {}
    rescorers: dict[str, Any] = {}
    for name, spec, dtype in flat:
        key = hashlib.sha1(json.dumps([spec, dtype, args.prompts, args.samples_per_prompt, args.max_tokens,
                                       args.temperature, args.top_p, args.top_logprobs, args.seed, model]).encode()
                           ).hexdigest()[:12]
        cache = work / f"{name}-{key}.json"
        if cache.exists():
            rows = json.loads(cache.read_text())
            if any(r["output_ids"] and "excess" not in r for r in rows):  # cached before excess existed
                if dtype not in rescorers:
                    from vllm_lookahead.decoders import parse_spec
                    from vllm_lookahead.engine import make_llm

                    for other in list(rescorers):  # one scoring engine alive at a time
                        _close(rescorers.pop(other))
                    rescorers[dtype] = make_llm(model, parse_spec("none"), dtype=dtype, seed=0, max_model_len=1024,
                                                max_num_seqs=32, extra={"max_logprobs": max(20, args.top_logprobs)})
                rows = score(model, dtype, rows, args.top_logprobs, params, llm=rescorers[dtype])
                cache.write_text(json.dumps(rows))
        else:
            for other in list(rescorers):
                _close(rescorers.pop(other))
            t0 = time.time()
            rows = generate(model, spec, dtype, prompts, args)
            tg = time.time() - t0
            rows = score(model, dtype, rows, args.top_logprobs, params)
            print(f"[{name}] generated in {tg:.0f} s, scored in {time.time() - t0 - tg:.0f} s", file=sys.stderr)
            cache.write_text(json.dumps(rows))
        streams[name] = {"spec": spec, "dtype": dtype, **conformance(rows, args.temperature, args.top_p, vocab,
                                                                      args.seed)}
    for other in list(rescorers):
        _close(rescorers.pop(other))
    ref = streams.get(args.reference_arm)
    out_arms = []
    for name, st in streams.items():
        per = st["samples"]
        lp = np.array([p["mean_lp"] for p in per])
        u = np.concatenate([p["pit"] for p in per]) if per else np.zeros(0)
        pt = pit_test(u)
        entry: dict[str, Any] = {
            "arm": name, "spec": st["spec"], "dtype": st["dtype"], "samples": len(per),
            "tokens": int(sum(p["n"] for p in per)), "tokens_in_pit": int(len(u)),
            "skipped_fraction": float(sum(p["skipped"] for p in per) / max(1, sum(p["n"] for p in per))),
            "out_of_support_tokens": int(sum(p["oos"] for p in per)),
            "at_max_tokens_fraction": float(np.mean([p["finish"] == "length" for p in per])),
            "mean_token_logprob_nats": float(lp.mean()), "pit_mean_u": float(u.mean()) if len(u) else None,
            "pit_anderson_darling_p": pt.pvalue, "pit_test_detail": pt.detail,
            **_excess_summary(per),
        }
        if ref is not None and name != args.reference_arm:
            # paired by prompt (same prompts, same number of samples per prompt in every arm)
            def by_prompt(samples: list[dict]) -> dict[int, list[float]]:
                out: dict[int, list[float]] = {}
                for p in samples:
                    out.setdefault(p["prompt_index"], []).append(p["mean_lp"])
                return out

            sh = likelihood_shift(by_prompt(ref["samples"]), by_prompt(per), n_flips=5000)
            entry["logprob_shift_vs_reference_nats_per_token"] = sh.effect
            entry["logprob_shift_ci95"] = [sh.ci_low, sh.ci_high]
            entry["logprob_shift_p"] = sh.pvalue
            entry["logprob_shift_paired_prompts"] = sh.n_pairs
        exact = not st["spec"].startswith("custom:")
        entry["exact_decoder"] = exact
        scored = [p["score"] for p in per if len(p["pit"])]
        if exact:
            entry["false_alarms"] = false_alarms(scored, chart_kw)
        else:
            entry["detection"] = bootstrap_delay(scored, chart_kw, 200, 3000, args.seed)
        ex_s = sum(float(x.excess.sum()) for x in scored)
        ex_v = sum(float(x.excess_var.sum()) for x in scored)
        entry["topk_excess_z"] = ex_s / math.sqrt(ex_v) if ex_v > 0 else None
        entry["pit_z"] = pit_z(u) if len(u) else None
        out_arms.append(entry)
        print(json.dumps({k: v for k, v in entry.items() if k not in ("spec",)}), file=sys.stderr)
    # Pooled exact streams per dtype: the tightest bound on a per-token drift this run can give.
    pooled = {}
    for dtype in sorted({st["dtype"] for st in streams.values()}):
        pooled_scores = [p["score"] for name, st in streams.items() if st["dtype"] == dtype
                         and not st["spec"].startswith("custom:") for p in st["samples"] if len(p["pit"])]
        if pooled_scores:
            pooled[dtype] = false_alarms(pooled_scores, chart_kw)
    result = {"benchmark": "sidecar_conformance", "command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
              "model": model, "prompts": args.prompts, "samples_per_prompt": args.samples_per_prompt,
              "max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p,
              "top_logprobs": args.top_logprobs, "chart": chart_kw, "reference_arm": args.reference_arm,
              "wall_s": time.time() - t_start, "arms": out_arms,
              "exact_pooled_by_dtype": pooled}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
