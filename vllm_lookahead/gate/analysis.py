"""Turn the runs into measurements and a verdict.

Inputs: the eval items, the baseline arm (greedy batch, its A/A partner at another batch size, the
batch-1 latency subset, optional T>0 samples and, with per-request seeds, their A/A partner) and the candidate arm (greedy batch, one-at-a-time latency subset, optional samples).
Output: one JSON-friendly dict (``criteria`` + ``verdict`` + every measurement behind them) that the
report module renders.  Behavioural guards come from ``quality_sidecar.classifiers`` (shared with the
sidecar, never copied here).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from typing import Any

import numpy as np

from vllm_lookahead.gate import stats
from vllm_lookahead.gate.checkers import check
from vllm_lookahead.gate.criteria import CRITERIA, Context, crit
from vllm_lookahead.gate.engine import ArmRuns, RequestRecord, RunResult
from vllm_lookahead.gate.evalset import EvalItem


def _classifier_text(item: EvalItem, text: str) -> str:
    """JSON items open the literal in the prompt: judge the literal, not its tail."""
    return item.checker.get("prefix", "") + text if item.checker["type"] == "json_schema" else text


def load_classifiers(names: list[str]) -> list[Any]:
    """The sidecar's classifiers named in the policy (ImportError tells what is missing)."""
    from quality_sidecar.classifiers import default_classifiers

    have = {c.name: c for c in default_classifiers()}
    missing = [n for n in names if n not in have]
    if missing:
        raise ValueError(f"policy names unknown classifier(s) {missing}; quality_sidecar has {sorted(have)}")
    return [have[n] for n in names]


def _score(items: dict[str, EvalItem], run: RunResult, classifiers: list[Any]) -> list[dict[str, Any]]:
    out = []
    for r in run.records:
        it = items[r.item_id]
        res = check(it.prompt, r.text, it.checker)
        flags = {}
        for clf in classifiers:
            v = clf.classify(_classifier_text(it, r.text), prompt=it.prompt,
                             response_format=it.response_format, finish_reason=r.finish_reason)
            flags[clf.name] = bool(v.flagged)
        out.append({"item_id": r.item_id, "sample": r.sample, "task": it.task, "passed": res.passed,
                    "detail": res.detail, "flags": flags, "n_tokens": len(r.token_ids),
                    "finish_reason": r.finish_reason})
    return out


def latency_summary(greedy: RunResult, seq: RunResult | None, seq_ids: list[str]) -> dict[str, Any]:
    """Throughput, TTFT, TPOT and spec-decode efficiency of one arm."""
    recs = greedy.records
    gen = sum(len(r.token_ids) for r in recs)
    out: dict[str, Any] = {"batch_tokens": gen, "batch_wall_s": greedy.wall_s,
                           "batch_tokens_per_s": gen / greedy.wall_s if greedy.wall_s > 0 else None}
    seq_recs: list[RequestRecord] = []
    if seq is not None:
        keep = set(seq_ids)
        seq_recs = [r for r in seq.records if r.item_id in keep]
        sgen = sum(len(r.token_ids) for r in seq_recs)
        lat = [r.latency_s if r.latency_s is not None else
               (r.ttft_s or 0) + (r.tpot_s or 0) * max(0, len(r.token_ids) - 1) for r in seq_recs]
        out["seq_items"] = len(seq_recs)
        out["seq_tokens_per_s"] = sgen / sum(lat) if sum(lat) > 0 else None
    view = seq_recs or recs
    out["latency_view"] = "batch 1 (one at a time)" if seq_recs else "batched"
    out["ttft_s"] = stats.quantiles([r.ttft_s for r in view])
    out["tpot_s"] = stats.quantiles([r.tpot_s for r in view])
    out["ttft_samples_s"] = [r.ttft_s for r in view if r.ttft_s is not None]
    out["tpot_samples_s"] = [r.tpot_s for r in view if r.tpot_s is not None]
    drafted = sum(r.drafted for r in recs)
    accepted = sum(r.accepted for r in recs)
    steps = sum(r.steps for r in recs)
    ec = greedy.engine_counters or {}
    if drafted == 0 and ec.get("num_draft_tokens"):
        # HTTP engine: no per-request spec metrics, the server's counters over this run instead
        drafted, accepted = int(ec["num_draft_tokens"]), int(ec.get("num_accepted_tokens", 0))
        steps = max(1, gen - accepted)
    drafts = ec.get("num_drafts") or sum(1 for r in recs for x in r.per_step_drafted if x > 0)
    out["drafts"] = int(drafts) if drafts else None
    # mean acceptance length: tokens per step that verified a draft (1 + accepted drafts per such step)
    out["mean_acceptance_length"] = 1 + accepted / drafts if drafts else None
    out["drafted_tokens"] = drafted
    out["accepted_tokens"] = accepted
    out["acceptance_rate"] = accepted / drafted if drafted else None
    out["compression"] = gen / steps if steps else None  # generated tokens per engine step
    k = max([len(r.per_step_drafted) and max(r.per_step_drafted) for r in recs] + [0])
    per_pos = []
    for p in range(1, k + 1):
        d = sum(sum(1 for x in r.per_step_drafted if x >= p) for r in recs)
        a = sum(sum(1 for x in r.per_step_accepted if x >= p) for r in recs)
        per_pos.append({"position": p, "drafted": d, "accepted": a, "rate": a / d if d else None})
    if not per_pos and ec.get("num_drafts") and isinstance(ec.get("num_accepted_tokens_per_pos"), list):
        # server counters: every drafting step proposes at most k tokens; rate per position = accepted / drafts
        per_pos = [{"position": i + 1, "drafted": int(ec["num_drafts"]), "accepted": int(a),
                    "rate": a / ec["num_drafts"]} for i, a in enumerate(ec["num_accepted_tokens_per_pos"])]
    out["acceptance_per_position"] = per_pos
    out["engine_counters"] = greedy.engine_counters  # vLLM's own vllm:spec_decode_* deltas, a cross-check
    return out


