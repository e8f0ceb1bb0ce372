"""The sidecar must run without vLLM: importing all of it loads neither vllm nor vllm_lookahead."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


def test_sidecar_never_imports_vllm():
    code = ("import sys, quality_sidecar.cli, quality_sidecar.service, quality_sidecar.offline, "
            "quality_sidecar.sources.kafka, quality_sidecar.sinks, quality_sidecar.replay; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'vllm_lookahead')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
