"""The release gate on a real instruction-tuned model (SmolLM2-135M-Instruct, 30 layers, 49k vocabulary):
``vllm-lookahead gate --model <real model>`` with the default policy and eval set PASSes the README's
default lookahead -- exact greedy outputs and a silent T>0 conformance check (the exact null scored under
the model's own likelihood) -- and FAILs a greedy fault on exact match and a T>0-only fault on the
``sampled`` criterion alone.

The faults are the test-only proposers of ``tests.faults`` (a real decoder cannot be made
to misbehave on demand).  The greedy fault runs on a subset (``--limit 2``): half of its requests carry a
wrong token, which any item shows; the T>0 fault gets the default run's full size, as its signal is
statistical.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vllm_lookahead.decoders import DEFAULT_DECODER

pytestmark = [pytest.mark.real_model]

FAULTY = "custom:tests.faults."
GREEDY_FAULT = FAULTY + "CorruptTokenProposer:k=8,fraction=0.5,position=1"
T_FAULT = FAULTY + "DraftTemperatureProposer:k=8,factor=0.7"


def _gate(model: Path, report: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    cmd = [sys.executable, "-m", "vllm_lookahead.cli", "gate", "--model", str(model), "--report", str(report),
           "--junit", str(report / "junit.xml"), *extra]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=5400, env=env, check=False)
    result = json.loads((report / "report.json").read_text()) if (report / "report.json").exists() else {}
    return proc, result


def test_real_model_gate_default_run_passes_lookahead(real_model: Path, tmp_path: Path) -> None:
    proc, result = _gate(real_model, tmp_path / "report", "--candidate", DEFAULT_DECODER)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "verdict: PASS" in proc.stdout
    assert result["exact_match"]["candidate"]["mismatches"] == 0
    assert result["latency"]["candidate"]["drafted_tokens"] > 0
    conf = result["sampled"]["conformance"]
    assert result["sampled"]["n_candidate"] > 0 and conf is not None
    assert result["failed"] == [], result["failed"]
    assert next(c for c in result["criteria"] if c["name"] == "sampled")["passed"] is True


def test_real_model_gate_fails_a_greedy_fault_on_exact_match(real_model: Path, tmp_path: Path) -> None:
    proc, result = _gate(real_model, tmp_path / "report", "--candidate", GREEDY_FAULT, "--limit", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert result["exact_match"]["candidate"]["mismatches"] > 0
    assert "exact_match" in result["failed"]


def test_real_model_gate_fails_a_t_only_fault_on_sampled_alone(real_model: Path, tmp_path: Path) -> None:
    proc, result = _gate(real_model, tmp_path / "report", "--candidate", T_FAULT)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert result["exact_match"]["candidate"]["mismatches"] == 0  # greedy outputs stay exact
    # the T>0 check is what fails it (latency is the faulty drafter's own business)
    assert "sampled" in result["failed"] and "exact_match" not in result["failed"], result["failed"]
