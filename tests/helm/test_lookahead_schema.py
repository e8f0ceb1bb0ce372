"""The chart's values schema for ``lookahead`` is generated from core/config.py and cannot drift
(issue 15, item 4): ranges are declared once, and helm rejects what the engine would reject."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest
from helm_chart_support import CHART

from vllm_lookahead.core.config import LIMITS, LookaheadConfig, LookaheadConfigError

pytestmark = pytest.mark.unit

SCRIPT = CHART.parents[1] / "scripts" / "gen_lookahead_schema.py"


def test_committed_schema_matches_the_generator():
    r = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_generator_check_fails_on_drift(tmp_path, monkeypatch):
    """Negative control: a hand edit of one range is caught."""
    sys.path.insert(0, str(SCRIPT.parent))
    import gen_lookahead_schema as gen

    text = (CHART / "values.schema.json").read_text()
    schema = json.loads(text)
    schema["properties"]["lookahead"]["properties"]["extra"]["properties"]["memory_depth"]["maximum"] = 33
    bad = tmp_path / "values.schema.json"
    bad.write_text(json.dumps(schema, indent=2) + "\n")
    monkeypatch.setattr(gen, "SCHEMA", bad)
    assert gen.main(["--check"]) == 1
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0
    extra = json.loads(bad.read_text())["properties"]["lookahead"]["properties"]["extra"]
    assert extra["properties"]["memory_depth"]["maximum"] == 32


@pytest.mark.parametrize("key", sorted(LIMITS))
def test_schema_and_config_agree_at_every_bound(key):
    """Each declared bound, and one step past it, is accepted/rejected alike by the chart's schema
    (``lookahead.extra``) and by LookaheadConfig."""
    extra = json.loads((CHART / "values.schema.json").read_text())["properties"]["lookahead"]["properties"]["extra"]
    lo, hi = LIMITS[key]
    is_float = isinstance(getattr(LookaheadConfig(), key), float)
    step = 0.5 if is_float else 1
    cases = [lo, lo - step] + ([] if hi is None else [hi, hi + step])
    for v in cases:
        v = float(v) if is_float else int(v)
        raw = {key: v}
        if key == "min_match":
            raw["max_match"] = 32
        if key == "max_match":
            raw["min_match"] = 1
        try:
            LookaheadConfig.from_dict(raw)
            config_ok = True
        except LookaheadConfigError:
            config_ok = False
        try:
            jsonschema.validate(raw, extra)
            schema_ok = True
        except jsonschema.ValidationError:
            schema_ok = False
        assert schema_ok == config_ok, (key, v, schema_ok, config_ok)
