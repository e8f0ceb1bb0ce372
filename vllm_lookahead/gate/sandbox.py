"""Run untrusted (model-written) Python in a subprocess with limits.

Why not ``exec``: a completion can loop forever, eat memory or touch files.  Each run gets its own
temporary directory as cwd, ``python -I`` (isolated: no user site, no PYTHON* env, no cwd on sys.path),
an empty environment, RLIMIT_AS / RLIMIT_CPU / RLIMIT_FSIZE limits and a wall-clock timeout.  This is
a guard against accidents, not a security boundary against a hostile model (no seccomp, no network
namespace).
"""

from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SandboxResult:
    ok: bool
    returncode: int | None
    timed_out: bool
    stderr_tail: str

    def summary(self) -> str:
        if self.timed_out:
            return "timeout"
        if self.ok:
            return "tests passed"
        last = self.stderr_tail.strip().splitlines()[-1:] or [f"exit {self.returncode}"]
        return f"tests failed: {last[0][:100]}"


def _limits(timeout_s: float, memory_mb: int):
    def apply() -> None:  # runs in the child between fork and exec
        mem = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        cpu = max(1, int(timeout_s) + 1)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def run_python(source: str, *, timeout_s: float = 5.0, memory_mb: int = 256) -> SandboxResult:
    """Execute ``source`` as a script; ok means exit status 0 within the limits."""
    with tempfile.TemporaryDirectory(prefix="gate-sandbox-") as tmp:
        script = Path(tmp) / "candidate.py"
        script.write_text(source, encoding="utf-8")
        try:
            proc = subprocess.run(
                [sys.executable, "-I", str(script)], cwd=tmp, env={"PATH": "/usr/bin:/bin"},
                stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s,
                preexec_fn=_limits(timeout_s, memory_mb), check=False)
        except subprocess.TimeoutExpired:
            return SandboxResult(False, None, True, "")
        return SandboxResult(proc.returncode == 0, proc.returncode, False,
                             proc.stderr.decode("utf-8", "replace")[-2000:])
