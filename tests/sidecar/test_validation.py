"""The hot-path validator must agree with the authoritative ``validation_errors``."""

import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quality_sidecar.schema import validation_errors
from quality_sidecar.validate import sample_errors
from tests.support.synth import SampleStream, fuzz_messages

pytestmark = pytest.mark.unit


def test_agrees_on_fuzzed_and_valid_messages():
    samples = SampleStream(seed=1).take(200)
    for raw in fuzz_messages(2000, seed=3):
        with contextlib.suppress(json.JSONDecodeError, UnicodeDecodeError):
            samples.append(json.loads(raw))
    for s in samples:
        if isinstance(s, dict):
            assert (sample_errors(s) == []) == (validation_errors(s) == []), s


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.integers(-3, 5000), st.floats(-2, 3), st.booleans(), st.none()), max_size=6))
def test_token_id_arrays(ids):
    s = SampleStream(seed=2).one()
    s["output"]["token_ids"] = ids
    assert (sample_errors(s) == []) == (validation_errors(s) == [])