def _exact(base: RunResult, other: RunResult) -> dict[str, Any]:
    b, o = base.by_item(), other.by_item()
    divs = {i: stats.first_divergence(b[i].token_ids, o[i].token_ids) for i in b if i in o}
    positions = [d for d in divs.values() if d is not None]
    return {"n": len(divs), "mismatches": len(positions), "match_rate": 1 - len(positions) / max(1, len(divs)),
            "first_divergence": positions, "diverged_items": sorted(i for i, d in divs.items() if d is not None)}


def _conformance(run: RunResult) -> dict[str, Any]:
    """One arm's T>0 samples under the baseline model: mean token log-prob, PIT values, out-of-support
    tokens (by the parameter that excludes them), and the excess per sampling profile."""
    from quality_sidecar.detectors.conformance_stats import excess_test, excess_totals
    from vllm_lookahead.gate.profiles import profile_of

    sc = [x for x in (run.scores or []) if x["n_tokens"]]
    n_prof = max(1, len(run.sampling))
    by_item: dict[str, list[float]] = {}  # keyed by (item, profile): the shift pairs like with like
    for x in sc:
        if x["mean_logprob"] is not None and np.isfinite(x["mean_logprob"]):
            by_item.setdefault(f"{x['item_id']}#{x['sample'] % n_prof}", []).append(x["mean_logprob"])
    pit = np.array([u for x in sc for u in x["pit"]], float)
    reasons: dict[str, int] = {}
    for x in run.scores or []:
        for k, v in (x.get("oos_reasons") or {}).items():
            reasons[k] = reasons.get(k, 0) + int(v)
    profiles = []
    for j in range(len(run.sampling)):
        part = [x for x in sc if x["sample"] % n_prof == j]
        ex = excess_test(*excess_totals(x.get("excess") for x in part))
        profiles.append({"profile": profile_of(run.sampling, j).label, "samples": len(part),
                         "tokens": int(sum(x["n_tokens"] for x in part)),
                         "excess_nats_per_token": ex.statistic, "excess_p": ex.pvalue,
                         "out_of_support": int(sum(x["out_of_support"] for x in part))})
    lps = [x["mean_logprob"] for x in sc if x["mean_logprob"] is not None and np.isfinite(x["mean_logprob"])]
    late = [x["late_excess"] for x in sc if "late_excess" in x]
    return {"excess": excess_totals(x.get("excess") for x in sc), "n_samples": len(sc),
            "late_excess": excess_totals(late) if late else None,
            "n_tokens": int(sum(x["n_tokens"] for x in sc)),
            "mean_token_logprob": float(np.mean(lps)) if lps else None,
            "mean_pit": float(pit.mean()) if len(pit) else None,
            "out_of_support": int(sum(x["out_of_support"] for x in (run.scores or []))),
            "out_of_support_reasons": reasons, "profiles": profiles,
            "by_item": by_item, "pit": pit, "scoring_s": run.scoring_s}


