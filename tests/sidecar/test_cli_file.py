"""The CLI on file sources: --help, run with a DLQ file, score, alarms on a clean vs regressed stream."""

import json
import subprocess
import sys

import pytest

from quality_sidecar.cli import main
from tests.support.synth import SampleStream

from .conftest import FAST_MONITOR, write_jsonl

pytestmark = pytest.mark.slow


def test_help_lists_subcommands_and_env(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--source", "--group", "--dlq", "--alerts", "--http-port", "--config", "--baseline-url"):
        assert flag in out
    assert "QUALITY_SIDECAR_SOURCE" in out
    assert main(["run"]) == 2  # no source: clear error, not a traceback


def _config(tmp_path, **extra):
    import yaml

    path = tmp_path / "sidecar.yaml"
    path.write_text(yaml.safe_dump({"monitor": FAST_MONITOR, "commit_interval_s": 0.2, **extra}))
    return path


def test_the_removed_retries_key_is_a_clear_error(tmp_path, capsys):
    """conformance.retries (an attempt limit) is gone: transient failures are retried until the server
    answers.  An old config that sets it stops with that explanation, not a bare unknown-key error."""
    src = write_jsonl(tmp_path / "s.jsonl", [])
    for cmd in (["run", "--source", f"file://{src}", "--http-port", "-1"], ["score", "--input", str(src), "--json", str(tmp_path / "r.json")]):
        assert main([*cmd, "--config", str(_config(tmp_path, conformance={"retries": 6}))]) == 2
        err = capsys.readouterr().err
        assert "conformance.retries was removed" in err and "until the baseline server answers" in err


def test_run_file_with_dlq_and_regression_alarm(tmp_path, clean_and_regressed):
    ref, bad = clean_and_regressed("acceptance")
    src = write_jsonl(tmp_path / "s.jsonl", ref + bad, extra_lines=["{not json", '{"schema_version": "1.0"}', "[1,2]"])
    dlq, alerts = tmp_path / "dlq.jsonl", tmp_path / "alerts.jsonl"
    rc = main(["run", "--source", f"file://{src}", "--dlq", f"file://{dlq}", "--alerts", f"file://{alerts}",
               "--http-port", "-1", "--config", str(_config(tmp_path)), "--no-progress"])
    assert rc == 0
    rows = [json.loads(x) for x in dlq.read_text().splitlines()]
    assert [r["reason"].split(":")[0] for r in rows] == ["invalid JSON", "schema v1", "top-level JSON list, expected an object"]
    events = [json.loads(x) for x in alerts.read_text().splitlines()]
    assert [e["detector"] for e in events] == ["acceptance_down"]
    assert len(events[0]["example_trace_ids"]) >= 1 and all(len(t) == 32 for t in events[0]["example_trace_ids"])


def test_clean_stream_raises_no_alarm(tmp_path, clean_and_regressed):
    ref, clean = clean_and_regressed(None, n_after=3000, seed=4)
    src = write_jsonl(tmp_path / "s.jsonl", ref + clean)
    alerts = tmp_path / "alerts.jsonl"
    rc = main(["run", "--source", f"file://{src}", "--alerts", f"file://{alerts}", "--http-port", "-1",
               "--config", str(_config(tmp_path)), "--no-progress"])
    assert rc == 0
    assert not alerts.exists() or alerts.read_text() == ""


def test_env_vars_configure_run(tmp_path, monkeypatch):
    src = write_jsonl(tmp_path / "s.jsonl", SampleStream(seed=9).take(50), extra_lines=["junk"])
    monkeypatch.setenv("QUALITY_SIDECAR_SOURCE", f"file://{src}")
    monkeypatch.setenv("QUALITY_SIDECAR_DLQ", f"file://{tmp_path / 'd.jsonl'}")
    monkeypatch.setenv("QUALITY_SIDECAR_HTTP_PORT", "-1")
    assert main(["run", "--no-progress"]) == 0
    assert len((tmp_path / "d.jsonl").read_text().splitlines()) == 1


def test_score_reports_the_injected_difference(tmp_path):
    base = SampleStream(seed=1, arm="baseline").take(600)
    cand = SampleStream(seed=2, arm="candidate", regression="length").take(600)
    src = write_jsonl(tmp_path / "s.jsonl", base + cand, extra_lines=["oops"])
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "quality_sidecar.cli", "score", "--input", str(src), "--json", str(out),
                        "--permutations", "50"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    assert rep["counts"] == {"samples": 1200, "duplicates": 0, "dlq": 1}
    tests = {t["name"]: t for t in rep["tests"]}
    assert tests["length"]["significant_at_0.05"]
    assert not tests["unsafe"]["significant_at_0.05"]
    assert rep["exact_match"]["pairs"] > 0
