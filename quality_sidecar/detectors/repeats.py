"""Independence of T>0 samples: how often a sample repeats an earlier sample of the same prompt.

Why: a decoder that reuses one random stream across requests (a per-request generator seeded from a
constant, a shared stream rewound per request) keeps the distribution of every single sample exact:
the PIT, the excess score and the impossible-token count all stay silent.  What it breaks is
independence: two requests with the same prompt and sampler come out the same.  The repeat rate
among same-prompt samples shows it, judged against the baseline arm's rate on the same traffic.

Per arm: a *comparison* is a T>0 sample whose prompt (and sampler) this arm has seen before, within a
memory of the last ``memory`` prompts; it *repeats* when its output token ids equal one of the (at
most 16) earlier outputs kept for that prompt.  Samples that carry an explicit ``seed`` are left out
(equal seeds repeat by design).  The candidate alarms when its repeats exceed the baseline's by the
one-sided Fisher exact test at ``alpha`` per update: exact when both arms see the same prompt mix
(mirrored or randomly split traffic), which is what a baseline arm is for.  The prompt memory is part
of the checkpointed state (a restart continues exactly; at most ``memory`` x 16 short hashes per arm).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

KEEP_OUTPUTS = 16


def repeat_keys(sample: Mapping[str, Any]) -> tuple[str, str] | None:
    """(prompt key, output key) of a T>0 sample the chart can use, else None."""
    s = sample.get("sampling") or {}
    out = sample.get("output") or {}
    if not (s.get("temperature") or 0) > 0 or s.get("seed") is not None or sample.get("error") \
            or out.get("finish_reason") in ("abort", "error") or not out.get("token_ids"):
        return None
    sampler = (s.get("temperature"), s.get("top_p"), s.get("top_k"), s.get("min_p"), s.get("max_tokens"))
    prompt = f"{(sample.get('prompt') or {}).get('sha256')}|{sampler}"
    output = hashlib.blake2b(repr(list(out["token_ids"])).encode(), digest_size=12).hexdigest()
    return prompt, output


class RepeatChart:
    """Repeat counts per arm of one model, with the prompt memory that finds the repeats."""

    STATE = ("arms", "seen")

    def __init__(self, alpha: float = 1e-6, memory: int = 10_000, restart_after_alarm: bool = False):
        self.alpha, self.memory, self.restart_after_alarm = alpha, memory, restart_after_alarm
        self.arms: dict[str, dict[str, Any]] = {}
        self._seen: dict[str, OrderedDict[str, list[str]]] = {}

    def _arm(self, arm: str) -> dict[str, Any]:
        return self.arms.setdefault(arm, {"comparisons": 0, "repeats": 0, "alarm": False, "alarm_index": None,
                                          "alarms": 0})

    def pvalue(self, arm: str) -> float:
        """One-sided Fisher exact p of this arm's repeat rate above the baseline arm's."""
        from scipy import stats

        st, base = self.arms.get(arm), self.arms.get("baseline")
        if arm == "baseline" or not st or not base or not base["comparisons"] or not st["repeats"]:
            return 1.0
        table = [[st["repeats"], st["comparisons"] - st["repeats"]],
                 [base["repeats"], base["comparisons"] - base["repeats"]]]
        return float(stats.fisher_exact(table, alternative="greater")[1])

    def add(self, arm: str, prompt_key: str, output_key: str):
        """Count one sample; returns a Result when it was a comparison, else None."""
        from .base import Result

        seen = self._seen.setdefault(arm, OrderedDict())
        outs = seen.get(prompt_key)
        st = self._arm(arm)
        if outs is None:
            seen[prompt_key] = [output_key]
            if len(seen) > self.memory:
                seen.popitem(last=False)
            return None
        seen.move_to_end(prompt_key)
        st["comparisons"] += 1
        if output_key in outs:
            st["repeats"] += 1
        elif len(outs) < KEEP_OUTPUTS:
            outs.append(output_key)
        p = self.pvalue(arm)
        new = p < self.alpha and not st["alarm"]
        if new:
            st["alarms"] += 1
            if st["alarm_index"] is None:
                st["alarm_index"] = st["comparisons"]
            st["alarm"] = not self.restart_after_alarm
        base = self.arms.get("baseline") or {}
        return Result("repeated_samples", st["repeats"] / st["comparisons"], self.alpha, st["alarm"] or new,
                      alarm_new=new, pvalue=p, n=st["comparisons"], alarm_index=st["alarm_index"],
                      extra={"repeats": st["repeats"], "comparisons": st["comparisons"],
                             "baseline_repeats": base.get("repeats", 0),
                             "baseline_comparisons": base.get("comparisons", 0)})

    def reset(self, arm: str | None = None) -> None:
        for a, st in self.arms.items():
            if arm is None or a == arm:
                st.update(comparisons=0, repeats=0, alarm=False, alarm_index=None)

    def get_state(self) -> dict[str, Any]:
        return {"arms": self.arms, "seen": {a: [[k, v] for k, v in m.items()] for a, m in self._seen.items()}}

    def set_state(self, st: Mapping[str, Any]) -> None:
        self.arms = {a: dict(v) for a, v in (st.get("arms") or {}).items()}
        self._seen = {a: OrderedDict((k, list(v)) for k, v in items) for a, items in (st.get("seen") or {}).items()}
