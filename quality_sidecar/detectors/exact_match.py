"""T=0 paired exact match: the sharpest correctness signal for a lossless speculative decoder.

At temperature 0 a lossless decoder must reproduce the baseline's token ids for the same prompt, up to
the batch non-invariance of the kernels (vLLM #5898 and friends: in bf16 a few percent of greedy
outputs differ between batch sizes with no decoder involved).  So the candidate's mismatch rate is
judged only against an A/A rate *measured* on the same kind of pairs from the baseline arm, per
source (each differs in batch sizes, engines and sampling):

* ``arm``: a candidate-arm output vs the baseline arm's for the same prompt (A/A: the same prompt
  served twice by the baseline arm);
* ``replay``: an output vs the ``--baseline-url`` server's answer to the replayed prompt (A/A:
  baseline-arm samples);
* ``seeded``: the same for seeded T>0 samples of decoders that keep vLLM's seed promise
  (``decoder.seeded_exact``), whose output is a function of (prompt, parameters, seed) at any
  temperature.

The test is a one-sided Fisher exact test (exact for any common rate, also at a few mismatches).
First-divergence positions are recorded too: early, repeated ones smell like a bug, late, scattered
ones like numerics.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import Result, StatefulDetector

SOURCES = ("arm", "replay", "seeded")


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (the shorter length if one is a prefix); None if equal."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else n


def excess_mismatch_pvalue(cand_pairs: int, cand_mism: int, aa_pairs: int, aa_mism: int) -> float:
    """One-sided Fisher exact p-value of "candidate mismatch rate > A/A mismatch rate"."""
    from scipy.stats import fisher_exact

    table = [[cand_mism, cand_pairs - cand_mism], [aa_mism, aa_pairs - aa_mism]]
    return float(fisher_exact(table, alternative="greater").pvalue)


def _fresh_source() -> dict[str, Any]:
    return {"pairs": 0, "mismatches": 0, "block_pairs": 0, "block_mismatches": 0, "aa_pairs": 0,
            "aa_mismatches": 0, "looks": 0, "pvalue": 1.0}


class PairedExactMatch(StatefulDetector):
    """Two-sample T=0 test per pair source: candidate mismatch rate vs the measured A/A rate.

    Why two-sample: a configured A/A rate is a guess, and under bf16 a wrong guess turns batch
    variance into a rollback order for an exact decoder; measured, the reference moves with dtype,
    kernels and batch sizes.

    Each source's candidate pairs are cut into blocks of ``block``; a full block is tested against
    all A/A pairs so far once the source has ``block`` of them (no verdict before), at alpha = block /
    ert / 3 (a third per source): by the union bound over looks, an exact decoder raises
    ``exact_match`` at most once per ``ert`` candidate pairs, the budget of every chart.  Blocks, not
    cumulative counts: a decoder that breaks after a million good pairs is found within a block or
    two.  ``acknowledge`` drops the current block and keeps the A/A counts.
    """

    STATE = ("sources_", "pairs_", "matches_", "positions_", "alarm_", "alarm_source_")
    STATE_VERSION = 3

    def __init__(self, ert: float, block: int = 400):
        if ert <= block or block < 1:
            raise ValueError("PairedExactMatch needs ert > block >= 1")
        self.ert, self.block = ert, block
        self.alpha = block / ert / len(SOURCES)
        self.fit()

    def fit(self) -> PairedExactMatch:
        """Forget everything: no A/A pairs, no candidate pairs, no alarm."""
        self.sources_ = {s: _fresh_source() for s in SOURCES}
        self.pairs_, self.matches_ = 0, 0
        self.positions_: Counter = Counter()
        self.alarm_, self.alarm_source_ = False, None
        return self

    @property
    def exact_match_rate(self) -> float:
        return self.matches_ / self.pairs_ if self.pairs_ else 1.0

    def add_aa(self, mismatches: Sequence[bool], source: str) -> None:
        """Count A/A pairs (baseline vs baseline) of one source: the measured reference."""
        st = self.sources_[source]
        st["aa_pairs"] += len(mismatches)
        st["aa_mismatches"] += int(sum(mismatches))

    def reset(self) -> None:
        """Clear the alarm and drop the current blocks; the A/A reference stays."""
        for st in self.sources_.values():
            st.update(block_pairs=0, block_mismatches=0)
        self.alarm_, self.alarm_source_ = False, None

    def _encode_state(self, name: str, value: Any) -> Any:
        return sorted(value.items()) if name == "positions_" else value

    def _decode_state(self, name: str, value: Any) -> Any:
        return Counter({int(k): int(v) for k, v in value}) if name == "positions_" else value

    def _look(self, st: dict[str, Any]) -> bool:
        """Test the source's block once it is full and the A/A reference is big enough."""
        if st["block_pairs"] < self.block or st["aa_pairs"] < self.block:
            return False
        st["pvalue"] = excess_mismatch_pvalue(st["block_pairs"], st["block_mismatches"], st["aa_pairs"],
                                              st["aa_mismatches"])
        st["looks"] += 1
        st["block_pairs"] = st["block_mismatches"] = 0
        return st["pvalue"] < self.alpha

    def update(self, batch: Sequence[tuple[Sequence[int], Sequence[int]]], source: str = "arm") -> Result:
        """Score candidate pairs (candidate_ids, baseline_ids) of one source; a Result per call.

        ``statistic`` is -log10 of the source's latest p-value and ``threshold`` -log10 alpha, so
        statistic > threshold is an alarm as for the charts."""
        st, fired = self.sources_[source], False
        for cand, base in batch:
            pos = first_divergence(cand, base)
            st["pairs"] += 1
            st["block_pairs"] += 1
            if pos is None:
                self.matches_ += 1
            else:
                st["mismatches"] += 1
                st["block_mismatches"] += 1
                self.positions_[pos] += 1
            fired |= self._look(st)
        self.pairs_ += len(batch)
        new = fired and not self.alarm_
        if new:
            self.alarm_, self.alarm_source_ = True, source
        aa_rate = st["aa_mismatches"] / st["aa_pairs"] if st["aa_pairs"] else float("nan")
        return Result("exact_match", float(-np.log10(max(st["pvalue"], 1e-300))), float(-np.log10(self.alpha)),
                      self.alarm_, alarm_new=new, pvalue=st["pvalue"], n=st["pairs"],
                      extra={"source": source, "exact_match_rate": self.exact_match_rate,
                             "mismatch_rate": st["mismatches"] / st["pairs"] if st["pairs"] else 0.0,
                             "aa_rate": aa_rate, "aa_pairs": st["aa_pairs"], "aa_mismatches": st["aa_mismatches"],
                             "looks": st["looks"], "verdict": "tested" if st["looks"] else "pending",
                             "aa_rate_source": f"measured: {st['aa_mismatches']} mismatches in {st['aa_pairs']} "
                                               f"baseline-arm {source} pairs",
                             "top_divergence_positions": self.positions_.most_common(3)})
