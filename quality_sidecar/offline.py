"""One-shot scoring of a JSONL file (``quality-sidecar score``): rates, tests between arms, T=0 pairs.

Unlike the streaming detectors this uses conventional alpha = 0.05 two-sample tests with Holm across
metrics (it answers "do these two arms differ in this file?", like the release gate), the length test
as the permutation test of the mean (``length_test``).  With ``baseline_url`` every T>0 sample is also
scored under the baseline server: PIT and excess tests per arm (exact under the null, so each arm is
judged on its own), impossible tokens per arm (the streaming chart's rule) and the likelihood shift
between arms.  The exact checks need no server and run on every sample.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from .config import ServiceConfig
from .detectors import (
    finish_reason_test,
    first_divergence,
    holm,
    length_test,
    rate_test,
    text_mmd_test,
)
from .detectors.embedders import make_embedder
from .monitor import RATE_CHARTS, flag_of
from .pipeline import Pipeline
from .sinks import JsonWriter

log = logging.getLogger(__name__)


def conformance_report(samples: list[dict[str, Any]], baseline_url: str, conf: dict[str, Any],
                       progress: bool = True) -> dict[str, Any]:
    """Score every T>0 sample under the baseline server; PIT and excess tests per arm, likelihood shift
    between arms."""
    import numpy as np
    from tqdm import tqdm

    from .baseline_scoring import (
        IMPOSSIBLE_ALPHA,
        ConformanceConfig,
        LogprobClient,
        scorable,
        score_sample,
    )
    from .detectors.conformance_charts import ImpossibleTokenChart
    from .detectors.conformance_stats import excess_test, likelihood_shift_test, pit_test
    from .workers import RetryPolicy, WorkFailed

    cc = ConformanceConfig(**(conf.get("conformance") or {}))
    client = LogprobClient(baseline_url, top_logprobs=cc.top_logprobs, timeout_s=cc.timeout_s, api=cc.api)
    retry = RetryPolicy()
    rng = np.random.default_rng(0)
    pit: dict[str, list[float]] = {}
    excess: dict[str, list[float]] = {}
    lp: dict[str, dict[str, list[float]]] = {}
    impossible = ImpossibleTokenChart(IMPOSSIBLE_ALPHA, cc.impossible_floor_per_token)
    examples: dict[str, list[str]] = {}
    counts: dict[str, int] = {"scored": 0, "greedy": 0}
    for s in tqdm(samples, desc="scoring T>0 under the baseline", unit=" samples", disable=not progress):
        params = scorable(s)
        if params is None or isinstance(params, str):
            key = params or "greedy"
            counts[key] = counts.get(key, 0) + 1
            continue
        out = s["output"]["token_ids"]
        arm = s["deployment"]["arm"]
        sc = None
        attempt = 0
        while sc is None:  # as the streaming scorer: an outage delays the report, never thins it
            try:
                sc = score_sample(client, s, params, cc, rng)
            except WorkFailed as e:
                if e.reason == "rejected_token_ids":
                    impossible.update(arm, len(out), {"vocab": 1})
                if not e.transient:
                    counts[f"failed_{e.reason}"] = counts.get(f"failed_{e.reason}", 0) + 1
                    break
                log.warning("baseline server: %s; retrying in %.1f s", e, retry.delay(attempt))
                time.sleep(retry.delay(attempt))
                attempt += 1
        if sc is None:
            continue
        impossible.update(arm, sc.n_tokens, sc.oos_reasons)
        if sc.out_of_support:
            examples.setdefault(arm, []).append(s.get("trace_id") or s["request_id"])
        pit.setdefault(arm, []).extend(sc.pit.tolist())
        ex = excess.setdefault(arm, [0.0, 0.0, 0])
        for i, v in enumerate(sc.excess_sums()):
            ex[i] += v
        if math.isfinite(sc.mean_logprob):
            lp.setdefault(arm, {}).setdefault(s["prompt"]["sha256"], []).append(sc.mean_logprob)
        counts["scored"] += 1
    arms = {}
    for arm, u in pit.items():
        t = pit_test(u)
        vals = [x for v in lp[arm].values() for x in v]
        e = excess_test(*excess[arm])
        st = impossible.arms.get(arm) or {}
        arms[arm] = {"pit_tokens": len(u), "pit_anderson_darling_p": t.pvalue, "pit_detail": t.detail,
                     "excess_nats_per_token": e.statistic, "excess_p": e.pvalue, "excess_detail": e.detail,
                     "mean_token_logprob_nats": float(np.mean(vals)) if vals else None,
                     "impossible_tokens": st.get("impossible", 0), "impossible_reasons": st.get("reasons", {}),
                     "impossible_p": impossible.pvalue(arm),
                     "impossible_alarm": impossible.pvalue(arm) < impossible.alpha,
                     "impossible_examples": examples.get(arm, [])[:5]}
    report: dict[str, Any] = {"baseline_url": baseline_url, "counts": counts, "arms": arms}
    if lp.get("baseline") and lp.get("candidate"):
        t = likelihood_shift_test(lp["baseline"], lp["candidate"])
        report["likelihood_shift"] = {"effect_nats_per_token": t.statistic, "pvalue": t.pvalue, "detail": t.detail}
    return report


def exact_checks_report(samples: list[dict[str, Any]], conf: dict[str, Any]) -> dict[str, Any]:
    """Per arm: the exact checks over every sample (``detectors.exact_checks``): samples and output
    positions checked, impossible tokens by check, skipped checks by (check, reason), and the
    impossible-token chart's p-value and alarm, as the streaming pipeline counts them."""
    from .baseline_scoring import IMPOSSIBLE_ALPHA, ConformanceConfig
    from .detectors.conformance_charts import ImpossibleTokenChart
    from .detectors.exact_checks import exact_checks, exposure

    cc = ConformanceConfig(**(conf.get("conformance") or {}))
    chart = ImpossibleTokenChart(IMPOSSIBLE_ALPHA, cc.impossible_floor_per_token)
    arms: dict[str, dict[str, Any]] = {}
    for s in samples:
        arm = s["deployment"]["arm"]
        a = arms.setdefault(arm, {"samples_checked": 0, "positions_checked": 0, "impossible_tokens": {},
                                  "skipped": {}, "examples": []})
        done, skipped = exact_checks(s)
        for check, why in skipped.items():
            a["skipped"][f"{check}:{why}"] = a["skipped"].get(f"{check}:{why}", 0) + 1
        if not done:
            continue
        checked, reasons = exposure(done)
        a["samples_checked"] += 1
        a["positions_checked"] += checked
        for check, bad in reasons.items():
            a["impossible_tokens"][check] = a["impossible_tokens"].get(check, 0) + bad
        if any(reasons.values()) and len(a["examples"]) < 5:
            a["examples"].append(s.get("trace_id") or s["request_id"])
        chart.update(arm, checked, reasons)
    for arm, a in arms.items():
        if a["samples_checked"]:
            a["impossible_p"] = chart.pvalue(arm)
            a["impossible_alarm"] = a["impossible_p"] < chart.alpha
    return {"arms": arms, "alpha": chart.alpha, "floor_per_token": cc.impossible_floor_per_token}


