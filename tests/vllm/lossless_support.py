"""Helpers shared by the exactness tests of the chain (test_lossless.py) and the 2D layout (test_lade2d.py)."""

from __future__ import annotations

from collections import Counter

import numpy as np
from scipy import stats

from vllm_lookahead.prompts import load_heldout_prompts


def heldout_prompts() -> list[str]:
    """The 32 held-out prompts both exactness suites compare on."""
    return load_heldout_prompts(32, "mixed", seed=11)


def generate_in_chunks(llm, prompts, bs, sp):
    """``generate()`` on chunks of ``bs`` prompts (static batches of that size); request outputs in order."""
    outs = []
    for i in range(0, len(prompts), bs):
        outs.extend(llm.generate(prompts[i : i + bs], sp, use_tqdm=False))
    return outs


def token_position_pvalue(a: list[list[int]], b: list[list[int]], pos: int) -> float:
    """Chi-square homogeneity p-value of the token at ``pos`` in two sets of samples (a missing
    token counts as -1; tokens seen fewer than 10 times in total are pooled into one category)."""
    ca = Counter(s[pos] if len(s) > pos else -1 for s in a)
    cb = Counter(s[pos] if len(s) > pos else -1 for s in b)
    keys = sorted(set(ca) | set(cb), key=lambda t: -(ca[t] + cb[t]))
    big = [t for t in keys if ca[t] + cb[t] >= 10]
    table = np.array([[ca[t] for t in big] + [sum(ca[t] for t in keys if t not in big)],
                      [cb[t] for t in big] + [sum(cb[t] for t in keys if t not in big)]])
    table = table[:, table.sum(0) > 0]
    if table.shape[1] < 2:
        return 1.0
    return float(stats.chi2_contingency(table)[1])


def sample_run(name: str, outs, temperature: float, seed: int = 0):
    """vLLM ``RequestOutput``s of T>0 samples as a gate ``RunResult`` (one record per sample), ready for
    ``gate.inprocess_scoring.score_runs``, which judges them under plain sampling at ``temperature`` (the
    sampler the samples claim, whatever drew them)."""
    from vllm_lookahead.gate.engine import RequestRecord, RunResult

    recs = [RequestRecord(item_id="p", sample=i, token_ids=list(o.outputs[0].token_ids), text="",
                          finish_reason=o.outputs[0].finish_reason, num_prompt_tokens=len(o.prompt_token_ids),
                          prompt_token_ids=list(o.prompt_token_ids)) for i, o in enumerate(outs)]
    return RunResult(name=name, decoder={}, mode="batch", sampling=[{"temperature": temperature}], seed=seed, wall_s=0.0, records=recs)


def likelihood_pvalues(run) -> dict[str, float]:
    """One-sample tests of a scored run under the model: Anderson-Darling p of the randomized PIT at
    each token position (``pit_pos<j>``) and the excess log-prob test's p over all tokens (``excess``)."""
    from quality_sidecar.detectors.conformance_stats import excess_test, excess_totals, pit_test

    by_pos: dict[int, list[float]] = {}
    for sc in run.scores:
        for j, u in enumerate(sc["pit"]):
            by_pos.setdefault(j, []).append(u)
    out = {f"pit_pos{j}": pit_test(v).pvalue for j, v in sorted(by_pos.items())}
    out["excess"] = excess_test(*excess_totals(sc["excess"] for sc in run.scores)).pvalue
    return out
