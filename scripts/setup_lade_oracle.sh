#!/usr/bin/env bash
# A separate venv with hao-ai-lab's own LADE (`lade` from PyPI) and the transformers it was
# written for, so benchmarks/lade_oracle.py can run the original code next to this project's reference.
#
#   scripts/setup_lade_oracle.sh          # prints the venv's python on stdout (last line)
#
# Why a separate venv: lade 0.0.2 monkey-patches transformers 4.34's greedy_search and LlamaModel;
# the project's .venv has transformers 5 (vLLM 0.32 needs it).  Torch is PyPI's 2.13.0 (as in .venv),
# so uv links it from its cache.  Cached under $VLLM_LOOKAHEAD_CACHE behind a stamp of the pins;
# a second run takes a second.  Called by scripts/setup.sh (step lade_oracle: seconds once uv's cache
# holds torch); docs/reference.md says how to use it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=versions.env
source "$ROOT/scripts/versions.env"
CACHE="${VLLM_LOOKAHEAD_CACHE:-$HOME/.cache/vllm-lookahead}"
VENV="$CACHE/lade-oracle-venv"
export UV_NO_CONFIG=1

log() { printf '\033[1m[setup-lade]\033[0m %s\n' "$*" >&2; }

if command -v uv >/dev/null 2>&1; then UV="$(command -v uv)"; elif [[ -x "$CACHE/uv/bin/uv" ]]; then
  UV="$CACHE/uv/bin/uv"
else
  log "uv not found: run scripts/setup.sh venv first"; exit 1
fi

key="lade=$LADE_VERSION transformers=$LADE_TRANSFORMERS_VERSION torch=$TORCH_VERSION"
if [[ -f "$VENV/.stamp" && "$(cat "$VENV/.stamp")" == "$key" ]]; then
  log "lade oracle venv up to date ($key)"
else
  log "building $VENV ($key)"
  rm -rf "$VENV"
  "$UV" venv --quiet --python "$(command -v python3)" "$VENV"
  # numpy<2: transformers 4.34 predates numpy 2.
  "$UV" pip install --quiet --python "$VENV/bin/python" "lade==$LADE_VERSION" \
    "transformers==$LADE_TRANSFORMERS_VERSION" "torch==$TORCH_VERSION" "numpy<2"
  "$VENV/bin/python" -c "import lade, transformers, torch; print('lade ok; transformers', transformers.__version__, 'torch', torch.__version__)" >&2
  echo "$key" > "$VENV/.stamp"
fi
echo "$VENV/bin/python"