def _duplicates(run: RunResult) -> dict[str, list[float]]:
    """Per (item, profile): how many of its samples repeat an earlier one token for token."""
    n_prof = max(1, len(run.sampling))
    groups: dict[str, list[tuple[int, ...]]] = {}
    for r in run.records:
        groups.setdefault(f"{r.item_id}#{r.sample % n_prof}", []).append(tuple(r.token_ids))
    return {k: [float(len(v) - len(set(v)))] for k, v in groups.items()}


def _sampled(b: list[dict], c: list[dict], bruns: RunResult, cruns: RunResult, pol: dict[str, Any],
             method: str, names: list[str], dtype: str | None = None) -> dict[str, Any]:
    """T>0 comparison: surface features (length, stop/pass/flag rates) plus the likelihood tests
    (excess log-prob and PIT of the candidate's samples, likelihood shift candidate - baseline), all
    adjusted together."""
    from quality_sidecar.detectors.conformance_stats import (
        EXCESS_MIN_TOKENS,
        excess_test,
        likelihood_shift,
        pit_test,
    )
    from quality_sidecar.detectors.twosample import length_test

    tests: dict[str, float] = {}
    bl = [x["n_tokens"] for x in b]
    cl = [x["n_tokens"] for x in c]
    # lengths are discrete, tied and capped at max_tokens: a tie-corrected Mann-Whitney, not KS
    tests["length_mannwhitney"] = length_test(bl, cl).pvalue
    bs = sum(x["finish_reason"] == "stop" for x in b)
    cs = sum(x["finish_reason"] == "stop" for x in c)
    tests["stop_rate_fisher"] = stats.fisher_two_sided_p(cs, len(c), bs, len(b))
    bp = sum(x["passed"] for x in b)
    cp = sum(x["passed"] for x in c)
    tests["pass_rate_fisher"] = stats.fisher_two_sided_p(cp, len(c), bp, len(b))
    rates = {"pass_rate": {"baseline": bp / max(1, len(b)), "candidate": cp / max(1, len(c))},
             "stop_rate": {"baseline": bs / max(1, len(b)), "candidate": cs / max(1, len(c))},
             "mean_length": {"baseline": float(np.mean(bl)) if bl else None,
                             "candidate": float(np.mean(cl)) if cl else None}}
    # Independence: samples of one prompt must not repeat more often than the baseline's do (a reused
    # RNG stream keeps every marginal exact and makes them identical).  Paired by (item, profile),
    # sign-flip test of the difference in repeated samples: exact, the arms are exchangeable per item.
    db, dc = _duplicates(bruns), _duplicates(cruns)
    tests["duplicates_signflip"] = likelihood_shift(db, dc, min_pairs=1).pvalue
    rates["duplicate_samples"] = {"baseline": sum(v[0] for v in db.values()) / max(1, len(b)),
                                  "candidate": sum(v[0] for v in dc.values()) / max(1, len(c))}
    for n in names:
        kb = sum(x["flags"].get(n, False) for x in b)
        kc = sum(x["flags"].get(n, False) for x in c)
        tests[f"{n}_rate_fisher"] = stats.fisher_two_sided_p(kc, len(c), kb, len(b))
        rates[f"{n}_rate"] = {"baseline": kb / max(1, len(b)), "candidate": kc / max(1, len(c))}
    scored = bruns.scores is not None and cruns.scores is not None
    conf: dict[str, Any] = {"scored": scored}
    if scored:
        bc, cc = _conformance(bruns), _conformance(cruns)
        pit_c, pit_b = pit_test(cc["pit"], "pit_candidate"), pit_test(bc["pit"], "pit_baseline")
        ex_c, ex_b = excess_test(*cc["excess"], name="excess_candidate"), excess_test(*bc["excess"], name="excess_baseline")
        sh = likelihood_shift(bc["by_item"], cc["by_item"])
        tests["pit_candidate_ad"] = pit_c.pvalue
        tests["excess_candidate_z"] = ex_c.pvalue
        tests["likelihood_shift"] = sh.pvalue
        floor = pol.get("impossible_floor_per_token")
        if floor is None:
            floor = stats.IMPOSSIBLE_FLOOR_PER_TOKEN.get(dtype or "", max(stats.IMPOSSIBLE_FLOOR_PER_TOKEN.values()))
        tests["impossible_tokens"] = stats.impossible_tokens_p(cc["out_of_support"], cc["n_tokens"],
                                                               bc["out_of_support"], bc["n_tokens"], floor)
        # a verifier wrong only deep in a draft: the excess of the tokens at draft position >= 2 alone
        # (a token's draft position is fixed before it is drawn, so under exact sampling the selected
        # scores keep mean 0); only for a speculative candidate with such tokens
        late = cc["late_excess"]
        if late is not None and late[2] >= EXCESS_MIN_TOKENS:
            ex_l = excess_test(*late, name="excess_late_draft")
            tests["excess_late_draft_z"] = ex_l.pvalue
            conf["excess_late_draft"] = {"nats_per_token": ex_l.statistic, "p_value": ex_l.pvalue,
                                         "tokens": int(late[2]), "detail": ex_l.detail}
        conf.update({
            "mean_token_logprob": {"baseline": bc["mean_token_logprob"], "candidate": cc["mean_token_logprob"]},
            "tokens": {"baseline": bc["n_tokens"], "candidate": cc["n_tokens"]},
            "mean_pit": {"baseline": bc["mean_pit"], "candidate": cc["mean_pit"]},
            "shift": {"effect": sh.effect, "ci_low": sh.ci_low, "ci_high": sh.ci_high, "p_value": sh.pvalue,
                      "paired": sh.paired, "n_pairs": sh.n_pairs},
            "pit_candidate": {"a2": pit_c.statistic, "p_value": pit_c.pvalue, "detail": pit_c.detail},
            # the baseline arm is exact by construction: its PIT is the A/A control of the scorer
            "pit_baseline_control": {"a2": pit_b.statistic, "p_value": pit_b.pvalue, "detail": pit_b.detail},
            # the excess score: mean log p(y) - E_sampler[log p], nats/token (the fault size itself)
            "excess_candidate": {"nats_per_token": ex_c.statistic, "p_value": ex_c.pvalue, "detail": ex_c.detail},
            "excess_baseline_control": {"nats_per_token": ex_b.statistic, "p_value": ex_b.pvalue,
                                        "detail": ex_b.detail},
            "out_of_support": {"baseline": bc["out_of_support"], "candidate": cc["out_of_support"],
                               "floor_per_token": floor},
            "out_of_support_reasons": {"baseline": bc["out_of_support_reasons"],
                                       "candidate": cc["out_of_support_reasons"]},
            "profiles": {"baseline": bc["profiles"], "candidate": cc["profiles"]},
            "scoring_s": {"baseline": bc["scoring_s"], "candidate": cc["scoring_s"]}})
    adj = stats.adjust_pvalues(list(tests.values()), method)
    from vllm_lookahead.gate.profiles import parse_profiles

    return {"n_baseline": len(b), "n_candidate": len(c),
            "profiles": [p.label for p in parse_profiles(pol["profiles"])],
            "p_values": tests, "p_adjusted": dict(zip(tests, adj)), "rates": rates, "conformance": conf}


