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
import sys
import time
from pathlib import Path

import pytest

from tests.support.process import free_port, spawn, stop_process_group, wait_http_ok

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
        self.proc = spawn(["bash", "-c", self.command], log, env)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait(self, deadline: float) -> None:
        wait_http_ok(self.url + "/health", self.proc, self.log, deadline - time.time(), self.command)

    def stop(self) -> None:
        stop_process_group(self.proc)


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


@pytest.fixture(scope="module")
def readme_servers(demo_model, tmp_path_factory):
    """The README's lookahead server and the same command without speculation, started once for the
    module (start-up dominates on 2 cores)."""
    cmd = readme_serve_command()
    assert "--dtype" not in cmd  # the README relies on the float32 default of `vllm-lookahead serve`
    tmp = tmp_path_factory.mktemp("serve")
    servers = {"lookahead": Server(cmd, demo_model, tmp / "lookahead.log"),
               "none": Server(strip_speculation(cmd), demo_model, tmp / "none.log")}
    try:
        deadline = time.time() + 900
        for s in servers.values():
            s.wait(deadline)
        yield servers
    finally:
        for s in servers.values():
            s.stop()


def test_readme_serve_command_is_lossless_with_the_openai_client(demo_model, readme_servers):
    import requests

    servers = readme_servers
    got = {name: completions(s, demo_model) for name, s in servers.items()}
    metrics = requests.get(servers["lookahead"].url + "/metrics", timeout=10).text
    assert got["lookahead"] == got["none"]
    assert all(len(t) > 20 for t in got["none"])
    accepted = sum(float(ln.rsplit(" ", 1)[1]) for ln in metrics.splitlines()
                   if ln.startswith("vllm:spec_decode_num_accepted_tokens_total"))
    assert accepted > 0, "the lookahead server never accepted a draft: the comparison would prove nothing"
    log = servers["lookahead"].log.read_text(errors="replace")
    assert "dtype=torch.float32" in log, "float32 default of `vllm-lookahead serve` not in force"
    # the drafts came back with the sampled tokens (draft_reply.py), in the EngineCore of the lookahead server only
    assert any("EngineCore" in ln and "drafts return with the sampled tokens" in ln for ln in log.splitlines()), log[-3000:]
    assert "drafts return with the sampled tokens" not in servers["none"].log.read_text(errors="replace")


# ---- issue 55: every sampling field a plain server serves, the lookahead server serves ---------------
FIELD_PROMPTS = ["def fibonacci(n):\n", "import os\nimport sys\n\ndef main():\n"]


def _field_cases(ids: dict[str, list[int]]) -> dict[str, dict]:
    """Request bodies, one per sampling field (and a few together), at T=0 unless the field is about
    sampling.  ``ids`` holds token ids of a few words (from the server's /tokenize)."""
    ret, colon, space = ids["return"][0], ids[":"][0], ids[" "][0]
    t0 = {"temperature": 0}
    t1 = {"temperature": 0.9, "top_p": 0.95, "seed": 1234}
    return {
        "greedy": {**t0},
        "top_p": {**t0, "top_p": 0.5}, "top_k": {**t0, "top_k": 5}, "min_p": {**t0, "min_p": 0.2},
        "presence_penalty": {**t0, "presence_penalty": 1.5},
        "frequency_penalty": {**t0, "frequency_penalty": 1.0},
        "repetition_penalty": {**t0, "repetition_penalty": 1.3},
        "logit_bias": {**t0, "logit_bias": {str(colon): 6.0, str(ret): -100}},
        "seed": {**t0, "seed": 7},
        "stop": {**t0, "stop": ["\n\n", "return"]}, "stop_token_ids": {**t0, "stop_token_ids": [ret]},
        "bad_words": {**t0, "bad_words": ["return", " if"]},
        "allowed_token_ids": {**t0, "allowed_token_ids": sorted({ret, colon, space, *ids["x"], *ids["(n)"]})},
        "min_tokens": {**t0, "min_tokens": 40, "max_tokens": 48},
        "ignore_eos": {**t0, "ignore_eos": True},
        "logprobs": {**t0, "logprobs": 3}, "prompt_logprobs": {**t0, "prompt_logprobs": 2},
        "echo": {**t0, "echo": True},
        "structured_choice": {**t0, "structured_outputs": {"choice": ["yes", "no", "maybe"]}},
        "structured_regex": {**t0, "structured_outputs": {"regex": "[a-z_]+\\(n\\)"}, "max_tokens": 12},
        "all_at_t0": {**t0, "top_k": 20, "min_p": 0.1, "presence_penalty": 0.5, "frequency_penalty": 0.2,
                      "repetition_penalty": 1.1, "logit_bias": {str(colon): 3.0}, "bad_words": ["while"],
                      "min_tokens": 8, "logprobs": 2, "stop": ["\n\n\n"]},
        # sampling: the same seed on both servers
        "t_seeded": {**t1},
        "t_min_p": {**t1, "min_p": 0.1},
        "t_logit_bias": {**t1, "logit_bias": {str(colon): 4.0}},
        "t_top_k": {**t1, "top_k": 20},
        "t_n2": {"temperature": 1.0, "n": 2, "seed": 3},
        "t_all": {**t1, "top_k": 40, "min_p": 0.05, "presence_penalty": 0.3, "repetition_penalty": 1.1,
                  "logit_bias": {str(ret): -2.0}, "bad_words": ["while"], "min_tokens": 4, "logprobs": 1},
    }


# Seeded T>0 requests that lookahead does not draft for (logit bias or min-p at T>0) are sampled exactly
# as plain decoding samples them: the same tokens.  Drafted seeded requests are compared in
# test_seeded_coupled.py (coupled verification, vllm/coupled_verify.py).
T_EXACT = {"t_min_p", "t_logit_bias", "t_all"}


