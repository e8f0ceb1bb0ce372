"""Independence of T>0 samples: how often two samples of the same prompt come out identical.

Why: a decoder that reuses one random stream across requests (a per-request generator seeded from a
constant, a shared stream rewound per request) keeps the distribution of every single sample exact:
the PIT, the excess score and the impossible-token count all stay silent.  What it breaks is
independence: two requests with the same prompt and sampler come out the same.

The test must hold under any split of traffic between the arms (a 5-10% baseline holdback is the normal
deployment), so each arm's evidence is made comparable before it is compared:

- **equal numbers**: per arm and prompt (and sampler), outputs are taken two at a time in disjoint
  pairs; a pair is one *comparison*, a *repeat* when the two are equal.  Its probability is
  sum_i p_i^2 for that prompt whatever the arm's traffic (comparing each sample with every earlier
  output would favour the busier arm, which has more earlier outputs to match);
- **same prompts**: each candidate comparison is matched with a baseline comparison of the same prompt
  (first come, first matched; the busier arm's surplus waits, at most ``KEEP_WAITING`` per prompt).
  Under an exact decoder the two outcomes of a match are independent and identically distributed,
  so among *discordant* matches (one arm repeats, the other does not) the candidate's share is
  Binomial(n, 1/2).

The candidate alarms when that one-sided exact binomial test gives p < ``alpha`` (1e-6), tested at each
new discordant match: at most ``alpha`` x (discordant matches) false alarms, with no assumption on the
split or the prompt mix.  Samples that carry an explicit ``seed`` are left out (equal seeds repeat by
design).  The prompt memory is part of the checkpointed state (a restart continues exactly; at most
``memory`` prompts, a few short hashes each).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

KEEP_WAITING = 16  # unmatched comparisons kept per prompt and arm
ARMS = ("baseline", "candidate")


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
    """Prompt-matched repeat comparisons of the two arms of one model (see the module docstring)."""

    STATE = ("arms", "seen")

    def __init__(self, alpha: float = 1e-6, memory: int = 10_000, restart_after_alarm: bool = False):
        self.alpha, self.memory, self.restart_after_alarm = alpha, memory, restart_after_alarm
        self.arms: dict[str, dict[str, Any]] = {}
        # prompt key -> {"open": {arm: output key waiting for its pair partner},
        #                "wait": {arm: [repeat outcomes waiting for a match in the other arm]}}
        self._seen: OrderedDict[str, dict[str, dict[str, Any]]] = OrderedDict()

    def _arm(self, arm: str) -> dict[str, Any]:
        return self.arms.setdefault(arm, {"comparisons": 0, "repeats": 0, "matched": 0, "discordant": 0,
                                          "repeats_discordant": 0, "alarm": False, "alarm_index": None, "alarms": 0})

    def pvalue(self, arm: str = "candidate") -> float:
        """One-sided exact binomial p of the candidate repeating in more discordant matches than chance."""
        from scipy import stats

        st = self.arms.get("candidate")
        if arm != "candidate" or not st or not st["discordant"]:
            return 1.0
        return float(stats.binom.sf(st["repeats_discordant"] - 1, st["discordant"], 0.5))

    def add(self, arm: str, prompt_key: str, output_key: str):
        """Count one sample; returns the candidate's Result when it completed a match, else None."""
        from .base import Result

        if arm not in ARMS:
            return None
        entry = self._seen.get(prompt_key)
        if entry is None:
            entry = self._seen[prompt_key] = {"open": {}, "wait": {"baseline": [], "candidate": []}}
            if len(self._seen) > self.memory:
                self._seen.popitem(last=False)
        self._seen.move_to_end(prompt_key)
        first = entry["open"].pop(arm, None)
        if first is None:
            entry["open"][arm] = output_key
            return None
        repeat = first == output_key
        st = self._arm(arm)
        st["comparisons"] += 1
        st["repeats"] += repeat
        other = "candidate" if arm == "baseline" else "baseline"
        if not entry["wait"][other]:
            if len(entry["wait"][arm]) < KEEP_WAITING:
                entry["wait"][arm].append(repeat)
            return None
        partner = entry["wait"][other].pop(0)
        cand_rep, base_rep = (repeat, partner) if arm == "candidate" else (partner, repeat)
        cand = self._arm("candidate")
        self._arm("baseline")["matched"] += 1
        cand["matched"] += 1
        if cand_rep != base_rep:
            cand["discordant"] += 1
            cand["repeats_discordant"] += cand_rep
        p = self.pvalue()
        new = p < self.alpha and not cand["alarm"]
        if new:
            cand["alarms"] += 1
            if cand["alarm_index"] is None:
                cand["alarm_index"] = cand["comparisons"]
            cand["alarm"] = not self.restart_after_alarm
        base = self.arms["baseline"]
        return Result("repeated_samples", cand["repeats"] / max(1, cand["comparisons"]), self.alpha,
                      cand["alarm"] or new, alarm_new=new, pvalue=p, n=cand["comparisons"],
                      alarm_index=cand["alarm_index"],
                      extra={"arm": "candidate", "repeats": cand["repeats"], "comparisons": cand["comparisons"],
                             "matched": cand["matched"], "discordant": cand["discordant"],
                             "candidate_only_repeats": cand["repeats_discordant"],
                             "baseline_repeats": base["repeats"], "baseline_comparisons": base["comparisons"]})

    def reset(self, arm: str | None = None) -> None:
        for a, st in self.arms.items():
            if arm is None or a == arm:
                st.update(comparisons=0, repeats=0, matched=0, discordant=0, repeats_discordant=0, alarm=False,
                          alarm_index=None)

    def get_state(self) -> dict[str, Any]:
        return {"arms": self.arms, "seen": [[k, v] for k, v in self._seen.items()]}

    def set_state(self, st: Mapping[str, Any]) -> None:
        self.arms = {a: dict(v) for a, v in (st.get("arms") or {}).items()}
        self._seen = OrderedDict((k, v) for k, v in (st.get("seen") or []))
