#!/usr/bin/env bash
# A real Kubernetes control plane for the helm_cluster test tier, built from the package registries only.
#
#   scripts/setup_k8s.sh            # everything below, cached; seconds when up to date
#   scripts/setup_k8s.sh bins       # only some parts: bins etcd crds
#
# Debian has no kube-apiserver/kind/k3s, and `go install k8s.io/kubernetes/cmd/...@vX` is refused by the
# Go tooling (kubernetes' go.mod replaces its k8s.io/* staging modules with ./staging paths that the module
# zip does not contain).  So we build from a small wrapper module of our own that requires
# k8s.io/kubernetes and points each staging replace at the published k8s.io/X v0.<minor>.<patch> module,
# generated from kubernetes' own go.mod.  kwok (fake nodes and pods) builds in the same module.  etcd comes
# from Debian's etcd-server package, extracted (never installed as a service).  The prometheus-operator
# and KEDA CRDs come from their Go modules, so the tier validates ServiceMonitor/PrometheusRule/
# ScaledObject objects against the real schemas.  Facts behind each choice: shared/docs/k8s-control-plane.md.
#
# Layout (what tests/support/k8s_cluster.py reads):
#   $CACHE/k8s-$K8S_VERSION/bin/{kube-apiserver,kube-controller-manager,kube-scheduler,kubectl,kwok,etcd}
#   $CACHE/k8s-$K8S_VERSION/kwok-stages.yaml
#   $CACHE/k8s-$K8S_VERSION/crds/*.yaml
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=versions.env
source "$ROOT/scripts/versions.env"
CACHE="${VLLM_LOOKAHEAD_CACHE:-$HOME/.cache/vllm-lookahead}"
K8S_DIR="$CACHE/k8s-$K8S_VERSION"
mkdir -p "$K8S_DIR/bin"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"

log() { printf '\033[1m[setup:k8s]\033[0m %s\n' "$*" >&2; }
stamp_ok() { [[ -f "$1" && "$(cat "$1")" == "$2" ]]; }

# Directory of a downloaded Go module (module@version), via the module proxy; works outside any module.
mod_dir() {
  (cd "$CACHE" && GOFLAGS=-mod=mod go mod download -json "$1" \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["Dir"]) if "Dir" in d else sys.exit(d.get("Error","no Dir"))')
}

