"""`vllm-lookahead gate` end to end in a subprocess with the real lookahead proposer: real engines,
T>0 samples on, exit code 0, the verdict table on stdout and the three report files on disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_cli_end_to_end_passes_lookahead(demo_model: Path, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("criteria:\n  sampled: {samples_per_item: 1, profiles: [{temperature: 0.8}]}\nruns: {latency_items: 2}\n")
    report = tmp_path / "report"
    cmd = [sys.executable, "-m", "vllm_lookahead.cli", "gate", "--model", str(demo_model), "--limit", "1",
           "--tasks", "next_line,copy,json,test_name", "--policy", str(policy), "--report", str(report),
           "--candidate", "lookahead:k=4"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "verdict: PASS" in proc.stdout and "| exact_match |" in proc.stdout
    assert "WARNING" not in proc.stdout  # vLLM's logging goes to stderr, stdout is the verdict
    result = json.loads((report / "report.json").read_text())
    assert result["n_items"] == 4 and result["exact_match"]["candidate"]["mismatches"] == 0
    assert result["latency"]["candidate"]["drafted_tokens"] > 0
    sampled = next(c for c in result["criteria"] if c["name"] == "sampled")
    assert sampled["measured"] is not None and result["sampled"]["n_candidate"] == 4
    assert "data:image/png;base64," in (report / "report.html").read_text()
    assert "**PASS**" in (report / "summary.md").read_text()
