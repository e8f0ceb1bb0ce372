"""The release gate's criteria: one function per criterion, judged in the order of ``CRITERIA``.

``analysis.analyse()`` measures both arms, puts the measurements in a ``Context`` and calls every
function in ``CRITERIA`` with it; each returns one ``crit(...)`` dict (name, measured value, threshold
text, passed -- None when not measured --, required, detail).  A required criterion that did not pass
fails the gate.  Adding a criterion: one function here and its entry in ``CRITERIA`` (its policy keys
go in ``policy.py`` and ``default_policy.yaml``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_lookahead.gate import stats
from vllm_lookahead.gate.engine import ArmRuns
from vllm_lookahead.gate.evalset import EvalItem


def crit(name: str, measured: Any, threshold: str, passed: bool | None, required: bool,
         detail: str = "") -> dict[str, Any]:
    return {"name": name, "measured": measured, "threshold": threshold, "passed": passed,
            "required": required, "detail": detail}


@dataclass
class Context:
    """The inputs of ``analyse()`` and its measurements (the report's sections of the same names)."""

    items: list[EvalItem]
    base: ArmRuns
    cand: ArmRuns
    policy: dict[str, Any]
    scores: dict[str, dict[str, dict[str, Any]]]  # "baseline"/"candidate" -> item id -> T=0 scored row
    overall: stats.PairedRates
    per_task: list[dict[str, Any]]  # a criterion may add columns (``ni_p_adjusted``): they are reported
    exact_match: dict[str, Any]
    behaviour: list[dict[str, Any]]  # likewise
    sampled: dict[str, Any] | None
    latency: dict[str, Any]
    seeded_exact: dict[str, Any] | None = None  # seeded T>0 samples paired with the baseline's


def pass_rate_overall(cx: Context) -> dict[str, Any]:
    """The candidate answers the eval set no worse than the baseline: the paired pass-rate change, with
    non-inferiority proven when the policy sets ``ni_margin``."""
    c, alpha, o = cx.policy["criteria"]["pass_rate_overall"], cx.policy["alpha"], cx.overall
    sig = o.p_value < alpha and o.delta < 0
    ni_txt, ni_ok = "", True
    if c.get("ni_margin"):
        p_ni = stats.paired_noninferiority_p(o.n10, o.n01, o.n, c["ni_margin"])
        ni_ok = p_ni < alpha
        ni_txt = f" and delta > -{c['ni_margin']} proven (non-inferiority p < {alpha})"
    return crit(
        "pass_rate_overall", round(o.delta, 4),
        f"delta >= -{c['max_drop']} and no significant drop (p < {alpha})" + ni_txt,
        not (o.delta < -c["max_drop"] or sig) and ni_ok, True,
        f"baseline {o.base_rate:.3f} -> candidate {o.cand_rate:.3f}, "
        f"{o.n10} regressions / {o.n01} improvements, McNemar p={o.p_value:.3g}, "
        f"{int(cx.policy['bootstrap']['confidence'] * 100)}% CI [{o.ci_low:+.3f}, {o.ci_high:+.3f}]" +
        (f", non-inferiority (margin {c['ni_margin']}) p={p_ni:.3g}" if ni_txt else ""))


def pass_rate_per_task(cx: Context) -> dict[str, Any]:
    """No task may regress, even when the overall rate hides it: every task's pass-rate change,
    adjusted across tasks."""
    c, alpha, method = cx.policy["criteria"]["pass_rate_per_task"], cx.policy["alpha"], cx.policy["multiple_testing"]
    if c.get("ni_margin"):
        ps = [stats.paired_noninferiority_p(r["n10"], r["n01"], r["n"], c["ni_margin"]) for r in cx.per_task]
        for r, padj in zip(cx.per_task, stats.adjust_pvalues(ps, method)):
            r["ni_p_adjusted"] = padj
    bad = [r for r in cx.per_task if r["delta"] < -c["max_drop"] or (r["p_adjusted"] < alpha and r["delta"] < 0)
           or r.get("ni_p_adjusted", 0.0) >= alpha]
    worst = min(cx.per_task, key=lambda r: r["delta"])
    return crit(
        "pass_rate_per_task", round(worst["delta"], 4),
        f"every task: delta >= -{c['max_drop']} and no significant drop ({method}-adjusted p < {alpha})" +
        (f" and delta > -{c['ni_margin']} proven (adjusted non-inferiority p < {alpha})" if c.get("ni_margin") else ""),
        not bad, True, f"worst task {worst['task']} ({worst['delta']:+.3f}); failing: "
        f"{', '.join(r['task'] for r in bad) or 'none'}")


def exact_match(cx: Context) -> dict[str, Any]:
    """Greedy (T=0) outputs must stay token-identical beyond what the baseline's own A/A run varies.
    Batch 1 too: some drafters (lookahead's free drafting) only run when a request is alone, so the
    candidate's one-at-a-time outputs are compared with the baseline's batched greedy outputs, judged
    against the pooled A/A rate (chunks vs all-at-once, and the baseline's own one-at-a-time run)."""
    c, alpha, em = cx.policy["criteria"]["exact_match"], cx.policy["alpha"], cx.exact_match
    cand, aa, b1 = em["candidate"], em["aa"], em["batch1"]
    aa_mm, aa_n = (aa["mismatches"], aa["n"]) if aa else (0, cand["n"])
    seq, seq_aa, seq_excess, p_seq = b1["candidate"], b1["aa"], b1["excess_mismatch"], b1["p_value"]
    seq_ok = seq_excess <= c["max_excess_mismatch"] and not (p_seq < alpha)
    seq_txt = (f"; batch 1: {seq['mismatches']}/{seq['n']} of the candidate's one-at-a-time outputs "
               f"differ from the baseline's batched ones (baseline's own batch-1 A/A "
               f"{seq_aa['mismatches'] if seq_aa else 'n/a'}/{seq_aa['n'] if seq_aa else 'n/a'}), excess "
               f"{seq_excess:+.3f}, p={p_seq:.3g}") if seq else "; batch 1: not run"
    return crit(
        "exact_match", round(max(em["excess_mismatch"], seq_excess), 4),
        f"mismatch(candidate) - mismatch(A/A) <= {c['max_excess_mismatch']} and not significantly higher (p < {alpha}), "
        "batched and at batch 1",
        em["excess_mismatch"] <= c["max_excess_mismatch"] and not (em["p_value"] < alpha) and seq_ok, True,
        f"T=0 token match vs baseline {cand['match_rate']:.3f} ({cand['mismatches']}/{cand['n']} differ); "
        f"A/A {1 - aa_mm / max(1, aa_n):.3f} ({aa_mm}/{aa_n} differ, {cx.base.aa.mode if cx.base.aa else 'not run'} "
        f"vs all at once); one-sided Fisher p={em['p_value']:.3g}" + seq_txt)


def behaviour(cx: Context) -> dict[str, Any]:
    """The sidecar's behavioural classifiers (refusal, invalid format, unsafe, degenerate) must not
    flag the candidate's outputs more often than the baseline's, per classifier."""
    c, alpha, method = cx.policy["criteria"]["behaviour"], cx.policy["alpha"], cx.policy["multiple_testing"]
    if c.get("ni_margin") and cx.behaviour:
        # a flag is bad: "non-inferior" = the increase is proven below the margin (roles swapped)
        ps = [stats.paired_noninferiority_p(r["n01"], r["n10"], r["n"], c["ni_margin"]) for r in cx.behaviour]
        for r, padj in zip(cx.behaviour, stats.adjust_pvalues(ps, method)):
            r["ni_p_adjusted"] = padj
    bad = [r for r in cx.behaviour if r["delta"] > c["max_increase"] or (r["p_adjusted"] < alpha and r["delta"] > 0)
           or r.get("ni_p_adjusted", 0.0) >= alpha]
    worst = max(cx.behaviour, key=lambda r: r["delta"]) if cx.behaviour else None
    return crit(
        "behaviour", round(worst["delta"], 4) if worst else 0.0,
        f"every classifier: flag-rate increase <= {c['max_increase']} and not significant" +
        (f" and increase < {c['ni_margin']} proven" if c.get("ni_margin") else ""),
        not bad, True, "; ".join(f"{r['classifier']} {r['base_rate']:.3f}->{r['cand_rate']:.3f}" for r in cx.behaviour))


def sampled_passes(sampled: dict[str, Any], alpha: float) -> tuple[float, bool]:
    """(smallest adjusted p, pass?) of the ``sampled`` criterion: every adjusted p >= alpha (impossible
    tokens included, ``stats.impossible_tokens_p``) and the samples were scored."""
    minp = min(sampled["p_adjusted"].values())
    return minp, bool(sampled["conformance"]["scored"]) and minp >= alpha


def sampled(cx: Context) -> dict[str, Any]:
    """Greedy outputs say nothing about sampling: a decoder can keep T=0 bit-identical and still sample
    from the wrong distribution.  The T>0 samples are judged under the baseline model (excess log-prob,
    PIT, likelihood shift, impossible tokens) and by their surface features, all tests adjusted together."""
    c, s = cx.policy["criteria"]["sampled"], cx.sampled
    if s is None:
        return crit("sampled", None, "T>0 run switched off (samples_per_item: 0)", None,
                    bool(c["required"]), "no T>0 samples: the T>0 distribution is not checked")
    minp, ok = sampled_passes(s, c["alpha"])
    conf = s["conformance"]
    if not conf["scored"]:
        extra = "T>0 samples were not scored under the baseline model; "
    else:
        oos = conf["out_of_support"]
        sh, lp = conf["shift"], conf["mean_token_logprob"]
        extra = (f"mean token log-prob {lp['baseline']:.4f} -> {lp['candidate']:.4f} nats, shift "
                 f"{sh['effect']:+.4f} [{sh['ci_low']:+.4f}, {sh['ci_high']:+.4f}] nats/token; excess log-prob "
                 f"candidate {conf['excess_candidate']['nats_per_token']:+.4f} nats/token "
                 f"p={conf['excess_candidate']['p_value']:.3g}, baseline control "
                 f"p={conf['excess_baseline_control']['p_value']:.3g}; PIT (AD) "
                 f"candidate p={conf['pit_candidate']['p_value']:.3g}, baseline control "
                 f"p={conf['pit_baseline_control']['p_value']:.3g}; out-of-support tokens "
                 f"{oos['baseline']}/{oos['candidate']}; scoring {sum(v or 0 for v in conf['scoring_s'].values()):.1f} s; ")
    return crit(
        "sampled", round(minp, 4),
        f"every T>0 test ({cx.policy['multiple_testing']}-adjusted p >= {c['alpha']}) and no out-of-support "
        "token beyond the baseline's",
        ok, bool(c["required"]),
        f"{' | '.join(s['profiles'])}, {s['n_candidate']} samples/arm; {extra}" +
        ", ".join(f"{k} p={v:.3g}" for k, v in s["p_adjusted"].items()))


def seeded_exact(cx: Context) -> dict[str, Any]:
    """A coupled candidate (lookahead's coupled verification on CPU float32) samples every output
    position as plain decoding does, so a per-request-seeded T>0 sample must be token-identical to the
    baseline's beyond what the baseline's own seeded A/A run varies (fp32 flips from batch shape).
    Required under ``required: auto`` only when the candidate is *measured* coupled: >= 1 T>0 drafted
    step verified by coupled verification and none by vLLM's rejection sampler (exact only in
    distribution: its seeded samples differ by design, and the ``sampled`` tests judge it)."""
    c, alpha, sx = cx.policy["criteria"]["seeded_exact"], cx.policy["alpha"], cx.seeded_exact
    mode = c["required"]
    threshold = (f"seeded T>0 samples token for token vs the baseline's: mismatch(candidate) - mismatch(A/A) "
                 f"<= {c['max_excess_mismatch']} and not significantly higher (one-sided Fisher p < {alpha})")
    if sx is None or not sx["candidate"]["n"]:
        why = ("no T>0 samples (samples_per_item: 0)" if sx is None else
               "no per-request-seeded T>0 samples (every sampled profile says seed: engine)")
        return crit("seeded_exact", None, threshold, None, mode is True, why + ": not measured")
    steps, coupled = sx["verifier_steps"], sx["coupled"]
    if coupled is None:
        why = ("coupling not measurable (endpoint candidate): " +
               ("required by the policy (required: true)" if mode is True else
                "not required under required: auto; the sampled statistical tests judge it"))
    elif coupled:
        why = (f"coupled ({steps['coupled']} T>0 drafted steps, all by coupled verification)"
               + (": required" if mode is not False else "; required: false"))
    else:
        rs, off = steps.get("rejection_sampler", 0), steps.get("coupled_off_cpu", 0)
        why = (f"not coupled: {rs} T>0 drafted steps verified by vLLM's rejection sampler, "
               f"{steps.get('coupled', 0)} by coupled verification" +
               (f", {off} by coupled verification off the CPU (token identity not checked on this device)"
                if off else "") +
               ("" if rs or off else " (a proposer other than lookahead's, or no drafts at T>0)") +
               ("; required by the policy (required: true)" if mode is True
                else "; the sampled statistical tests judge it"))
    required = mode is True or (mode == "auto" and coupled is True)
    cand, aa, excess, p = sx["candidate"], sx["aa"], sx["excess_mismatch"], sx["p_value"]
    aa_txt = (f"A/A {aa['mismatches']}/{aa['n']} ({sx['aa_mode']} vs all at once)" if aa
              else "A/A not run: judged against 0 mismatches")
    return crit(
        "seeded_exact", round(excess, 4), threshold,
        excess <= c["max_excess_mismatch"] and not p < alpha, required,
        f"{why}; {cand['mismatches']}/{cand['n']} seeded samples differ from the baseline's, {aa_txt}, "
        f"excess {excess:+.4f}, one-sided Fisher p={p:.3g}")


def latency(cx: Context) -> dict[str, Any]:
    """The speed-up the change is for (tokens/s at batch 1).  Informational unless the policy requires
    it, and even then one more condition: a latency win never clears the gate on its own."""
    c, lat_c, speedup = cx.policy["criteria"]["latency"], cx.latency["candidate"], cx.latency["speedup_batch1"]
    bt, ct = cx.latency["baseline"].get("seq_tokens_per_s"), lat_c.get("seq_tokens_per_s")
    return crit(
        "latency", round(speedup, 3) if speedup else None, f"speedup (tokens/s at batch 1) >= {c['min_speedup']}",
        (speedup >= c["min_speedup"]) if speedup else None, bool(c["required"]),
        f"baseline {bt or 0:.1f} tok/s, candidate {ct or 0:.1f} tok/s; compression {lat_c['compression'] or 1:.2f} "
        f"tokens/step, acceptance {lat_c['acceptance_rate'] if lat_c['acceptance_rate'] is not None else float('nan'):.3f}")


def acceptance_length(cx: Context) -> dict[str, Any]:
    """A speculative candidate's mean acceptance length (tokens per verify step) stays above a floor:
    it fails a release whose drafter silently stopped paying off while outputs stay exact."""
    c, lat_c = cx.policy["criteria"]["acceptance_length"], cx.latency["candidate"]
    mal = lat_c.get("mean_acceptance_length")
    speculative = bool(lat_c.get("drafts")) or bool(lat_c["drafted_tokens"])
    return crit(
        "acceptance_length", round(mal, 3) if mal else None,
        f"speculative candidate: mean acceptance length >= {c['min_mean_length']} tokens per verify step",
        (mal >= c["min_mean_length"]) if speculative and mal else None, bool(c["required"]) and speculative,
        (f"{lat_c['accepted_tokens']} of {lat_c['drafted_tokens']} drafted tokens accepted over "
         f"{lat_c.get('drafts')} drafting steps" if speculative else "candidate drafts no tokens: not speculative"))


# The registry: the report lists the criteria in this order.
CRITERIA = (pass_rate_overall, pass_rate_per_task, exact_match, behaviour, sampled, seeded_exact, latency,
            acceptance_length)
