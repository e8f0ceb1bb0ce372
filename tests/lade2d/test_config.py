"""The ``lookahead2d`` section (``Lade2DConfig``): W/N/G aliases, ranges, unknown keys, the row cap."""

from __future__ import annotations

import pytest

from vllm_lookahead.core.config import LookaheadConfigError
from vllm_lookahead.lade2d.config import Lade2DConfig

pytestmark = pytest.mark.unit


def test_lookahead2d_section_validation_messages():
    # W/N/G mean LADE's 2D shape, in the 2D layout's own section
    cfg = Lade2DConfig.from_sources({"lookahead2d": {"W": 3, "N": 5, "G": 2}})
    assert (cfg.window, cfg.ngram, cfg.candidates) == (3, 5, 2)
    assert cfg.overrides() == {"window": 3, "ngram": 5, "candidates": 2}
    assert Lade2DConfig.from_sources({"lookahead": {"memory_depth": 4}}) == Lade2DConfig()
    with pytest.raises(LookaheadConfigError, match=r"lookahead2d.ngram=2 is invalid; must be in 3..16 \(N=2"):
        Lade2DConfig.from_dict({"ngram": 2})
    with pytest.raises(LookaheadConfigError, match="unknown lookahead2d key"):
        Lade2DConfig.from_dict({"windw": 3})
    with pytest.raises(LookaheadConfigError, match="not both"):
        Lade2DConfig.from_dict({"N": 3, "ngram": 3})
    with pytest.raises(LookaheadConfigError, match="JSON object"):
        Lade2DConfig.from_sources({"lookahead2d": 3})
    with pytest.raises(LookaheadConfigError, match='policy=.* must be "measure" or "always"'):
        Lade2DConfig.from_dict({"policy": "sometimes"})
    with pytest.raises(LookaheadConfigError, match="rows exceeds vLLM's 128 draft tokens"):
        Lade2DConfig.from_dict({"W": 64, "N": 4, "G": 64})
