"""T=0 paired exact match: the sharpest correctness signal for a lossless speculative decoder.

At temperature 0 a lossless decoder must reproduce the baseline's token ids for the same prompt, up to
the batch non-invariance of the kernels (vLLM #5898 and friends), so mismatches are judged against an
A/A mismatch rate (baseline vs baseline), never against a bare 100%.  Pairs come from the baseline arm
(same ``prompt.sha256`` and sampling params) or from replaying the prompt against ``--baseline-url``.

``PairedExactMatch`` keeps a Bernoulli CUSUM on the mismatch indicator (p0 = A/A rate) and the
first-divergence positions (early, repeated divergence points smell like a bug; late, scattered ones
like numerics).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import Result, StatefulDetector
from .cusum import BernoulliCUSUM


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (the shorter length if one is a prefix); None if equal."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else n


def mcnemar_test(base_pass: Sequence[bool], new_pass: Sequence[bool]):
    """Exact McNemar on paired pass/fail (binomial test on the discordant pairs)."""
    from scipy.stats import binomtest

    from .twosample import TestResult

    b, n = np.asarray(base_pass, bool), np.asarray(new_pass, bool)
    n10, n01 = int((b & ~n).sum()), int((~b & n).sum())
    if n10 + n01 == 0:
        return TestResult("mcnemar", 0.0, 1.0, "no discordant pairs")
    p = binomtest(n10, n10 + n01, 0.5).pvalue
    return TestResult("mcnemar", float((n01 - n10) / len(b)), float(p), f"n10={n10} n01={n01}")


class PairedExactMatch(StatefulDetector):
    """Detector for T=0 pairs; ``update`` takes a batch of (candidate_ids, baseline_ids) pairs.

    The in-control mismatch rate p0 is the A/A rate: how often two runs of the *baseline* disagree
    on one prompt (batch non-invariance of the kernels). ``aa_rate`` is the configured stand-in until
    A/A data exists (default 0.002, a conservative floor). ``fit(reference)`` takes A/A pairs
    directly, and ``learn_aa(pairs, mismatches)`` re-tunes p0 from A/A counts gathered live. In both
    cases p0 is the one-sided 90% upper Jeffreys bound, as in ``BernoulliCUSUM.fit``, because an
    underestimated p0 means false alarms. ``aa_source_`` says which rate is in use and from how
    many pairs, and each ``Result`` carries it into the alarm detail.
    """

    STATE = ("chart", "pairs_", "matches_", "positions_", "aa_source_")

    def __init__(self, ert: float, delta: float = 0.01, aa_rate: float | None = None,
                 restart_after_alarm: bool = False):
        self.chart = BernoulliCUSUM("exact_match", ert, delta=delta, p_floor=0.002,
                                    restart_after_alarm=restart_after_alarm)
        self.aa_rate = aa_rate

    def fit(self, reference: Sequence[tuple[Sequence[int], Sequence[int]]] = ()) -> PairedExactMatch:
        ref = [first_divergence(a, b) is not None for a, b in reference]
        if ref:
            self.chart.fit(ref)
            self.aa_source_ = {"source": "A/A reference pairs", "pairs": len(ref), "mismatches": int(sum(ref)),
                               "rate": self.chart.p0_}
        else:
            rate = self.aa_rate if self.aa_rate is not None else 0.002
            self.chart._set_p0(rate)
            self.aa_source_ = {"source": "configured aa_mismatch_rate", "pairs": 0, "mismatches": 0,
                               "rate": self.chart.p0_}
        self.pairs_, self.matches_ = 0, 0
        self.positions_: Counter = Counter()
        return self

    def learn_aa(self, pairs: int, mismatches: int, source: str = "learned from A/A pairs") -> None:
        """Re-tune p0 to the 90% upper Jeffreys bound of ``mismatches / pairs`` (A/A counts).

        The running CUSUM sum and a latched alarm are kept: the new rate changes how future pairs
        count, not the evidence already seen."""
        from scipy.stats import beta

        if pairs <= 0:
            raise ValueError("learn_aa needs at least one A/A pair")
        self.chart._set_p0(float(beta.ppf(0.9, mismatches + 0.5, pairs - mismatches + 0.5)), keep_statistic=True)
        self.aa_source_ = {"source": source, "pairs": int(pairs), "mismatches": int(mismatches),
                           "rate": self.chart.p0_}

    @property
    def exact_match_rate(self) -> float:
        return self.matches_ / self.pairs_ if self.pairs_ else 1.0

    def reset(self) -> None:
        self.chart.reset()

    def acknowledge(self) -> None:
        self.chart.acknowledge()

    def _encode_state(self, name: str, value: Any) -> Any:
        if name == "positions_":
            return sorted(value.items())
        return value

    def _decode_state(self, name: str, value: Any) -> Any:
        if name == "chart":
            self.chart.set_state(value)
            return self.chart
        if name == "positions_":
            return Counter({int(k): int(v) for k, v in value})
        return value

    def update(self, batch: Sequence[tuple[Sequence[int], Sequence[int]]]) -> Result:
        mism = []
        for cand, base in batch:
            pos = first_divergence(cand, base)
            mism.append(pos is not None)
            if pos is not None:
                self.positions_[pos] += 1
        self.pairs_ += len(mism)
        self.matches_ += len(mism) - sum(mism)
        r = self.chart.update(mism)
        src = self.aa_source_
        r.extra.update(exact_match_rate=self.exact_match_rate, aa_rate=self.chart.p0_,
                       aa_rate_source=f"{src['source']} ({src['mismatches']} mismatches in {src['pairs']} pairs)"
                       if src["pairs"] else src["source"], aa_pairs=src["pairs"],
                       top_divergence_positions=self.positions_.most_common(3))
        return r
