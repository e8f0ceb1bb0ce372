"""Helpers for the sidecar tests: sample files and a small, fast detector config."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest

from tests.support.synth import SampleStream

# A smaller reference window keeps calibration + reference filling to a few seconds per test.
FAST_MONITOR = {"reference_size": 600, "window": 400}


def write_jsonl(path: Path, samples, extra_lines=()) -> Path:
    with path.open("w") as fh:
        for s in samples:
            fh.write(json.dumps(s) + "\n")
        for line in extra_lines:
            fh.write(line + "\n")
    return path


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def run_and_scrape(svc) -> str:
    """Run a ``Service`` to its end and return its /metrics text as it was just before it closed."""
    port, seen, orig = svc.http.port, {}, svc.close

    def close() -> None:
        seen["metrics"] = scrape(port)
        orig()

    svc.close = close
    assert svc.run() == 0
    return seen["metrics"]


def metric_sum(text: str, name: str, **labels) -> float:
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{name}(\{{[^}}]*\}})? ([0-9.e+-]+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            total += float(m.group(2))
    return total


@pytest.fixture
def clean_and_regressed():
    def make(regression: str | None, n_ref: int = 800, n_after: int = 1500, seed: int = 0):
        s = SampleStream(seed=seed, arm="candidate")
        ref = s.take(n_ref)
        s.regression = regression
        return ref, s.take(n_after)
    return make
