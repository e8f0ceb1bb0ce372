"""A candidate whose engine really crashes is a FAIL (exit 1) that names where it crashed.

The candidate runs vLLM 0.32's own CPU expand kernel while it samples, i.e. with the plugin's
``cpu_expand_kernel`` fix switched off (``faults.OriginalExpandKernelProposer``): the per-token top-k
it writes is uninitialised, and on the top-k profile vLLM's ``apply_top_k_top_p`` indexes out of
bounds and the engine dies -- the real bug's real crash, nothing raised by the test.  The plain
T=0.8 profile runs first and survives, so the report must name the top-k profile.  Small: 4 items,
2 samples each, in a subprocess (a crashed engine must not share the test runner's process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from tests import faults

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_real_engine_crash_on_top_k_profile_fails_the_candidate(demo_model: Path, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("criteria:\n  sampled: {samples_per_item: 2, profiles: "
                      "[{temperature: 0.8}, {temperature: 1.0, top_p: 0.9, top_k: 50}]}\nruns: {latency_items: 1}\n")
    report, junit = tmp_path / "report", tmp_path / "junit.xml"
    cmd = [sys.executable, "-m", "vllm_lookahead.cli", "gate", "--model", str(demo_model), "--limit", "1",
           "--tasks", "next_line,copy,json,test_name", "--policy", str(policy), "--report", str(report),
           "--junit", str(junit), "--max-model-len", "1024",
           "--candidate", faults.SPEC + "OriginalExpandKernelProposer:k=4"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert "verdict: FAIL (failed: candidate_completes)" in proc.stdout
    crash = json.loads((report / "report.json").read_text())["crash"]
    assert crash["run"] == "candidate T>0" and crash["profile"]["top_k"] == 50, crash
    assert "out of bounds" in crash["error"], crash["error"]
    # the top-k profile's batch: sample 1 of every item
    assert sorted(r["item_index"] for r in crash["requests"]) == [0, 1, 2, 3]
    assert {r["sample"] for r in crash["requests"]} == {1}
    failure = ET.parse(junit).getroot().find("testsuite/testcase[@name='candidate_completes']/failure")
    assert failure is not None and "top_k=50" in (failure.text or "") and "out of bounds" in (failure.text or "")
