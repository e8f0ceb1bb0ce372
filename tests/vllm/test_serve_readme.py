"""The README's serve command, run as the README writes it, answers the official ``openai`` client, and
its T=0 completions equal a server without speculation token for token (issue 15, item 1).

The command is taken from README.md (the fenced block that starts ``vllm-lookahead serve MODEL``), MODEL
replaced by the demo model, and run through ``bash -c`` with this venv's ``bin`` on PATH -- what a user
who ran scripts/setup.sh and activated the venv types.  Only test-environment flags are appended
(host/port, a small max-model-len).  The baseline is the same command without the speculative and
lookahead options.  Both servers start concurrently (start-up dominates on 2 cores).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_lookahead.devtools.kafka_broker import free_port
from vllm_lookahead.devtools.vllm_server import stop_process_group

pytestmark = [pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["def fibonacci(n):\n", "for i in range(10):\n", "class Stack:\n    def __init__(self):\n"]


def readme_serve_command() -> str:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    cmds = [b for b in blocks if b.lstrip().startswith("vllm-lookahead serve MODEL")]
    assert len(cmds) == 1, "README must have one `vllm-lookahead serve MODEL` block"
    return cmds[0].replace("\\\n", " ").strip()


def strip_speculation(cmd: str) -> str:
    words = shlex.split(cmd)
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
            continue
        if w in ("--speculative-config", "--additional-config"):
            skip = True
            continue
        out.append(w)
    return shlex.join(out)


class Server:
    def __init__(self, command: str, model: Path, log: Path):
        self.port = free_port()
        self.command = command.replace("MODEL", shlex.quote(str(model)), 1) + \
            f" --host 127.0.0.1 --port {self.port} --max-model-len 512 --max-num-seqs 8"
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false",
               "VLLM_LOGGING_LEVEL": "INFO",  # the engine's config line (dtype) is checked below
               "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
        for k in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_LOOKAHEAD_TELEMETRY", "VLLM_LOOKAHEAD_CONFIG"):
            env.pop(k, None)
        self.log = log
        self._fh = open(log, "ab")  # noqa: SIM115 (kept open for the process)
        self.proc = subprocess.Popen(["bash", "-c", self.command], env=env, stdout=self._fh,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait(self, deadline: float) -> None:
        import requests

        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {self.command}\n"
                                   + self.log.read_text(errors="replace")[-3000:])
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(1.0)
        raise TimeoutError(f"not healthy: {self.command}\n" + self.log.read_text(errors="replace")[-3000:])

    def stop(self) -> None:
        stop_process_group(self.proc)
        self._fh.close()


def completions(server: Server, model: Path) -> list[list[int]]:
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    name = client.models.list().data[0].id
    assert name == str(model)
    out = []
    for prompt in PROMPTS:
        r = client.completions.create(model=name, prompt=prompt, max_tokens=48, temperature=0,
                                      logprobs=0)
        assert r.choices[0].finish_reason in ("length", "stop")
        out.append(r.choices[0].text)
    return out


def test_readme_serve_command_is_lossless_with_the_openai_client(demo_model, tmp_path):
    import requests

    cmd = readme_serve_command()
    assert "--dtype" not in cmd  # the README relies on the float32 default of `vllm-lookahead serve`
    servers = {"lookahead": Server(cmd, demo_model, tmp_path / "lookahead.log"),
               "none": Server(strip_speculation(cmd), demo_model, tmp_path / "none.log")}
    try:
        deadline = time.time() + 900
        for s in servers.values():
            s.wait(deadline)
        got = {name: completions(s, demo_model) for name, s in servers.items()}
        metrics = requests.get(servers["lookahead"].url + "/metrics", timeout=10).text
    finally:
        for s in servers.values():
            s.stop()
    assert got["lookahead"] == got["none"]
    assert all(len(t) > 20 for t in got["none"])
    accepted = sum(float(ln.rsplit(" ", 1)[1]) for ln in metrics.splitlines()
                   if ln.startswith("vllm:spec_decode_num_accepted_tokens_total"))
    assert accepted > 0, "the lookahead server never accepted a draft: the comparison would prove nothing"
    log = servers["lookahead"].log.read_text(errors="replace")
    assert "dtype=torch.float32" in log, "float32 default of `vllm-lookahead serve` not in force"
