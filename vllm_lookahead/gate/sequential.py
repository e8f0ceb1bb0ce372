"""Sequential stopping: run the eval set in ``sequential.looks`` stages and stop at the first look where
a FAIL is already decided, with the false-FAIL rate still at most ``alpha``.

Boundary: Lan-DeMets O'Brien-Fleming-type alpha spending, alpha(t) = 2 - 2 Phi(z_{1 - alpha/2} / sqrt(t))
at information fraction t = k / K (items run so far / all items), and each look k tests at the
*increment* a_k = alpha(t_k) - alpha(t_{k-1}).  A FAIL at any look needs a test significant at its own
a_k, so P(any false FAIL) <= sum_k a_k = alpha by the union bound, whatever the dependence between
looks (conservative next to exact group-sequential boundaries, which would need the joint law of every
criterion's statistic).  O'Brien-Fleming spends almost nothing early (3 looks at alpha 0.05: 0.0007,
0.0157, 0.0336), so a candidate is stopped early only on overwhelming evidence -- a broken decoder
after the first third -- and the last look keeps most of the power.  The ``sampled`` family spends
its own ``sampled.alpha`` the same way.

Only FAIL stops early.  A PASS needs every required criterion to pass, and the point tolerances
(``max_drop``, ``max_excess_mismatch``...) and the T>0 tests have no "proven fine" boundary short of
the whole set, so PASS is decided at the last look only.  Point-tolerance failures do not stop early
either (an interim estimate over few items is noise); they are judged at the last look.
"""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from typing import Any

from scipy import stats

from vllm_lookahead.gate.engine import ArmRuns, RunResult
from vllm_lookahead.gate.evalset import EvalItem


def obf_spending(t: float, alpha: float) -> float:
    """Lan-DeMets O'Brien-Fleming-type cumulative alpha spent at information fraction t in [0, 1]."""
    if t <= 0:
        return 0.0
    z = stats.norm.ppf(1 - alpha / 2)
    return float(min(alpha, 2 - 2 * stats.norm.cdf(z / math.sqrt(min(t, 1.0)))))


def look_alphas(looks: int, alpha: float, fractions: list[float] | None = None) -> list[float]:
    """Nominal level of each look (increments of the spending function; they sum to alpha)."""
    ts = fractions or [(k + 1) / looks for k in range(looks)]
    spent = [obf_spending(t, alpha) for t in ts]
    spent[-1] = alpha  # the last look spends what is left
    return [spent[0]] + [spent[k] - spent[k - 1] for k in range(1, len(spent))]


def split(items: list[EvalItem], looks: int) -> list[list[EvalItem]]:
    """Stages with every task in each (round-robin within task), in the items' order."""
    rank: dict[str, int] = {}
    stages: list[list[EvalItem]] = [[] for _ in range(looks)]
    for it in items:
        r = rank.get(it.task, 0)
        rank[it.task] = r + 1
        stages[r % looks].append(it)
    return [s for s in stages if s]


def _merge_run(a: RunResult | None, b: RunResult | None) -> RunResult | None:
    if a is None or b is None:
        return a or b
    counters: dict[str, Any] = dict(a.engine_counters)
    for k, v in b.engine_counters.items():
        w = counters.get(k)
        if isinstance(v, list):
            w = w or []
            counters[k] = [(w[i] if i < len(w) else 0) + (v[i] if i < len(v) else 0) for i in range(max(len(v), len(w)))]
        else:
            counters[k] = (w or 0) + v
    scores = (a.scores or []) + (b.scores or []) if a.scores is not None and b.scores is not None else None
    steps = ({k: a.verifier_steps.get(k, 0) + b.verifier_steps.get(k, 0)
              for k in {*a.verifier_steps, *b.verifier_steps}}
             if a.verifier_steps is not None and b.verifier_steps is not None else None)
    return replace(a, wall_s=a.wall_s + b.wall_s, records=a.records + b.records, engine_counters=counters,
                   scores=scores, scoring_s=(a.scoring_s or 0) + (b.scoring_s or 0) if scores is not None else None,
                   verifier_steps=steps)


def merge(a: ArmRuns | None, b: ArmRuns) -> ArmRuns:
    """One arm's runs of stages 1..k as if they had been one run (records concatenated)."""
    if a is None:
        return b
    greedy = _merge_run(a.greedy, b.greedy)
    assert greedy is not None
    return ArmRuns(greedy, _merge_run(a.sequential, b.sequential), _merge_run(a.sampled, b.sampled),
                   a.startup_s + b.startup_s, _merge_run(a.aa, b.aa), _merge_run(a.sampled_aa, b.sampled_aa))


def policy_at(policy: dict[str, Any], a: float, a_sampled: float) -> dict[str, Any]:
    p = copy.deepcopy(policy)
    p["alpha"] = a
    p["criteria"]["sampled"]["alpha"] = a_sampled
    return p


def decided_fail(result: dict[str, Any], a: float, a_sampled: float) -> list[str]:
    """Required criteria whose *test* already rejects at this look's level (point tolerances excluded)."""
    req = {c["name"] for c in result["criteria"] if c["required"]}
    out = []
    pr = result["pass_rate"]
    if "pass_rate_overall" in req and pr["overall"]["p_value"] < a and pr["overall"]["delta"] < 0:
        out.append("pass_rate_overall")
    if "pass_rate_per_task" in req and any(r["p_adjusted"] < a and r["delta"] < 0 for r in pr["per_task"]):
        out.append("pass_rate_per_task")
    em = result["exact_match"]
    if "exact_match" in req and (em["p_value"] < a or em["batch1"]["p_value"] < a):
        out.append("exact_match")
    if "behaviour" in req and any(r["p_adjusted"] < a and r["delta"] > 0 for r in result["behaviour"]):
        out.append("behaviour")
    sm = result.get("sampled")
    if "sampled" in req and sm and sm["conformance"]["scored"] and min(sm["p_adjusted"].values()) < a_sampled:
        out.append("sampled")  # impossible tokens are one of the p-values
    sx = result.get("seeded_exact")
    if "seeded_exact" in req and sx and sx["p_value"] is not None and sx["p_value"] < a:
        out.append("seeded_exact")
    return out
