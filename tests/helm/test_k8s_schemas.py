"""The offline-schema converter (deploy/scripts/k8s_schemas.py) keeps kubeconform strict and self-contained."""

from __future__ import annotations

import importlib.util
import json
import zipfile
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.helm

_spec = importlib.util.spec_from_file_location(
    "k8s_schemas", REPO_ROOT / "deploy" / "scripts" / "k8s_schemas.py"
)
assert _spec and _spec.loader
k8s_schemas = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(k8s_schemas)


def test_standalone_inlines_only_the_closure() -> None:
    defs = {
        "A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B"}}},
        "B": {"type": "string"},
        "Unused": {"type": "integer"},
    }
    kind = {
        "properties": {"spec": {"$ref": "/api/_definitions.json#/$defs/A"}},
        "$id": "https://x/y",
    }
    out = k8s_schemas.standalone(kind, defs)
    assert out["properties"]["spec"]["$ref"] == "#/$defs/A"
    assert set(out["$defs"]) == {"A", "B"} and "$id" not in out
    with pytest.raises(KeyError, match="Missing"):
        k8s_schemas.standalone({"$ref": "/api/_definitions.json#/$defs/Missing"}, defs)


def test_convert_k8s_reports_unknown_version(tmp_path: Path) -> None:
    wheel = tmp_path / "kubernetes_validate-0-py3-none-any.whl"
    prefix = "kubernetes_validate/kubernetes-json-schema/v1.30.0-local-strict/"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(prefix + "_definitions.json", json.dumps({"$defs": {"S": {"type": "object"}}}))
        zf.writestr(
            prefix + "thing-v1.json",
            json.dumps(
                {
                    "x-kubernetes-group-version-kind": [{}],
                    "properties": {"spec": {"$ref": "/api/_definitions.json#/$defs/S"}},
                }
            ),
        )
        zf.writestr(prefix + "thingspec-v1.json", json.dumps({"type": "object"}))
    assert k8s_schemas.convert_k8s(wheel, tmp_path / "out", ["1.30.0"]) == 1  # sub-objects skipped
    assert (tmp_path / "out" / "v1.30.0-standalone-strict" / "thing-v1.json").exists()
    with pytest.raises(SystemExit, match="1.99.0 not in"):
        k8s_schemas.convert_k8s(wheel, tmp_path / "out", ["1.99.0"])


def test_crd_conversion_is_strict(tmp_path: Path) -> None:
    crd = tmp_path / "crd.yaml"
    crd.write_text(
        """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
spec:
  group: example.com
  names: {kind: Widget}
  versions:
    - name: v1
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                port: {x-kubernetes-int-or-string: true}
                free: {type: object, x-kubernetes-preserve-unknown-fields: true, properties: {a: {type: string}}}
"""
    )
    assert k8s_schemas.convert_crds([crd], tmp_path / "out") == 1
    schema = json.loads((tmp_path / "out" / "widget-example.com-v1.json").read_text())
    spec = schema["properties"]["spec"]
    assert spec["additionalProperties"] is False
    assert spec["properties"]["port"]["oneOf"] == [{"type": "string"}, {"type": "integer"}]
    assert "additionalProperties" not in spec["properties"]["free"]
    assert schema["properties"]["kind"]["enum"] == ["Widget"]
    assert schema["properties"]["apiVersion"]["enum"] == ["example.com/v1"]
