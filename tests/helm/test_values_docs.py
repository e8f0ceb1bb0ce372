"""values.yaml stays documented and in step with values.schema.json.

Each key needs an `@param` line (on itself or an ancestor that documents the whole object), each
`@param` must name a real key, and the schema must describe every documented key - so a key added
to values.yaml without docs or schema fails here, not in a user's cluster.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from helm_chart_support import CHART

pytestmark = pytest.mark.helm

VALUES_TEXT = (CHART / "values.yaml").read_text()
VALUES = yaml.safe_load(VALUES_TEXT)
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
PARAMS = re.findall(r"^\s*## @param (\S+) \S", VALUES_TEXT, re.M)


def _paths(node: Any, prefix: str = "") -> list[str]:
    if not isinstance(node, dict):
        return []
    out = []
    for key, value in node.items():
        path = f"{prefix}{key}"
        out.append(path)
        out += _paths(value, path + ".")
    return out


def _schema_node(path: str) -> dict[str, Any] | None:
    node: dict[str, Any] | None = SCHEMA
    for part in path.split("."):
        if node is None:
            return None
        node = node.get("properties", {}).get(part)
    return node


def _documented(path: str, params: set[str]) -> bool:
    """Documented itself or by an ancestor; or a plain grouping key whose children are documented."""
    covered = any(path == d or path.startswith(d + ".") for d in params)
    grouping = any(d.startswith(path + ".") for d in params)
    return covered or grouping


def test_every_key_documented() -> None:
    params = set(PARAMS)
    undocumented = [p for p in _paths(VALUES) if not _documented(p, params)]
    assert not undocumented, f"keys without an @param line: {undocumented}"
    assert not _documented("server.newKnob", params)  # the check itself can fail


def test_every_param_names_a_key() -> None:
    keys = set(_paths(VALUES))
    assert len(PARAMS) == len(set(PARAMS)), "duplicate @param lines"
    assert set(PARAMS) <= keys, sorted(set(PARAMS) - keys)


def test_schema_covers_every_param_and_rejects_unknown_keys() -> None:
    assert SCHEMA["additionalProperties"] is False
    missing = [p for p in PARAMS if _schema_node(p) is None]
    assert not missing, f"documented in values.yaml but not in values.schema.json: {missing}"
    for top in VALUES:
        assert top in SCHEMA["properties"], top


def test_defaults_validate_against_schema() -> None:
    import jsonschema

    jsonschema.Draft7Validator.check_schema(SCHEMA)
    errors = sorted(jsonschema.Draft7Validator(SCHEMA).iter_errors(VALUES), key=str)
    assert not errors, errors[0].message
