"""The 2D layout's tests: its engine tests run in-process engines (``engine_factory``, tests/conftest.py)
and share the vLLM tier's exactness helpers (tests/vllm/lossless_support.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the 2D counters are read in this process
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vllm"))  # lossless_support
