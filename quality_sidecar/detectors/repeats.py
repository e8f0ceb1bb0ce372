"""Independence of T>0 samples: how often two samples of the same prompt come out identical.

Why: a decoder that reuses one random stream across requests (a per-request generator seeded from a
constant, a shared stream rewound per request) keeps the distribution of every single sample exact:
the PIT, the excess score and the impossible-token count all stay silent.  What it breaks is
independence: two requests with the same prompt and sampler come out the same.

The test must hold under any traffic split (a 5-10% baseline holdback is normal), so each arm's
evidence is made comparable first:

- **equal numbers**: per arm and prompt (and sampler), outputs are paired two at a time, disjointly;
  a pair is a *comparison*, a *repeat* when the two are equal, with probability sum_i p_i^2 whatever
  the arm's traffic (comparing with every earlier output would favour the busier arm);
- **same prompts**: each candidate comparison is matched with a baseline comparison of the same prompt
  (first come, first matched; the busier arm's surplus waits, at most ``KEEP_WAITING`` per prompt).
  Under an exact decoder the two outcomes of a match are i.i.d., so among *discordant* matches (one
  arm repeats, the other not) the candidate's share is Binomial(n, 1/2).

The candidate alarms when that one-sided exact binomial test gives p < ``alpha`` (1e-6) at a new
discordant match: at most ``alpha`` x (discordant matches) false alarms, whatever the split or the
prompt mix.  Samples with an explicit ``seed`` are left out (equal seeds repeat by design).  The prompt
memory (at most ``memory`` prompts) is checkpointed, so a restart continues exactly.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from .base import ArmControlChart, Result

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


class RepeatChart(ArmControlChart):
    """Prompt-matched repeat comparisons of the two arms of one model (see the module docstring).

    An ``ArmControlChart``: per-arm counts in ``arms``, the candidate judged against the control
    (baseline) arm.  State: ``arms`` and ``seen`` (the prompt memory, oldest first)."""

    STATE = ("arms", "seen")

    def __init__(self, alpha: float = 1e-6, memory: int = 10_000, restart_after_alarm: bool = False):
        super().__init__(alpha, restart_after_alarm)
        self.memory = memory
        # prompt key -> {"open": {arm: output key waiting for its pair partner},
        #                "wait": {arm: [repeat outcomes waiting for a match in the other arm]}}
        self.seen: OrderedDict[str, dict[str, dict[str, Any]]] = OrderedDict()
        self._p: float | None = None  # the candidate's p-value, derived from ``arms`` (not state)

    def _fresh_arm(self) -> dict[str, Any]:
        return {"comparisons": 0, "repeats": 0, "matched": 0, "discordant": 0, "repeats_discordant": 0}

    def pvalue(self, arm: str = "candidate") -> float:
        """One-sided exact binomial p of the candidate repeating in more discordant matches than chance."""
        from scipy import stats

        st = self.arms.get(self.CANDIDATE)
        if arm != self.CANDIDATE or not st or not st["discordant"]:
            return 1.0
        return float(stats.binom.sf(st["repeats_discordant"] - 1, st["discordant"], 0.5))

    def update(self, arm: str, prompt_key: str, output_key: str) -> Result:
        """Count one sample; returns the candidate's Result (``alarm_new`` only on the match that fired)."""
        new = self._count(arm, prompt_key, output_key) if arm in ARMS else False
        return self._result(new)

    def _count(self, arm: str, prompt_key: str, output_key: str) -> bool:
        """Pair the sample, match the pair across arms; True when a completed match fired the alarm."""
        entry = self.seen.get(prompt_key)
        if entry is None:
            entry = self.seen[prompt_key] = {"open": {}, "wait": {"baseline": [], "candidate": []}}
            if len(self.seen) > self.memory:
                self.seen.popitem(last=False)
        self.seen.move_to_end(prompt_key)
        first = entry["open"].pop(arm, None)
        if first is None:
            entry["open"][arm] = output_key
            return False
        repeat = first == output_key
        st = self._arm(arm)
        st["comparisons"] += 1
        st["repeats"] += repeat
        other = self.CANDIDATE if arm == self.CONTROL else self.CONTROL
        if not entry["wait"][other]:
            if len(entry["wait"][arm]) < KEEP_WAITING:
                entry["wait"][arm].append(repeat)
            return False
        partner = entry["wait"][other].pop(0)
        cand_rep, base_rep = (repeat, partner) if arm == self.CANDIDATE else (partner, repeat)
        cand = self._arm(self.CANDIDATE)
        self._arm(self.CONTROL)["matched"] += 1
        cand["matched"] += 1
        if cand_rep != base_rep:
            cand["discordant"] += 1
            cand["repeats_discordant"] += cand_rep
        self._p = self.pvalue()
        return self._judge(cand, self._p, cand["comparisons"])

    def _result(self, new: bool) -> Result:
        """The candidate's Result; its p-value changes only when a match completes (cached till then)."""
        cand = self.arms.get(self.CANDIDATE) or {**self._fresh_arm(), "alarm": False, "alarm_index": None}
        base = self.control()
        if self._p is None:
            self._p = self.pvalue()
        return Result("repeated_samples", cand["repeats"] / max(1, cand["comparisons"]), self.alpha,
                      cand["alarm"] or new, alarm_new=new, pvalue=self._p, n=cand["comparisons"],
                      alarm_index=cand["alarm_index"],
                      extra={"arm": "candidate", "repeats": cand["repeats"], "comparisons": cand["comparisons"],
                             "matched": cand["matched"], "discordant": cand["discordant"],
                             "candidate_only_repeats": cand["repeats_discordant"],
                             "baseline_repeats": base.get("repeats", 0),
                             "baseline_comparisons": base.get("comparisons", 0)})

    def _reset_arm(self, arm: str) -> None:
        """Counts restart, the alarm count and the prompt memory stay."""
        self.arms[arm].update(self._fresh_arm(), alarm=False, alarm_index=None)
        self._p = None

    def _after_set_state(self) -> None:
        self._p = None

    def _encode_state(self, name: str, value: Any) -> Any:
        return [[k, v] for k, v in value.items()] if name == "seen" else value

    def _decode_state(self, name: str, value: Any) -> Any:
        if name == "seen":
            return OrderedDict((k, v) for k, v in value)
        return super()._decode_state(name, value)