def crashed_verdict(crash: dict[str, Any], n_items: int) -> dict[str, Any]:
    """FAIL for a candidate whose engine or endpoint died on requests the baseline served
    (``RunCrashed.to_json()``).  Why a verdict, not "no verdict": the baseline arm completed the same
    requests, so the crash is the candidate's -- the most severe regression, not a broken gate.  No
    other criterion is measured (the candidate's outputs are incomplete)."""
    c = crit("candidate_completes", "crashed", "the candidate serves every request the baseline served",
               False, True, f"{crash['run']} died {crash['where']}: {crash['error']}")
    return {"verdict": "FAIL", "failed": [c["name"]], "criteria": [c], "crash": crash, "n_items": n_items}


def _exact_match(base: ArmRuns, cand: ArmRuns) -> dict[str, Any]:
    """T=0 token ids of the candidate vs the baseline's batched ones, against the A/A rate: batched, and
    the candidate's one-at-a-time run against the pooled A/A (chunks, the baseline's one-at-a-time run)."""
    cand_exact = _exact(base.greedy, cand.greedy)
    aa_exact = _exact(base.greedy, base.aa) if base.aa else None
    n = cand_exact["n"]
    aa_mm = aa_exact["mismatches"] if aa_exact else 0
    aa_n = aa_exact["n"] if aa_exact else n
    excess = cand_exact["mismatches"] / max(1, n) - aa_mm / max(1, aa_n)
    p_exact = stats.fisher_greater_p(cand_exact["mismatches"], n, aa_mm, aa_n)
    seq_exact = seq_aa = None
    seq_excess, p_seq = 0.0, 1.0
    if cand.sequential is not None:
        seq_exact = _exact(base.greedy, cand.sequential)
        seq_aa = _exact(base.greedy, base.sequential) if base.sequential is not None else None
        pool_mm = aa_mm + (seq_aa["mismatches"] if seq_aa else 0)
        pool_n = aa_n + (seq_aa["n"] if seq_aa else 0)
        seq_excess = seq_exact["mismatches"] / max(1, seq_exact["n"]) - pool_mm / max(1, pool_n)
        p_seq = stats.fisher_greater_p(seq_exact["mismatches"], seq_exact["n"], pool_mm, pool_n)
    return {"candidate": cand_exact, "aa": aa_exact, "excess_mismatch": excess, "p_value": p_exact,
            "batch1": {"candidate": seq_exact, "aa": seq_aa, "excess_mismatch": seq_excess, "p_value": p_seq}}


