#!/usr/bin/env bash
# vLLM 0.33 (CUDA wheel) *source* for the static compatibility test -- downloaded, never installed.
#
# The 0.33 wheel needs CUDA torch and cannot be imported on the CPU machines CI runs on, so
# tests/vllm/test_compat_static.py parses its Python files with `ast` instead.  This script downloads
# the pinned wheel without dependencies into the cache and unpacks its .py files (a wheel is a zip)
# into a side directory, $CACHE/vllm-$VLLM_CUDA_VERSION-src, that is never put on sys.path.
# Idempotent: a stamp keyed by the version skips the ~340 MB download on later runs.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=versions.env
source "$ROOT/scripts/versions.env"
CACHE="${VLLM_LOOKAHEAD_CACHE:-$HOME/.cache/vllm-lookahead}"
DEST="$CACHE/vllm-$VLLM_CUDA_VERSION-src"
WHEELS="$CACHE/wheels"
if [[ -f "$DEST/.stamp" && "$(cat "$DEST/.stamp")" == "$VLLM_CUDA_VERSION" ]]; then
  echo "[setup] vllm $VLLM_CUDA_VERSION source cached in $DEST" >&2; exit 0
fi
mkdir -p "$WHEELS"
wheel="$(ls "$WHEELS"/vllm-"$VLLM_CUDA_VERSION"-*.whl 2>/dev/null | head -1 || true)"
if [[ -z "$wheel" ]]; then
  echo "[setup] downloading the vllm $VLLM_CUDA_VERSION CUDA wheel (no deps, not installed)" >&2
  "$ROOT/.venv/bin/python" -m pip --version >/dev/null 2>&1 && PIP=("$ROOT/.venv/bin/python" -m pip) || PIP=(python3 -m pip)
  "${PIP[@]}" download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_35_x86_64 \
    -d "$WHEELS" "vllm==$VLLM_CUDA_VERSION"
  wheel="$(ls "$WHEELS"/vllm-"$VLLM_CUDA_VERSION"-*.whl | head -1)"
fi
rm -rf "$DEST"; mkdir -p "$DEST"
python3 - "$wheel" "$DEST" <<'PY'
import sys, zipfile
wheel, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.endswith(".py") or n.endswith(".dist-info/METADATA")]
    z.extractall(dest, names)
print(f"[setup] unpacked {len(names)} files of {wheel} into {dest}", file=sys.stderr)
PY
echo "$VLLM_CUDA_VERSION" > "$DEST/.stamp"
