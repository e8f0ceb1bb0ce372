"""scripts/gpu_check.sh: the GPU check stays runnable (its --smoke mode on CPU, real vLLM), its
verdict fails on what it must catch, and without a GPU the full mode refuses clearly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
sys.path.insert(0, str(ROOT / "scripts"))
from gpu_check import check_bf16, check_fp32, summarize  # noqa: E402 (scripts/gpu_check.py, the verdict)


def _bench(dtype: str, rows: dict[str, dict[str, dict]], n: int = 64) -> dict:
    return {"dtype": dtype, "n_prompts": n, "command": "vllm-lookahead bench ...",
            "results": [{"method": m, "by_batch_size": by} for m, by in rows.items()]}


@pytest.mark.unit
def test_verdict_catches_inexact_fp32_and_a_2d_step_never_taken():
    ok = {"1": {"exact_vs_none": 1.0, "lade2d": {"request_steps": 9}}}
    fp32 = _bench("float32", {"none": {"1": {"exact_vs_none": 1.0}},
                              "lookahead:k=4": {"1": {"exact_vs_none": 1.0}},
                              "lookahead2d:W=5,N=3,G=5": ok})
    assert check_fp32(fp32)[1] == []
    fp32["results"][1]["by_batch_size"]["1"]["exact_vs_none"] = 63 / 64
    fp32["results"][2]["by_batch_size"]["1"]["lade2d"] = None
    failures = check_fp32(fp32)[1]
    assert len(failures) == 2 and "lookahead:k=4" in failures[0] and "never took the 2D step" in failures[1]
    assert check_fp32(_bench("bfloat16", {}))[1]  # wrong dtype is a failure, not a pass


@pytest.mark.unit
def test_verdict_bf16_mismatch_is_judged_against_the_aa_rate():
    none = {"1": {"exact_vs_none": 1.0, "exact_vs_none_bs1": 1.0},
            "8": {"exact_vs_none": 1.0, "exact_vs_none_bs1": 0.95}}  # A/A: 5 % differ by numerics alone
    good = {"1": {"exact_vs_none": 0.92}, "8": {"exact_vs_none": 0.95}}  # within 2 x 5 %
    bad = {"1": {"exact_vs_none": 0.80}, "8": {"exact_vs_none": 0.95}}
    assert check_bf16(_bench("bfloat16", {"none": none, "lookahead:k=4": good}))[1] == []
    failures = check_bf16(_bench("bfloat16", {"none": none, "lookahead:k=4": bad}))[1]
    assert len(failures) == 1 and "batch 1" in failures[0]
    exact = _bench("float32", {"none": {"1": {"exact_vs_none": 1.0}}, "lookahead:k=4": {"1": {"exact_vs_none": 1.0}}})
    seeded = {**exact, "sampling": {"temperature": 0.8, "request_seed": 1}}
    summary = summarize(exact, seeded, _bench("bfloat16", {"none": none, "lookahead:k=4": bad}))
    assert summary["passed"] is False and summary["failures"] == failures


@pytest.mark.unit
def test_verdict_seeded_t_above_0_must_equal_none_and_must_be_seeded():
    good = _bench("bfloat16", {"none": {"1": {"exact_vs_none": 1.0, "exact_vs_none_bs1": 1.0}},
                               "lookahead:k=4": {"1": {"exact_vs_none": 1.0}}})
    exact = _bench("float32", {"none": {"1": {"exact_vs_none": 1.0}}, "lookahead:k=4": {"1": {"exact_vs_none": 1.0}}})
    seeded = _bench("float32", {"none": {"1": {"exact_vs_none": 1.0}}, "lookahead:k=4": {"8": {"exact_vs_none": 0.97}}})
    seeded["sampling"] = {"temperature": 0.8, "request_seed": 1}
    summary = summarize(exact, seeded, good)
    assert summary["passed"] is False and summary["failures"] == [
        "seeded T>0: lookahead:k=4 at batch 8: 0.97 of outputs equal `none` (must be 1.0)"]
    unseeded = {**exact, "sampling": {"temperature": 0.8, "request_seed": None}}
    assert "not run at T>0 with --request-seed" in summarize(exact, unseeded, good)["failures"][0]


@pytest.mark.vllm  # imports torch to look for a device (seconds), not a unit test
def test_full_mode_without_a_gpu_refuses_with_the_fix():
    proc = subprocess.run([str(SCRIPT)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "no CUDA device" in proc.stderr and "--smoke" in proc.stderr
    bad = subprocess.run([str(SCRIPT), "--k", "zero"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--k must be a positive integer" in bad.stderr


@pytest.mark.vllm
def test_smoke_mode_runs_every_step_on_cpu(tmp_path):
    """The same steps as on a GPU at toy size: real vLLM engines for none, the chain, the 2D layout
    (fp32), none and the chain seeded at T=0.8 (fp32), and none / ngram / suffix / lookahead (bf16),
    then the verdict."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.monotonic()
    proc = subprocess.run([str(SCRIPT), "--smoke", "--out", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1200)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((tmp_path / "gpu_check_smoke_summary.json").read_text())
    assert summary["passed"] is True and summary["mode"] == "smoke", summary["failures"]
    fp32 = {r["method"]: r for r in summary["fp32_exactness"]}
    assert set(fp32) == {"none", "lookahead:k=4", "lookahead2d:W=5,N=3,G=5,max_batch=1,policy=always"}
    assert all(r["exact_vs_none"] == 1.0 for r in fp32.values())
    assert fp32["lookahead2d:W=5,N=3,G=5,max_batch=1,policy=always"]["lade2d_request_steps"] > 0
    seeded = {r["method"]: r["exact_vs_none"] for r in summary["seeded_fp32_exactness"]}
    assert seeded == {"none": 1.0, "lookahead:k=4": 1.0}
    speed = {r["method"] for r in summary["speed_bf16"]}
    assert speed == {"none", "ngram:k=4,n_min=1,n_max=4", "suffix:k=4", "lookahead:k=4"}
    bench = json.loads((tmp_path / "gpu_check_smoke_bench_bf16.json").read_text())
    assert bench["dtype"] == "bfloat16" and "--isolation none" in bench["command"]
    print(f"gpu_check.sh --smoke took {took:.0f} s")