def _seeded_pairs(base: RunResult, other: RunResult) -> dict[str, Any]:
    """Per-request-seeded T>0 samples paired by (item, sample index): how many differ token for token."""
    from vllm_lookahead.gate.profiles import profile_of

    def seeded(run: RunResult) -> dict[tuple[str, int], list[int]]:
        return {(r.item_id, r.sample): r.token_ids for r in run.records if run.sampling
                and profile_of(run.sampling, r.sample).seed == "per_request"}

    b, o = seeded(base), seeded(other)
    differ = sorted(f"{i}#{s}" for (i, s), ids in o.items() if (i, s) in b and b[(i, s)] != ids)
    n = sum(1 for key in o if key in b)
    return {"n": n, "mismatches": len(differ), "diverged": differ}


def coupled_of(steps: dict[str, int] | None) -> bool | None:
    """Is a run's candidate *measured* coupled: at least one T>0 drafted step verified by coupled
    verification and none by vLLM's rejection sampler?  None: not measurable (an endpoint)."""
    if steps is None:
        return None
    return steps.get("coupled", 0) >= 1 and steps.get("rejection_sampler", 0) == 0


def _seeded_exact(base: ArmRuns, cand: ArmRuns) -> dict[str, Any] | None:
    """The candidate's seeded T>0 samples vs the baseline's, token for token, against the baseline's
    own seeded A/A run (the same samples at another batch shape); None without T>0 samples."""
    if base.sampled is None or cand.sampled is None:
        return None
    pairs = _seeded_pairs(base.sampled, cand.sampled)
    aa = _seeded_pairs(base.sampled, base.sampled_aa) if base.sampled_aa is not None else None
    n, mm = pairs["n"], pairs["mismatches"]
    aa_mm, aa_n = (aa["mismatches"], aa["n"]) if aa else (0, n)  # no A/A: judged against none
    steps = cand.sampled.verifier_steps
    return {"candidate": pairs, "aa": aa, "aa_mode": base.sampled_aa.mode if base.sampled_aa else None,
            "excess_mismatch": mm / n - aa_mm / max(1, aa_n) if n else None,
            "p_value": stats.fisher_greater_p(mm, n, aa_mm, aa_n) if n else None,
            "verifier_steps": steps, "coupled": coupled_of(steps)}


