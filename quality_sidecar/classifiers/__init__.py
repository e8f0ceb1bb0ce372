"""Behavioural classifiers shared by the sidecar and the release gate (API in docs/CONTRACTS.md).

    from quality_sidecar.classifiers import default_classifiers
    for clf in default_classifiers():
        v = clf.classify(text, prompt=prompt, response_format=rf, finish_reason="stop")
        v.name, v.flagged, v.score, v.detail
"""

from __future__ import annotations

from .base import Classifier, Verdict, classify_batch
from .degeneration import DegenerationClassifier
from .format import FormatClassifier
from .refusal import RefusalClassifier
from .safety import PatternSafety, SafetyClassifier, load_backend

CLASSIFIER_NAMES = ("refusal", "format_invalid", "unsafe", "degenerate")


def default_classifiers(safety_backend: str | None = None) -> list[Classifier]:
    """The four classifiers in CONTRACTS order; ``safety_backend`` adds a 'module:Class' backend."""
    safety = SafetyClassifier([PatternSafety(), load_backend(safety_backend)] if safety_backend else None)
    return [RefusalClassifier(), FormatClassifier(), safety, DegenerationClassifier()]


__all__ = ["CLASSIFIER_NAMES", "Classifier", "DegenerationClassifier", "FormatClassifier", "PatternSafety",
           "RefusalClassifier", "SafetyClassifier", "Verdict", "classify_batch", "default_classifiers"]
