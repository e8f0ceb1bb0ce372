#!/usr/bin/env bash
# Set up the Python environment (idempotent) and run the main job on the embedded default:
# the release gate -- baseline (no speculation) vs candidate (lookahead) on the bundled demo model and
# eval set -- printing each criterion, PASS/FAIL and the report path.  Extra arguments go to the gate.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/setup.sh venv
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" TOKENIZERS_PARALLELISM=false
exec .venv/bin/vllm-lookahead gate "$@"