def analyse(items: list[EvalItem], base: ArmRuns, cand: ArmRuns, policy: dict[str, Any],
            classifiers: list[Any], latency_ids: list[str], dtype: str | None = None) -> dict[str, Any]:
    """All measurements, every criterion of ``criteria.CRITERIA`` with value / threshold / pass, and the
    verdict (``dtype``: the arms' engine dtype, None when unknown as in endpoint mode: it sets the
    impossible-token floor)."""
    alpha = policy["alpha"]
    method = policy["multiple_testing"]
    boot = policy["bootstrap"]
    by_id = {it.id: it for it in items}
    names = [c.name for c in classifiers]
    bsc = {x["item_id"]: x for x in _score(by_id, base.greedy, classifiers)}
    csc = {x["item_id"]: x for x in _score(by_id, cand.greedy, classifiers)}
    ids = [it.id for it in items]
    bpass = [bsc[i]["passed"] for i in ids]
    cpass = [csc[i]["passed"] for i in ids]
    overall = stats.paired_rates(bpass, cpass, resamples=boot["resamples"], confidence=boot["confidence"],
                                 seed=boot["seed"])
    tasks = sorted({it.task for it in items})
    per_task = []
    for t in tasks:
        sel = [k for k, i in enumerate(ids) if by_id[i].task == t]
        pr = stats.paired_rates([bpass[k] for k in sel], [cpass[k] for k in sel],
                                resamples=boot["resamples"], confidence=boot["confidence"], seed=boot["seed"])
        per_task.append({"task": t, **asdict(pr)})
    for row, padj in zip(per_task, stats.adjust_pvalues([r["p_value"] for r in per_task], method)):
        row["p_adjusted"] = padj
    exact_match = _exact_match(base, cand)

    behaviour = []
    for name in names:
        bf = [bsc[i]["flags"][name] for i in ids]
        cf = [csc[i]["flags"][name] for i in ids]
        pr = stats.paired_rates(bf, cf, resamples=boot["resamples"], confidence=boot["confidence"], seed=boot["seed"])
        behaviour.append({"classifier": name, **asdict(pr)})
    for row, padj in zip(behaviour, stats.adjust_pvalues([r["p_value"] for r in behaviour], method)):
        row["p_adjusted"] = padj

    sampled = None
    if base.sampled is not None and cand.sampled is not None:
        sampled = _sampled(_score(by_id, base.sampled, classifiers), _score(by_id, cand.sampled, classifiers),
                           base.sampled, cand.sampled, policy["criteria"]["sampled"], method, names, dtype)
    lat_b = latency_summary(base.greedy, base.sequential, latency_ids)
    lat_c = latency_summary(cand.greedy, cand.sequential, latency_ids)
    bt, ct = lat_b.get("seq_tokens_per_s"), lat_c.get("seq_tokens_per_s")
    latency = {"baseline": lat_b, "candidate": lat_c, "speedup_batch1": ct / bt if bt and ct else None}

    seeded_exact = _seeded_exact(base, cand)
    cx = Context(items, base, cand, policy, {"baseline": bsc, "candidate": csc}, overall, per_task,
                 exact_match, behaviour, sampled, latency, seeded_exact)
    criteria = [criterion(cx) for criterion in CRITERIA]
    failed = [x["name"] for x in criteria if x["required"] and x["passed"] is not True]
    # a required criterion that could not be measured (None) fails the gate too
    verdict = "FAIL" if failed else "PASS"
    p_disc = (overall.n10 + overall.n01) / max(1, overall.n)
    return {
        "verdict": verdict, "failed": failed, "criteria": criteria,
        "n_items": len(items), "tasks": tasks,
        "pass_rate": {"overall": asdict(overall), "per_task": per_task},
        "exact_match": exact_match,
        "behaviour": behaviour, "sampled": sampled, "seeded_exact": seeded_exact,
        "latency": latency,
        "mde": {"observed_discordance": p_disc,
                "pass_rate_delta_at_80pct_power": stats.mcnemar_mde(len(items), max(p_disc, 1 / len(items)), alpha=alpha)},
        "items": [{"id": i, "task": by_id[i].task, "baseline_passed": bsc[i]["passed"],
                   "candidate_passed": csc[i]["passed"], "baseline_detail": bsc[i]["detail"],
                   "candidate_detail": csc[i]["detail"], "baseline_flags": bsc[i]["flags"],
                   "candidate_flags": csc[i]["flags"],
                   "first_divergence": stats.first_divergence(base.greedy.by_item()[i].token_ids,
                                                              cand.greedy.by_item()[i].token_ids)}
                  for i in ids],
        "flag_counts": {"baseline": dict(Counter(n for x in bsc.values() for n, f in x["flags"].items() if f)),
                        "candidate": dict(Counter(n for x in csc.values() for n, f in x["flags"].items() if f))},
    }
