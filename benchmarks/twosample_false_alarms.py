"""False-alarm rates of the baseline-vs-candidate two-sample tests on real exact-decoder streams (issue 13).

Why: the length test used to be scipy's ``cramervonmises_2samp``. Its rank formula assumes no ties.
On real T=1 streams where most outputs stop at ``max_tokens``, almost every length is tied, and it
reported a significant difference between two exact decoders. Synthetic log-normal lengths never
showed this. This benchmark checks every two-sample test of the sidecar on real outputs.

1. **Generate** real T=1 samples on CPU with vLLM from two EXACT decoders: ``none`` (arm
   ``baseline``) and ``lookahead:k=4`` (arm ``candidate``). Both use the demo model, float32, the
   same held-out prompts, a small ``max_tokens`` (most outputs hit the cap) and different engine
   seeds, so the two arms are independent draws from one distribution. Each output is written as
   a schema-v1 sample, built by ``vllm_lookahead.telemetry.record.build_sample`` (the producer's
   own builder) and checked with the sidecar's validator.
2. **Full-stream comparison**: every test, old CvM included, on the whole baseline stream against
   the whole candidate stream, and against half of the other arm. CvM's midrank formula breaks
   when the sizes differ, which is the scenario from the issue.
3. **Windowed false-alarm rates**: the two arms are pooled. Each round draws two windows of
   ``--window`` samples (the sidecar's ``MonitorConfig.window``). Each test is run on them and
   p < alpha is counted, at alpha = 0.05 and at the streaming levels:

   * ``alpha_family`` = window / ert_each, the level of the whole Holm family in ``ArmComparison``;
   * ``alpha_test`` = alpha_family / (number of tests), the raw level of the smallest p-value at
     Holm's first step.

   Window sizes: equal (window, window) and unequal (window // 2, window).
   ``ArmComparison`` tests as soon as the baseline window holds window // 2 samples.

   Two schemes are used:

   * ``bootstrap``: i.i.d. draws with replacement from the pooled real outputs. There are many
     rounds, so rates near 1e-4 are measured. Cheap tests only: the length tests,
     finish-reason and the linear MMD on a precomputed distance matrix.
   * ``label_permutation``: the pooled outputs are split at random without replacement (the
     exchangeability null itself), with fewer rounds.

   Each rate is reported with a 95% Clopper-Pearson interval.

    python benchmarks/twosample_false_alarms.py --json benchmarks/results/twosample_false_alarms.json

The generated samples are cached in ``--samples`` (JSONL). A re-run with the same settings only
redoes the statistics.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

ARMS = {"baseline": ("none", 1), "candidate": ("lookahead:k=4", 2)}  # arm -> (decoder spec, engine seed)


def generate(model: str, spec_text: str, seed: int, arm: str, prompts: list[str],
             args: argparse.Namespace) -> list[dict[str, Any]]:
    """Schema-v1 samples of one arm: ``args.samples_per_prompt`` T=1 outputs per prompt."""
    from vllm import SamplingParams

    from vllm_lookahead.decoders import parse_spec
    from vllm_lookahead.engine import make_llm
    from vllm_lookahead.telemetry.record import Decoder, FinishedRequest, build_sample

    spec = parse_spec(spec_text)
    llm = make_llm(model, spec, dtype="float32", seed=seed, max_model_len=1024, max_num_seqs=args.batch)
    sp = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=args.max_tokens)
    jobs = [p for _ in range(args.samples_per_prompt) for p in prompts]
    t0 = time.time()
    outs = llm.generate(jobs, sp)
    t1 = time.time()
    decoder = Decoder(method=spec.kind, params={"k": spec.k} if spec.speculative else {})
    samples = []
    for i, o in enumerate(outs):
        c = o.outputs[0]
        m = getattr(c, "spec_decode_metrics", None)
        spec_m = None
        if m is not None:
            d = m.to_dict()
            spec_m = types.SimpleNamespace(histogram=d.get("acceptance_histogram") or [],
                                           num_draft_tokens=d["num_draft_tokens"])
        req = FinishedRequest(
            request_id=f"{arm}-{i}", model=Path(model).name, operation="text_completion", decoder=decoder,
            arrival_unix_s=t0, finish_unix_s=t1, finish_reason=c.finish_reason, prompt=jobs[i],
            prompt_token_ids=list(o.prompt_token_ids), output_text=c.text, output_token_ids=list(c.token_ids),
            num_prompt_tokens=len(o.prompt_token_ids), num_output_tokens=len(c.token_ids),
            sampling={"temperature": 1.0, "top_p": 1.0, "max_tokens": args.max_tokens}, spec=spec_m,
            trace_id=(seed << 64) + i + 1, span_id=i + 1)
        samples.append(build_sample(req, arm=arm, release=spec_text, instance="bench", redact_prompts=False))
    with contextlib.suppress(Exception):  # best effort: free the engine before the next arm
        llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return samples


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact binomial confidence interval of a rate k/n."""
    from scipy.stats import beta

    a = (1 - level) / 2
    lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def rate(k: int, n: int) -> dict[str, Any]:
    lo, hi = clopper_pearson(k, n)
    return {"alarms": int(k), "rounds": int(n), "rate": k / n, "ci95": [lo, hi]}