part_bins() {
  local key="kubernetes $K8S_VERSION kwok $KWOK_VERSION"
  local b="$K8S_DIR/bin"
  all_x() { local t; for t in "$@"; do [[ -x "$b/$t" ]] || return 1; done; }
  if stamp_ok "$K8S_DIR/.bins.stamp" "$key" && all_x kube-apiserver kube-controller-manager kube-scheduler kubectl kwok; then
    log "kubernetes $K8S_VERSION + kwok $KWOK_VERSION cached"; return
  fi
  log "building kubernetes $K8S_VERSION control plane + kubectl + kwok $KWOK_VERSION (first time: ~10-20 min on 2 cores)"
  local mod="$K8S_DIR/build"
  rm -rf "$mod"; mkdir -p "$mod"
  local kmod staging_minor
  kmod="$(cd "$CACHE" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$K8S_VERSION" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  staging_minor="v0.${K8S_VERSION#v1.}"   # v1.37.2 -> v0.37.2, the published staging module version
  {
    echo "module vllm-lookahead.local/k8s-tools"
    echo
    grep -m1 '^go ' "$kmod"
    echo
    echo "require ("
    echo "	k8s.io/kubernetes $K8S_VERSION"
    echo "	sigs.k8s.io/kwok $KWOK_VERSION"
    echo ")"
    echo
    echo "replace ("
    # `k8s.io/X => ./staging/src/k8s.io/X`  ->  `k8s.io/X => k8s.io/X v0.37.2`
    sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\)[[:space:]]*=>[[:space:]]*\./staging/.*#\t\1 => \1 '"$staging_minor"'#p' "$kmod"
    echo ")"
  } > "$mod/go.mod"
  local n
  n="$(grep -c "=> k8s.io/" "$mod/go.mod")"
  [[ "$n" -gt 20 ]] || { log "expected ~33 staging replaces from $kmod, got $n"; return 1; }
  # Version ldflags: without them the binaries say v0.0.0-master and kubectl refuses to talk to them.
  local major="${K8S_VERSION#v}"; major="${major%%.*}"
  local minor="${K8S_VERSION#v*.}"; minor="${minor%%.*}"
  local ld="-s -w" pkgv
  for pkgv in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkgv.gitVersion=$K8S_VERSION -X $pkgv.gitMajor=$major -X $pkgv.gitMinor=$minor"
    ld+=" -X $pkgv.gitTreeState=clean -X $pkgv.buildDate=1970-01-01T00:00:00Z"
  done
  ld+=" -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
  (
    cd "$mod"
    GOFLAGS="-mod=mod -buildvcs=false" go build -trimpath -ldflags "$ld" -o "$b/" \
      k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler \
      k8s.io/kubernetes/cmd/kubectl \
      sigs.k8s.io/kwok/cmd/kwok
  )
  # kwok exits "no stages found" without stage definitions: the module ships them as kustomize YAML.
  local kw
  kw="$(mod_dir "sigs.k8s.io/kwok@$KWOK_VERSION")"
  local f
  : > "$K8S_DIR/kwok-stages.yaml"
  for f in "$kw"/kustomize/stage/node/fast/*.yaml "$kw"/kustomize/stage/node/heartbeat/*.yaml \
           "$kw"/kustomize/stage/pod/fast/*.yaml; do
    [[ "$(basename "$f")" == kustomization.yaml ]] && continue
    { echo "---"; cat "$f"; } >> "$K8S_DIR/kwok-stages.yaml"
  done
  "$b/kubectl" version --client >/dev/null
  echo "$key" > "$K8S_DIR/.bins.stamp"
}

part_etcd() {
  local key="etcd-server $ETCD_DEB_VERSION"
  if stamp_ok "$K8S_DIR/.etcd.stamp" "$key" && [[ -x "$K8S_DIR/bin/etcd" ]]; then log "etcd cached"; return; fi
  log "extracting Debian etcd-server $ETCD_DEB_VERSION"
  local tmp
  tmp="$(mktemp -d)"
  (cd "$tmp" && apt-get download -q "etcd-server=$ETCD_DEB_VERSION" >/dev/null)
  dpkg -x "$tmp"/etcd-server_*.deb "$tmp/x"
  install -m 0755 "$tmp/x/usr/bin/etcd" "$K8S_DIR/bin/etcd"
  rm -rf "$tmp"
  "$K8S_DIR/bin/etcd" --version >/dev/null
  echo "$key" > "$K8S_DIR/.etcd.stamp"
}

part_crds() {
  local key="prometheus-operator $PROMETHEUS_OPERATOR_VERSION keda $KEDA_VERSION"
  if stamp_ok "$K8S_DIR/.crds.stamp" "$key"; then log "CRDs cached"; return; fi
  log "fetching prometheus-operator $PROMETHEUS_OPERATOR_VERSION and KEDA $KEDA_VERSION CRDs (Go modules)"
  local po keda
  po="$(mod_dir "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION")"
  keda="$(mod_dir "github.com/kedacore/keda/v2@$KEDA_VERSION")"
  rm -rf "$K8S_DIR/crds"; mkdir -p "$K8S_DIR/crds"
  cp "$po"/example/prometheus-operator-crd/monitoring.coreos.com_*.yaml "$K8S_DIR/crds/"
  cp "$keda"/config/crd/bases/keda.sh_*.yaml "$K8S_DIR/crds/"
  chmod u+w "$K8S_DIR"/crds/*.yaml
  echo "$key" > "$K8S_DIR/.crds.stamp"
}

parts=("$@")
[[ ${#parts[@]} -gt 0 ]] || parts=(etcd crds bins)
for p in "${parts[@]}"; do "part_$p"; done
log "control plane in $K8S_DIR"