def score_file(path: str, conf: dict[str, Any], dlq: str | None = None, permutations: int = 200,
               baseline_url: str | None = None) -> dict[str, Any]:
    from tqdm import tqdm

    cfg = ServiceConfig.from_dict({**conf, "source": f"file://{path}"})
    pipe = Pipeline(cfg)
    writer = JsonWriter(dlq) if dlq else None
    samples = []
    with open(path, "rb") as fh:
        for i, line in enumerate(tqdm(fh, desc="scoring", unit=" samples")):
            if line.strip():
                s = pipe.decode(line.rstrip(b"\r\n"), {"file": path, "line": i + 1}, writer)
                if s is not None:
                    samples.append(s)
    if writer:
        writer.close()
    feats = pipe.classify(samples)
    pipe.counts["samples"] = len(feats)
    by_arm: dict[str, list] = {}
    for f in feats:
        by_arm.setdefault(f.arm, []).append(f)
    report: dict[str, Any] = {"counts": pipe.counts, "dlq_reasons": pipe.dlq_reasons, "arms": {},
                              "exact_checks": exact_checks_report(samples, conf)}
    for arm, fs in by_arm.items():
        report["arms"][arm] = {"samples": len(fs),
                               "rates": {k: sum(flag_of(f, k) for f in fs) / len(fs) for k in RATE_CHARTS},
                               "mean_length_tokens": sum(f.length for f in fs) / len(fs)}
    b, c = by_arm.get("baseline", []), by_arm.get("candidate", [])
    if b and c:
        tests = [length_test([f.length for f in b], [f.length for f in c], method="permutation"),
                 finish_reason_test([f.finish_reason for f in b], [f.finish_reason for f in c])]
        tests += [rate_test([flag_of(f, k) for f in b], [flag_of(f, k) for f in c], name=k) for k in RATE_CHARTS]
        tests.append(text_mmd_test([f.text for f in b], [f.text for f in c], n_permutations=permutations,
                                   embed=make_embedder(cfg.monitor.text_embedder)))
        adj = holm([t.pvalue for t in tests])
        report["tests"] = [{"name": t.name, "statistic": t.statistic, "pvalue": t.pvalue, "pvalue_holm": float(p),
                            "significant_at_0.05": bool(p < 0.05), "detail": t.detail} for t, p in zip(tests, adj)]
        base = {f.pair_key: f for f in b if f.greedy and f.token_ids is not None}
        pairs = [(f, base[f.pair_key]) for f in c if f.greedy and f.token_ids is not None and f.pair_key in base]
        divs = [first_divergence(x.token_ids, y.token_ids) for x, y in pairs]
        report["exact_match"] = {"pairs": len(pairs),
                                 "exact_match_rate": (sum(d is None for d in divs) / len(divs)) if divs else None,
                                 "first_divergence_positions": sorted(d for d in divs if d is not None)[:50]}
    if baseline_url:
        report["conformance"] = conformance_report(samples, baseline_url, conf)
    return report
