"""The classifier contract shared by the sidecar and the release gate (docs/CONTRACTS.md).

A classifier looks at one finished request and returns a ``Verdict``.  Classifiers are pure and
stateless after construction so the gate can call them offline and the sidecar can call them per
sample on the hot path; ``classify_batch`` exists only because vectorised scoring is what makes the
sidecar fast enough (>= 5,000 samples/s per core).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Verdict:
    """Outcome of one classifier on one output; ``score`` is in [0, 1], higher = more flagged."""

    name: str
    flagged: bool
    score: float
    detail: str = ""


@runtime_checkable
class Classifier(Protocol):
    name: str

    def classify(self, text: str | None, *, prompt: str | None = None,
                 response_format: dict[str, Any] | None = None,
                 finish_reason: str | None = None) -> Verdict: ...


def classify_batch(clf: Any, texts: Sequence[str | None], prompts: Sequence[str | None],
                   response_formats: Sequence[dict[str, Any] | None],
                   finish_reasons: Sequence[str | None]) -> list[Verdict]:
    """Use the classifier's vectorised path when it has one, else loop over ``classify``."""
    fn = getattr(clf, "classify_batch", None)
    if fn is not None:
        return fn(texts, prompts, response_formats, finish_reasons)
    return [clf.classify(t, prompt=p, response_format=r, finish_reason=f)
            for t, p, r, f in zip(texts, prompts, response_formats, finish_reasons)]
