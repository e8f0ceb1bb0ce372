"""Degeneration: the failure modes a broken speculative decoder produces first.

A decoder that accepts wrong draft tokens tends to loop ("the the the", a line repeated until
max_tokens) or to stop early.  Signals, all O(n) on whitespace tokens:

* ``repeat_ratio``: share of word 4-grams that already occurred earlier in the output;
* ``tail_loop``: the longest period (in words) whose repetition makes up the end of the output, and
  how many times it repeats;
* empty output; truncation (``finish_reason`` in length/abort/error) is only reported in ``detail``:
  code models hit max_tokens all the time, and the service charts truncation separately.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Verdict

TRUNCATED_REASONS = frozenset({"length", "abort", "error"})


def repeated_ngram_ratio(words: list[str], n: int = 4) -> float:
    """Fraction of n-grams that repeat an earlier n-gram of the same output (0 for short texts).

    Each n-gram beyond its first occurrence is one repeat, so the count is total - distinct."""
    total = len(words) - n + 1
    if total <= 0:
        return 0.0
    grams = list(zip(*(words[i:] for i in range(n))))
    return (total - len(set(grams))) / total


def tail_loop(words: list[str], max_period: int = 32) -> tuple[int, int]:
    """(period, repeats) of the longest-covering loop at the end of ``words``; (0, 0) if none.

    Vectorised (one array comparison per period): a looping decoder's output can be megabytes of
    one word, and the sidecar must classify it as fast as any other output."""
    n = len(words)
    if n < 2:
        return (0, 0)
    codes: dict[str, int] = {}
    ids = np.fromiter((codes.setdefault(w, len(codes)) for w in words), dtype=np.int64, count=n)
    best, best_cover = (0, 0), 0
    for p in range(1, min(max_period, n // 2) + 1):
        differ = np.flatnonzero(ids[p:] != ids[:-p])  # position i+p repeats position i
        run = n - p - (int(differ[-1]) + 1) if differ.size else n - p  # trailing positions that repeat
        reps = 1 + run // p
        if reps >= 2 and reps * p > best_cover:
            best, best_cover = (p, reps), reps * p
    return best


class DegenerationClassifier:
    """Flags empty outputs and repetition loops; thresholds chosen so ordinary code does not trip.

    Code repeats itself legitimately (``self.x = x`` lines, closing brackets), hence the 0.5 ratio
    and the requirement that a tail loop covers >= 40% of a >= 24-word output with >= 3 repeats.
    """

    name = "degenerate"

    def __init__(self, ratio_threshold: float = 0.5, min_words: int = 24):
        self.ratio_threshold = ratio_threshold
        self.min_words = min_words

    def classify(self, text: str | None, *, prompt: str | None = None,
                 response_format: dict[str, Any] | None = None,
                 finish_reason: str | None = None) -> Verdict:
        truncated = finish_reason in TRUNCATED_REASONS
        if text is None or not text.strip():
            if text is None:
                return Verdict(self.name, False, 0.0, "no output text in sample")
            return Verdict(self.name, True, 1.0, f"empty output (finish_reason={finish_reason})")
        words = text.split()
        if len(words) < self.min_words:
            return Verdict(self.name, False, 0.0, "truncated" if truncated else "")
        ratio = repeated_ngram_ratio(words)
        period, reps = tail_loop(words)
        loop_cover = period * reps / len(words)
        score = max(ratio, loop_cover if reps >= 3 else 0.0)
        flagged = ratio >= self.ratio_threshold or (reps >= 3 and loop_cover >= 0.4)
        detail = f"repeat_ratio={ratio:.2f} tail_loop={period}x{reps}" + (" truncated" if truncated else "")
        return Verdict(self.name, flagged, min(1.0, score), detail)
