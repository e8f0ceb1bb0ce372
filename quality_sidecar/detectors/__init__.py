"""Drift detectors in scikit-learn estimator shape: ``fit(reference)`` then ``update(batch) -> Result``.

Streaming charts (cheap path): ``BernoulliCUSUM``, ``GaussianCUSUM``, ``PairedExactMatch``.
Two-sample tests (T>0, also used by the release gate): ``length_test``, ``finish_reason_test``,
``rate_test``, ``text_mmd_test``, ``linear_mmd_test``, ``mcnemar_test``, with ``holm`` /
``benjamini_hochberg`` across metrics, and ``WindowedTwoSample`` to run them on a stream.
State: every detector follows the ``StatefulDetector`` protocol of ``base.py`` (declared ``STATE``,
versioned JSON-safe ``get_state``/``set_state``, ``acknowledge``).
Text embedders for the MMD tests (``hashed`` default, ``minilm`` optional): ``embedders.py``.
"""

from .base import Result, StatefulDetector, split_budget, to_jsonable
from .cusum import BernoulliCUSUM, GaussianCUSUM, calibrate_threshold
from .embedders import HashedNgramEmbedder, MiniLMEmbedder, make_embedder
from .exact_match import PairedExactMatch, first_divergence, mcnemar_test
from .twosample import (
    TestResult,
    WindowedTwoSample,
    benjamini_hochberg,
    finish_reason_test,
    holm,
    length_test,
    linear_mmd,
    linear_mmd_test,
    mmd_permutation_test,
    rate_test,
    text_mmd_test,
)

__all__ = ["BernoulliCUSUM", "GaussianCUSUM", "HashedNgramEmbedder", "MiniLMEmbedder", "make_embedder", "PairedExactMatch", "Result", "StatefulDetector", "TestResult", "WindowedTwoSample",
           "benjamini_hochberg", "calibrate_threshold", "finish_reason_test", "first_divergence", "holm",
           "length_test", "linear_mmd", "linear_mmd_test", "mcnemar_test", "mmd_permutation_test", "rate_test", "split_budget", "text_mmd_test", "to_jsonable"]
