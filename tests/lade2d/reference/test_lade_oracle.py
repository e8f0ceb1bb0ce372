"""The reference against hao-ai-lab's own LADE (``lade==0.0.2``), run in its own venv.

The project's reference shares its pool, layout and verifier with the vLLM 2D path, so comparing
those two checks the wiring only.  This compares it with the original code: with LADE's settings
(no prompt pool, no bonus token on a full match, LADE's ``random.seed(10)`` window) the reference must
commit, forward for forward, exactly what ``lade`` commits; with its defaults it must differ (the
switches are real), and every output equals plain greedy.  The full 30+30-prompt comparison is
``benchmarks/lade_oracle.py`` (``benchmarks/results/lade_oracle_w7n4g7.json``).

The oracle venv comes from ``scripts/setup_lade_oracle.sh`` (called by ``scripts/setup.sh``; cached,
seconds once uv's cache holds torch).  If it is missing the test fails with the command to run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from vllm_lookahead.lade2d.reference import greedy_generate, lade_generate, load_model
from vllm_lookahead.lade2d.reference.bench import model_eos
from vllm_lookahead.prompts import load_heldout_prompts

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
import lade_oracle  # noqa: E402

MAX_NEW = 48
W, N, G = 7, 4, 7


@pytest.fixture(scope="module")
def oracle_python() -> str:
    res = subprocess.run([str(ROOT / "scripts" / "setup_lade_oracle.sh")], capture_output=True, text=True)
    assert res.returncode == 0, f"scripts/setup_lade_oracle.sh failed (run it by hand):\n{res.stderr[-2000:]}"
    return res.stdout.strip().splitlines()[-1]


def test_reference_reproduces_hao_ai_lab_lade_step_for_step(demo_model, oracle_python) -> None:
    model = load_model(demo_model, "float32")
    tok = AutoTokenizer.from_pretrained(demo_model)
    texts = load_heldout_prompts(3, "open") + load_heldout_prompts(3, "copy")
    prompts = [tok(t)["input_ids"] for t in texts]
    eos = model_eos(model)
    lade = lade_oracle.run_lade(oracle_python, str(demo_model), (W, N, G), MAX_NEW, eos, prompts)["results"]
    differs = 0
    for i, (p, ref) in enumerate(zip(prompts, lade, strict=True)):
        greedy = greedy_generate(model, p, MAX_NEW, eos)
        assert ref["tokens"] == greedy, f"prompt {i}: lade's output differs from greedy"
        compat = lade_generate(model, p, MAX_NEW, window=W, ngram=N, pool_size=G, eos_token_id=eos,
                               **lade_oracle.VARIANTS["lade_compatible"])
        assert compat.tokens == ref["tokens"]
        assert compat.accepted == ref["accepted"], (
            f"prompt {i}: tokens per forward differ from lade 0.0.2\nref  {compat.accepted}\nlade {ref['accepted']}")
        default = lade_generate(model, p, MAX_NEW, window=W, ngram=N, pool_size=G, eos_token_id=eos)
        assert default.tokens == greedy
        differs += default.accepted != ref["accepted"]
    # multi-token steps really happened, and the reference's defaults (prompt pool, bonus) change them
    assert sum(a > 1 for r in lade for a in r["accepted"]) > 0
    assert differs > 0
