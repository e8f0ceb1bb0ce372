"""Turn downloaded schema sources into kubeconform's offline layout (no network here).

Why this exists: kubeconform validates against JSON schemas fetched from GitHub by default, and CI
here has no internet.  The PyPI package ``kubernetes-validate`` ships the Kubernetes OpenAPI as JSON
schemas, but each kind file points at a shared ``/api/_definitions.json`` by absolute URL, which
kubeconform cannot resolve from disk.  So we inline, per kind, the closure of definitions it uses
(the "standalone" layout).  CRD schemas (ServiceMonitor, PodMonitor, PrometheusRule) come from the
prometheus-operator CRD YAML and follow the openapi2jsonschema conventions: int-or-string becomes a
oneOf, and with strict mode objects without ``additionalProperties`` reject unknown fields.

Usage: ``python k8s_schemas.py k8s WHEEL OUT_DIR VERSION...`` and
``python k8s_schemas.py crd CRD_YAML... --out OUT_DIR``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

_EXT_REF = re.compile(r"^/api/_definitions\.json#/\$defs/(.+)$")
_LOCAL_REF = re.compile(r"^#/\$defs/(.+)$")


def _rewrite_refs(node: Any, found: set[str]) -> Any:
    """Copy ``node`` with external definition refs made local; collect the names referenced."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                m = _EXT_REF.match(value) or _LOCAL_REF.match(value)
                if m:
                    found.add(m.group(1))
                    out[key] = f"#/$defs/{m.group(1)}"
                    continue
            out[key] = _rewrite_refs(value, found)
        return out
    if isinstance(node, list):
        return [_rewrite_refs(v, found) for v in node]
    return node


def standalone(kind_schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline the transitive closure of ``defs`` that ``kind_schema`` references."""
    found: set[str] = set()
    body = _rewrite_refs(kind_schema, found)
    body.pop("$id", None)
    closure: dict[str, Any] = {}
    todo = sorted(found)
    while todo:
        name = todo.pop()
        if name in closure:
            continue
        if name not in defs:
            raise KeyError(f"definition {name!r} referenced but missing from _definitions.json")
        more: set[str] = set()
        closure[name] = _rewrite_refs(defs[name], more)
        todo.extend(sorted(more - closure.keys()))
    body["$defs"] = closure
    return body


def convert_k8s(wheel: Path, out: Path, versions: list[str]) -> int:
    """Write ``OUT/v{VERSION}-standalone-strict/*.json`` for every top-level kind in the wheel."""
    written = 0
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        for version in versions:
            prefix = f"kubernetes_validate/kubernetes-json-schema/v{version}-local-strict/"
            files = [n for n in names if n.startswith(prefix) and n.endswith(".json")]
            if not files:
                have = sorted({n.split("/")[2] for n in names if n.count("/") >= 3})
                raise SystemExit(
                    f"Kubernetes {version} not in {wheel.name}; it has: {', '.join(have)}"
                )
            defs = json.loads(zf.read(prefix + "_definitions.json"))["$defs"]
            target = out / f"v{version}-standalone-strict"
            target.mkdir(parents=True, exist_ok=True)
            for name in files:
                base = name.rsplit("/", 1)[1]
                if base.startswith("_"):
                    continue
                schema = json.loads(zf.read(name))
                if "x-kubernetes-group-version-kind" not in schema:
                    continue  # sub-objects: kubeconform only looks up top-level kinds
                (target / base).write_text(json.dumps(standalone(schema, defs)))
                written += 1
    return written


def _crd_node(node: Any) -> Any:
    """openapi2jsonschema rules for one CRD schema node (strict: deny unknown fields)."""
    if isinstance(node, list):
        return [_crd_node(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _crd_node(v) for k, v in node.items()}
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out["oneOf"] = [{"type": "string"}, {"type": "integer"}]
    if (
        out.get("type") == "object"
        and "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def convert_crds(paths: list[Path], out: Path) -> int:
    """Write ``OUT/{kind}-{group}-{version}.json`` for each served version of each CRD."""
    import yaml  # only this mode needs PyYAML

    out.mkdir(parents=True, exist_ok=True)
    written = 0
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            kind, group = spec["names"]["kind"], spec["group"]
            for ver in spec["versions"]:
                schema = _crd_node(ver["schema"]["openAPIV3Schema"])
                props = schema.setdefault("properties", {})
                props["apiVersion"] = {"type": "string", "enum": [f"{group}/{ver['name']}"]}
                props["kind"] = {"type": "string", "enum": [kind]}
                schema["additionalProperties"] = False
                name = f"{kind.lower()}-{group}-{ver['name']}.json"
                (out / name).write_text(json.dumps(schema))
                written += 1
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    k8s = sub.add_parser(
        "k8s", help="standalone-strict Kubernetes schemas from a kubernetes-validate wheel"
    )
    k8s.add_argument("wheel", type=Path)
    k8s.add_argument("out", type=Path)
    k8s.add_argument("versions", nargs="+", help="Kubernetes versions, e.g. 1.30.0")
    crd = sub.add_parser("crd", help="CRD YAML -> {kind}-{group}-{version}.json")
    crd.add_argument("crds", nargs="+", type=Path)
    crd.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.mode == "k8s":
        n = convert_k8s(args.wheel, args.out, args.versions)
        print(f"wrote {n} Kubernetes kind schemas under {args.out}", file=sys.stderr)
    else:
        n = convert_crds(args.crds, args.out)
        print(f"wrote {n} CRD schemas under {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