def mannwhitney_vectorised(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Two-sided p-values of the tie-corrected Mann-Whitney test for many rounds at once.

    ``a``, ``b``: (rounds, n) and (rounds, m) integer lengths. This is the same statistic as
    ``length_test(method="mannwhitney")`` (checked against it on the first rounds in ``main``),
    written with bincounts so 10^5 rounds take seconds."""
    from scipy.stats import norm

    r, n = a.shape
    m = b.shape[1]
    top = int(max(a.max(), b.max())) + 1
    ca = np.zeros((r, top))
    cb = np.zeros((r, top))
    rows = np.arange(r)[:, None]
    np.add.at(ca, (np.broadcast_to(rows, a.shape), a), 1)
    np.add.at(cb, (np.broadcast_to(rows, b.shape), b), 1)
    t = ca + cb
    below = np.cumsum(t, axis=1) - t
    midrank = below + (t + 1) / 2
    u = (ca * midrank).sum(1) - n * (n + 1) / 2
    nn = n + m
    var = n * m / 12 * ((nn + 1) - (t ** 3 - t).sum(1) / (nn * (nn - 1)))
    z = np.where(var > 0, (u - n * m / 2) / np.sqrt(np.maximum(var, 1e-300)), 0.0)
    return np.minimum(1.0, 2 * norm.sf(np.abs(z)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(Path(__file__).resolve().parents[1] / "models" / "demo-code-4l"))
    ap.add_argument("--prompts", type=int, default=500, help="held-out open prompts")
    ap.add_argument("--samples-per-prompt", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--samples", default=".bench-work/twosample_false_alarms/samples.jsonl",
                    help="cache of generated samples (JSONL, schema v1)")
    ap.add_argument("--generate-only", action="store_true")
    ap.add_argument("--window", type=int, default=None, help="default: MonitorConfig().window")
    ap.add_argument("--bootstrap-rounds", type=int, default=200_000)
    ap.add_argument("--mmd-rounds", type=int, default=10_000)
    ap.add_argument("--permutation-rounds", type=int, default=1_000)
    ap.add_argument("--cvm-rounds", type=int, default=5_000, help="rounds for the per-call tests (CvM, finish reason)")
    ap.add_argument("--offline-rounds", type=int, default=200,
                    help="rounds for the Monte-Carlo permutation length test at alpha 0.05")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    cache = Path(args.samples)
    meta = {"prompts": args.prompts, "samples_per_prompt": args.samples_per_prompt, "max_tokens": args.max_tokens,
            "arms": ARMS, "model": Path(args.model).name}
    meta_path = cache.with_suffix(".meta.json")
    gen_seconds = None
    cached = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    cached.pop("generation_seconds", None)
    if not (cache.exists() and cached == json.loads(json.dumps(meta))):
        from quality_sidecar.validate import sample_errors
        from vllm_lookahead.prompts import load_heldout_prompts

        prompts = load_heldout_prompts(args.prompts, "open", seed=0)
        t0 = time.time()
        rows = []
        for arm, (spec, seed) in ARMS.items():
            rows += generate(args.model, spec, seed, arm, prompts, args)
        gen_seconds = time.time() - t0
        bad = [e for s in rows for e in sample_errors(s)]
        if bad:
            raise SystemExit(f"generated samples fail schema v1: {bad[:3]}")
        cache.parent.mkdir(parents=True, exist_ok=True)
        with cache.open("w") as fh:
            for s in rows:
                fh.write(json.dumps(s) + "\n")
        meta_path.write_text(json.dumps({**meta, "generation_seconds": gen_seconds}))
        print(f"generated {len(rows)} samples in {gen_seconds:.0f} s -> {cache}", file=sys.stderr)
    if args.generate_only:
        return 0
    report = analyse(cache, args)
    report["generation"] = {**meta, "arms": {a: {"decoder": s, "engine_seed": sd} for a, (s, sd) in ARMS.items()},
                            "dtype": "float32", "temperature": 1.0, "top_p": 1.0,
                            "generation_seconds": json.loads(meta_path.read_text()).get("generation_seconds")}
    report["command"] = "python benchmarks/twosample_false_alarms.py " + " ".join(argv if argv is not None else sys.argv[1:])
    out = json.dumps(report, indent=2)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(out + "\n")
    print(out)
    return 0


def analyse(cache: Path, args: argparse.Namespace) -> dict[str, Any]:  # noqa: C901 (one linear report)
    from scipy.stats import cramervonmises_2samp, ks_2samp

    from quality_sidecar.detectors import finish_reason_test, length_test, linear_mmd, rate_test
    from quality_sidecar.detectors.embedders import make_embedder
    from quality_sidecar.features import extract
    from quality_sidecar.monitor import MonitorConfig, arm_comparison_tests

    samples = [json.loads(x) for x in cache.read_text().splitlines() if x.strip()]
    feats = [extract(s) for s in samples]
    arm = np.array([f.arm for f in feats])
    length = np.array([f.length for f in feats], dtype=np.int64)
    finish = np.array([f.finish_reason for f in feats])
    cfg = MonitorConfig()
    window = args.window or cfg.window
    n_tests = len(arm_comparison_tests(cfg))
    alpha_family = window / cfg.ert_each
    alpha_test = alpha_family / n_tests
    levels = {"0.05": 0.05, "alpha_family": alpha_family, "alpha_test": alpha_test}
    rng = np.random.default_rng(args.seed)
    rep: dict[str, Any] = {
        "samples": {a: int((arm == a).sum()) for a in ("baseline", "candidate")},
        "share_at_max_tokens": {a: float(((length == args.max_tokens) & (arm == a)).sum() / (arm == a).sum())
                                for a in ("baseline", "candidate")},
        "finish_reasons": {a: {r: int(((finish == r) & (arm == a)).sum()) for r in sorted(set(finish))}
                           for a in ("baseline", "candidate")},
        "mean_length_tokens": {a: float(length[arm == a].mean()) for a in ("baseline", "candidate")},
        "distinct_lengths": int(len(np.unique(length))),
        "window": window, "ert_each": cfg.ert_each, "tests_in_family": n_tests, "levels": levels,
    }
    b, c = length[arm == "baseline"], length[arm == "candidate"]
    fb, fc = finish[arm == "baseline"], finish[arm == "candidate"]
    emb = make_embedder("hashed")([f.text for f in feats]).astype(np.float64)
    mb, mc = emb[arm == "baseline"], emb[arm == "candidate"]
    full: dict[str, Any] = {}
    # The whole streams, and unequal sizes (all of one arm vs half of the other): CvM's midrank formula
    # breaks down when the two sample sizes differ.
    for label, (nb, nc) in {"2000 vs 2000": (len(b), len(c)), "2000 vs 1000": (len(b), len(c) // 2),
                            "1000 vs 2000": (len(b) // 2, len(c))}.items():
        m = min(nb, nc) // 2 * 2
        full[label] = {
            "length_cvm_scipy (old)": float(cramervonmises_2samp(b[:nb], c[:nc]).pvalue),
            "length_ks_scipy": float(ks_2samp(b[:nb], c[:nc]).pvalue),
            "length_mannwhitney (new, streaming)": length_test(b[:nb], c[:nc]).pvalue,
            "length_permutation_mean (new, offline)": length_test(b[:nb], c[:nc], method="permutation",
                                                                   n_permutations=9999).pvalue,
            "finish_reason": finish_reason_test(fb[:nb], fc[:nc]).pvalue,
            "truncated (Fisher)": rate_test([f.truncated for f in feats if f.arm == "baseline"][:nb],
                                            [f.truncated for f in feats if f.arm == "candidate"][:nc]).pvalue,
            "text_mmd (linear)": linear_mmd(mb[:m], mc[:m]).pvalue,
        }
    rep["full_stream_pvalues"] = full

    n_all = len(feats)
    sizes = {"equal": (window, window), "unequal": (window // 2, window)}  # ArmComparison tests from window//2

    # --- windowed rates, bootstrap (i.i.d. from the pooled real outputs) ---------------------------
    boot: dict[str, Any] = {}
    for sname, (na, nb_) in sizes.items():
        res: dict[str, Any] = {"sizes": [na, nb_]}
        t0 = time.time()
        counts = {lv: 0 for lv in levels}
        done, check = 0, []
        while done < args.bootstrap_rounds:
            r = min(2000, args.bootstrap_rounds - done)
            ia, ib = rng.integers(0, n_all, (r, na)), rng.integers(0, n_all, (r, nb_))
            p = mannwhitney_vectorised(length[ia], length[ib])
            if done == 0:
                check = [(float(p[i]), length_test(length[ia[i]], length[ib[i]]).pvalue) for i in range(20)]
            for lv, a in levels.items():
                counts[lv] += int((p < a).sum())
            done += r
        assert all(abs(x - y) <= 1e-9 * max(1.0, y) + 1e-12 for x, y in check), check
        res["length_mannwhitney (new, streaming)"] = {**{lv: rate(k, done) for lv, k in counts.items()},
                                                      "seconds": time.time() - t0}
        for name, fn, rounds in (
                ("length_cvm_scipy (old)", lambda x, y: cramervonmises_2samp(length[x], length[y]).pvalue,
                 args.cvm_rounds),
                ("finish_reason", lambda x, y: finish_reason_test(finish[x], finish[y]).pvalue, args.cvm_rounds)):
            t0 = time.time()
            counts = {lv: 0 for lv in levels}
            for _ in range(rounds):
                p = fn(rng.integers(0, n_all, na), rng.integers(0, n_all, nb_))
                for lv, a in levels.items():
                    counts[lv] += int(p < a)
            res[name] = {**{lv: rate(k, rounds) for lv, k in counts.items()}, "seconds": time.time() - t0}
        boot[sname] = res

    # linear MMD on hashed n-grams (uses min(n, m) samples of each side: equal sizes only). Kernel values
    # come from one pooled distance matrix; the bandwidth is re-estimated per round from 300 of the
    # round's points, as linear_mmd does.
    from scipy.stats import norm

    t0 = time.time()
    sq = (emb * emb).sum(1)
    d2 = np.maximum(0.0, sq[:, None] + sq[None, :] - 2 * emb @ emb.T).astype(np.float32)
    counts = {lv: 0 for lv in levels}
    check_mmd = []
    for it in range(args.mmd_rounds):
        ia, ib = rng.integers(0, n_all, window), rng.integers(0, n_all, window)
        z = np.concatenate([ia, ib])
        sidx = z[rng.choice(len(z), 300, replace=False)]
        sub = d2[np.ix_(sidx, sidx)]
        gamma = 1.0 / max(float(np.median(sub[np.triu_indices(300, 1)])), 1e-6)
        x1, x2, y1, y2 = ia[0::2], ia[1::2], ib[0::2], ib[1::2]
        h = (np.exp(-gamma * d2[x1, x2]) + np.exp(-gamma * d2[y1, y2])
             - np.exp(-gamma * d2[x1, y2]) - np.exp(-gamma * d2[x2, y1])).astype(np.float64)
        se = h.std(ddof=1) / math.sqrt(len(h))
        p = float(norm.sf(h.mean() / se)) if se > 0 else 0.5
        if it < 3:
            check_mmd.append((p, linear_mmd(emb[ia], emb[ib]).pvalue))
        for lv, a in levels.items():
            counts[lv] += int(p < a)
    boot["equal"]["text_mmd (linear)"] = {
        **{lv: rate(k, args.mmd_rounds) for lv, k in counts.items()}, "seconds": time.time() - t0,
        "note": "bandwidth from 300 random points per round (as linear_mmd); first rounds, this vs "
                f"linear_mmd itself (its own 300-point draw): {check_mmd}"}
    rep["bootstrap_windows"] = boot

    # --- windowed rates, arm-label permutation (without replacement) -------------------------------
    trunc = np.array([f.truncated for f in feats])
    perm_res: dict[str, Any] = {}
    for sname, (na, nb_) in sizes.items():
        t0 = time.time()
        per: dict[str, list[float]] = {"length_mannwhitney (new, streaming)": [], "length_cvm_scipy (old)": [],
                                       "finish_reason": [], "truncated (Fisher)": [], "text_mmd (linear)": []}
        off: list[float] = []
        for it in range(args.permutation_rounds):
            pm = rng.permutation(n_all)
            ia, ib = pm[:na], pm[na:na + nb_]
            per["length_mannwhitney (new, streaming)"].append(length_test(length[ia], length[ib]).pvalue)
            per["length_cvm_scipy (old)"].append(float(cramervonmises_2samp(length[ia], length[ib]).pvalue))
            per["finish_reason"].append(finish_reason_test(finish[ia], finish[ib]).pvalue)
            per["truncated (Fisher)"].append(rate_test(trunc[ia], trunc[ib]).pvalue)
            m = min(na, nb_) // 2 * 2
            per["text_mmd (linear)"].append(linear_mmd(emb[ia[:m]], emb[ib[:m]]).pvalue)
            if it < args.offline_rounds:
                off.append(length_test(length[ia], length[ib], method="permutation", n_permutations=999,
                                       seed=it).pvalue)
        res = {"sizes": [na, nb_]}
        for name, ps in per.items():
            arr = np.array(ps)
            res[name] = {lv: rate(int((arr < a).sum()), len(arr)) for lv, a in levels.items()}
        arr = np.array(off)
        res["length_permutation_mean (new, offline)"] = {"0.05": rate(int((arr < 0.05).sum()), len(arr)),
                                                         "0.01": rate(int((arr < 0.01).sum()), len(arr))}
        res["seconds"] = time.time() - t0
        perm_res[sname] = res
    rep["label_permutation_windows"] = perm_res
    return rep


if __name__ == "__main__":
    sys.exit(main())
