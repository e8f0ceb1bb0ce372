#!/usr/bin/env bash
# Set up everything (idempotent; seconds when cached) and run the whole test suite.
# Services (Kafka, Jaeger) are started and stopped by the test fixtures themselves.
#   scripts/test.sh                 # all tiers, as CI runs them
#   scripts/test.sh -m unit         # extra arguments go to pytest
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/setup.sh
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check .
.venv/bin/lint-imports --no-cache --no-logo  # import contracts: pyproject.toml [tool.importlinter]
exec .venv/bin/python -m pytest -p no:cacheprovider --timeout=1800 "$@"
