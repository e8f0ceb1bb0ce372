"""Start, watch and stop the real services of the tests (Kafka, Jaeger, vLLM, a Kubernetes control
plane): one way to spawn, read a log, wait for health and stop, shared by every helper here.

Each service runs in a session of its own (``start_new_session=True``) so that stopping it reaches the
processes it forks (vLLM's API server forks an engine core, kafka's launcher a JVM), with its output
appended to a log file the error messages quote.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A loopback port free now (another process may take it before the caller binds it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path: str | Path, n: int = 40) -> str:
    """The last ``n`` lines of a service's log ("" before it wrote any)."""
    p = Path(path)
    return "\n".join(p.read_text(errors="replace").splitlines()[-n:]) if p.exists() else ""


def spawn(cmd: Sequence[str], log: str | Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``cmd`` in a new session, stdout and stderr appended to ``log`` (the child keeps its own handle)."""
    with open(log, "ab") as fh:
        return subprocess.Popen(list(cmd), env=env, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def wait_http_ok(url: str, proc: subprocess.Popen, log: str | Path, timeout_s: float, what: str) -> None:
    """Poll ``url`` until it answers 200; raise with the log's tail if ``proc`` exits or time runs out."""
    import requests

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log_tail(log)}")
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1.0)
    raise TimeoutError(f"{what} not healthy after {timeout_s:.0f} s:\n{log_tail(log)}")


def stop_process_group(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM the session a service was started in, SIGKILL it if still there after ``grace_s``."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGCONT)  # a paused (SIGSTOP) service cannot act on SIGTERM
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


class Service:
    """What every service helper shares: a work directory (a temp one it owns and removes unless the caller
    gives one), ``close()`` = ``stop()`` then that directory, and ``with``: ``start()`` ... ``close()``
    (a failing close never hides the test's own error).  Subclasses define ``start`` and ``stop``."""

    def __init__(self, workdir: str | Path | None, prefix: str):
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=prefix))

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.close()
