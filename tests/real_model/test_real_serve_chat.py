"""Greedy exactness on the real model through the OpenAI **chat** API of ``vllm-lookahead serve``: the
README's serve command (its default lookahead, float32 by default) against the same command without
speculation, the chat template applied by vLLM, token for token (``return_token_ids``), requests one at a
time (batch 1) and 8 at once (batch up to 8).
"""

from __future__ import annotations

import re
import shlex
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from real_model_support import CHAT_PROMPTS, ROOT, chat_messages

pytestmark = [pytest.mark.real_model]

MAX_TOKENS = 64


def readme_serve_args() -> list[str]:
    """The options of README's ``vllm-lookahead serve MODEL ...`` block (its speculative config)."""
    text = (ROOT / "README.md").read_text()
    blocks = [b for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)
              if b.lstrip().startswith("vllm-lookahead serve MODEL")]
    assert len(blocks) == 1, "README must have one `vllm-lookahead serve MODEL` block"
    words = shlex.split(blocks[0].replace("\\\n", " "))
    assert words[:3] == ["vllm-lookahead", "serve", "MODEL"], words
    assert "--dtype" not in words  # float32 is the serve command's default
    return words[3:]


def chat(url: str, prompt: str) -> tuple[list[int], str]:
    import requests

    r = requests.post(url + "/v1/chat/completions", timeout=300, json={
        "model": "m", "messages": chat_messages(prompt), "max_tokens": MAX_TOKENS, "temperature": 0,
        "return_token_ids": True})
    r.raise_for_status()
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] in ("length", "stop"), choice
    return list(choice["token_ids"]), choice["message"]["content"]


def run_all(url: str) -> dict:
    one = [chat(url, p) for p in CHAT_PROMPTS]
    with ThreadPoolExecutor(8) as ex:
        eight = list(ex.map(lambda p: chat(url, p), CHAT_PROMPTS))
    return {1: one, 8: eight}


@pytest.fixture(scope="module")
def served(real_model, tmp_path_factory):
    import requests

    from tests.support.vllm_server import VllmServer

    common = ["--served-model-name", "m", "--max-model-len", "1024", "--max-num-seqs", "8"]
    env = {"VLLM_CPU_KVCACHE_SPACE": "2", "TOKENIZERS_PARALLELISM": "false", "VLLM_LOGGING_LEVEL": "INFO"}
    servers = {"none": VllmServer(str(real_model), env, common, str(tmp_path_factory.mktemp("none"))),
               "lookahead": VllmServer(str(real_model), env, [*common, *readme_serve_args()],
                                       str(tmp_path_factory.mktemp("lookahead")))}
    got: dict = {}
    try:
        for name, s in servers.items():  # one after the other: two engines on 2 cores starve each other
            s.start(timeout_s=900)
            got[name] = run_all(s.url)
            if name == "lookahead":
                got["metrics"] = requests.get(s.url + "/metrics", timeout=10).text
                got["log"] = Path(s.log_path).read_text(errors="replace")
            s.stop()
    finally:
        for s in servers.values():
            s.stop()
    return got


@pytest.mark.parametrize("bs", (1, 8))
def test_real_model_chat_api_greedy_identical(served, bs):
    base, cand = served["none"][bs], served["lookahead"][bs]
    mismatched = [i for i, (a, b) in enumerate(zip(base, cand, strict=True)) if a[0] != b[0]]
    assert not mismatched, f"{len(mismatched)}/{len(base)} chat completions differ at batch {bs}: {mismatched}"
    assert all(len(ids) > 0 for ids, _ in base)
    assert "Paris" in base[0][1], base[0][1]


def test_real_model_chat_api_speculated_in_float32(served):
    accepted = sum(float(ln.rsplit(" ", 1)[1]) for ln in served["metrics"].splitlines()
                   if ln.startswith("vllm:spec_decode_num_accepted_tokens_total"))
    assert accepted > 0, "the lookahead server never accepted a draft: the comparison would prove nothing"
    assert "dtype=torch.float32" in served["log"], "float32 default of `vllm-lookahead serve` not in force"
