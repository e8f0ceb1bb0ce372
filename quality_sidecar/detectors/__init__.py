"""Drift detectors in scikit-learn estimator shape: ``fit(reference)`` then ``update(batch) -> Result``.

Streaming charts (cheap path): ``BernoulliCUSUM``, ``GaussianCUSUM``, ``PairedExactMatch``.
T>0 charts: ``conformance_charts`` (``ConformanceChart`` over ``PitCusum``/``ExcessCusum``,
``ImpossibleTokenChart``) on the scores of ``conformance_scoring``, with the batch tests of
``conformance_stats``; ``repeats.RepeatChart``.  ``ImpossibleTokenChart`` and ``RepeatChart`` keep
per-arm counts judged against the control arm (``base.ArmControlChart``).
Two-sample tests (T>0, also used by the release gate): ``length_test``, ``finish_reason_test``,
``rate_test``, ``text_mmd_test``, ``linear_mmd_test``, with ``holm`` across metrics.
The contract: every detector and chart here is a ``base.Detector`` by subclassing ``StatefulDetector``
(declared ``STATE``, versioned JSON-safe ``get_state``/``set_state``, ``update(...) -> Result``,
``reset``, ``acknowledge``); tests/sidecar/test_detector_contract.py enumerates them.
Text embedders for the MMD tests (``hashed`` default, ``minilm`` optional): ``embedders.py``.
"""

from .base import ArmControlChart, Detector, Result, StatefulDetector, to_jsonable
from .cusum import BernoulliCUSUM, GaussianCUSUM, calibrate_threshold
from .embedders import HashedNgramEmbedder, MiniLMEmbedder, make_embedder
from .exact_match import PairedExactMatch, first_divergence
from .twosample import (
    TestResult,
    finish_reason_test,
    holm,
    length_test,
    linear_mmd,
    linear_mmd_test,
    mmd_permutation_test,
    rate_test,
    text_mmd_test,
)

__all__ = ["ArmControlChart", "BernoulliCUSUM", "Detector", "GaussianCUSUM", "HashedNgramEmbedder", "MiniLMEmbedder",
           "PairedExactMatch", "Result", "StatefulDetector", "TestResult", "calibrate_threshold",
           "finish_reason_test", "first_divergence", "holm", "length_test", "linear_mmd", "linear_mmd_test",
           "make_embedder", "mmd_permutation_test", "rate_test", "text_mmd_test", "to_jsonable"]