def _post(server: Server, name: str, body: dict) -> tuple[int, dict]:
    import requests

    r = requests.post(server.url + "/v1/completions", json={"model": name, **body}, timeout=180)
    return r.status_code, (r.json() if r.headers.get("content-type", "").startswith("application/json") else {})


def _texts(reply: dict) -> list[str]:
    return [c["text"] for c in reply.get("choices", [])]


def test_every_sampling_field_is_served_as_without_speculation(readme_servers):
    """Each field answers 200 on both servers (vLLM alone refuses min_p and logit_bias with any
    speculative config: 400), with the same text at T=0 and for the undrafted seeded requests; the T=0
    cases once more sent all at once to the lookahead server, so that undrafted rows share speculative
    steps with drafted ones (the bonus-sampler path of vLLM's rejection sampler)."""
    from concurrent.futures import ThreadPoolExecutor

    import requests

    servers = readme_servers
    name = requests.get(servers["none"].url + "/v1/models", timeout=10).json()["data"][0]["id"]
    ids = {w: requests.post(servers["none"].url + "/tokenize", json={"model": name, "prompt": w,
                                                                      "add_special_tokens": False},
                            timeout=10).json()["tokens"] for w in ("return", ":", " ", "x", "(n)")}
    cases = _field_cases(ids)
    got: dict[str, dict[str, tuple[int, list[str]]]] = {"none": {}, "lookahead": {}}
    for server_name, server in servers.items():
        for case, body in cases.items():
            for j, prompt in enumerate(FIELD_PROMPTS):
                status, reply = _post(server, name, {"prompt": prompt, "max_tokens": 32, **body})
                got[server_name][f"{case}/{j}"] = (status, _texts(reply) if status == 200 else [str(reply)[:300]])
    refused = {k: v for k, v in got["lookahead"].items() if v[0] != 200}
    assert not refused, f"the lookahead server refused: {refused}"
    assert all(v[0] == 200 for v in got["none"].values()), got["none"]
    exact = [k for k in got["none"] if not k.startswith("t_") or k.split("/")[0] in T_EXACT]
    differ = {k: (got["none"][k][1], got["lookahead"][k][1]) for k in exact if got["none"][k] != got["lookahead"][k]}
    assert not differ, f"outputs differ from the plain server: {differ}"
    # the fields really acted (the comparison would prove little if they were ignored on both)
    for case in ("logit_bias", "allowed_token_ids", "t_logit_bias"):
        other = "t_seeded" if case.startswith("t_") else "greedy"
        assert got["none"][f"{case}/0"] != got["none"][f"{other}/0"], case
    assert "return" not in got["lookahead"]["logit_bias/0"][1][0]
    # the T=0 cases together: undrafted rows in speculative steps beside drafted ones
    t0_cases = [(case, j, body) for case, body in cases.items() if not case.startswith("t_")
                for j in range(len(FIELD_PROMPTS))]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda c: _post(servers["lookahead"], name,
                                                 {"prompt": FIELD_PROMPTS[c[1]], "max_tokens": 32, **c[2]}),
                                 t0_cases))
    differ = {f"{c}/{j}": (got["none"][f"{c}/{j}"][1], _texts(r)) for (c, j, _), (st, r) in zip(t0_cases, together)
              if (st, _texts(r)) != got["none"][f"{c}/{j}"]}
    assert not differ, f"batched on the lookahead server, outputs differ from the plain server: {differ}"


def _long_prompt(i: int) -> str:
    """~420 tokens of code (under the servers' 512-token context with 32 to generate)."""
    return "".join(f"def f{i}_{j}(x):\n    return x * {j} + {(i + j) % 7}\n\n" for j in range(25)) + "def g(y):\n"


def test_seeded_requests_in_chunked_prefill_are_served_by_both_servers(readme_servers):
    """Eight seeded T>0 requests of ~420 prompt tokens at once exceed a step's token budget (vLLM's
    2048 for an API server), so some prefills are chunked: a plain vllm-cpu 0.32 server dies there
    (``vllm/fixes.py``, fix 4), a ``vllm-lookahead serve`` server -- with or without speculation --
    answers every request, the two servers' texts are equal (coupled verification), and a request
    sent again alone (its prefill now in one step) reproduces its text."""
    from concurrent.futures import ThreadPoolExecutor

    import requests

    servers = readme_servers
    name = requests.get(servers["none"].url + "/v1/models", timeout=10).json()["data"][0]["id"]
    prompts = [_long_prompt(i) for i in range(8)]
    n_tokens = [len(requests.post(servers["none"].url + "/tokenize", json={"model": name, "prompt": p},
                                  timeout=10).json()["tokens"]) for p in prompts]
    assert sum(n_tokens) > 2048 and max(n_tokens) <= 512 - 32, n_tokens
    bodies = [{"prompt": p, "max_tokens": 32, "temperature": 0.9, "top_p": 0.95, "seed": 100 + i}
              for i, p in enumerate(prompts)]
    got = {}
    for server_name, server in servers.items():
        with ThreadPoolExecutor(8) as pool:
            replies = list(pool.map(lambda b, s=server: _post(s, name, b), bodies))
        assert all(st == 200 for st, _ in replies), [(st, str(r)[:200]) for st, r in replies]
        got[server_name] = [_texts(r)[0] for _, r in replies]
        assert requests.get(server.url + "/health", timeout=10).status_code == 200
        assert server.proc.poll() is None
    assert got["none"] == got["lookahead"]
    assert len(set(got["none"])) > 1  # the seeds acted: not one text for all
    status, alone = _post(servers["none"], name, bodies[0])
    assert status == 200 and _texts(alone)[0] == got["none"][0]
