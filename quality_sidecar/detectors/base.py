"""Shared result type and the false-alarm budget arithmetic.

Every alarm threshold in the sidecar is derived from an *expected run time* (ERT, a.k.a. ARL0): the
mean number of samples between false alarms on a stream without drift.  A budget of "at most one false
alarm per 100k samples per (model, arm)" split over d detectors gives each detector
ERT_d = d * ERT_total (union bound: the alarm rates add up), see ``split_budget``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Result:
    """What ``update`` returns: the current statistic, its alarm threshold and whether it fired.

    ``pvalue`` is set by tests that have one (two-sample tests), ``alarm_new`` is True only on the
    update that crossed the threshold, ``n`` counts the samples seen since ``fit``.
    """

    detector: str
    statistic: float
    threshold: float
    alarm: bool
    alarm_new: bool = False
    pvalue: float | None = None
    n: int = 0
    alarm_index: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def split_budget(ert_total: float, n_detectors: int) -> float:
    """ERT each of ``n_detectors`` must have for the union to keep ``ert_total`` (Bonferroni)."""
    if ert_total <= 0 or n_detectors <= 0:
        raise ValueError("ert_total and n_detectors must be positive")
    return ert_total * n_detectors
