"""Runs hao-ai-lab's own LADE (PyPI ``lade``) on token ids; executed by the oracle venv's python.

Started by ``benchmarks/lade_oracle.py`` with the interpreter from ``scripts/setup_lade_oracle.sh``
(lade 0.0.2, transformers 4.34.1, torch 2.13).  It must not import this project: the project needs
transformers 5, lade needs 4.34.  Input (stdin, JSON): model dir, W/N/G, max_new_tokens, eos,
prompts as token ids (the demo tokenizer.json is too new for transformers 4.34's tokenizers, so
the caller tokenizes).  Output (stdout, last line, JSON): per prompt, LADE's tokens, its forward
count and the tokens each forward committed, plus plain greedy from the same transformers 4.34 model.

LADE is used exactly as its README says -- ``lade.augment_all()``, ``lade.config_lade(...)``,
``USE_LADE=1``, then ``model.generate`` -- with one instrument: a wrapper around
``LlamaForCausalLM.jforward_multilevel`` that counts forwards and records the attention-mask length
at each call (LADE grows it by exactly the tokens it commits), which gives tokens per step.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> int:
    req = json.loads(sys.stdin.read())
    os.environ["USE_LADE"] = "1"
    import lade  # noqa: E402  (needs USE_LADE read at call time only; import after env for clarity)
    import torch
    import transformers
    from transformers import LlamaForCausalLM
    from transformers.models.llama import modeling_llama

    torch.set_num_threads(int(req.get("threads", 1)))
    lade.augment_all()
    lade.config_lade(LEVEL=req["ngram"], WINDOW_SIZE=req["window"], GUESS_SET_SIZE=req["pool_size"], DEBUG=0)

    calls: list[int] = []
    original = modeling_llama.LlamaForCausalLM.jforward_multilevel

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(int(kwargs["attention_mask"].shape[1]))
        return original(self, *args, **kwargs)

    modeling_llama.LlamaForCausalLM.jforward_multilevel = counted

    model = LlamaForCausalLM.from_pretrained(req["model"], torch_dtype=torch.float32).eval()
    eos = req["eos_token_id"]
    max_new = int(req["max_new_tokens"])
    out = []
    t0 = time.perf_counter()
    for ids in req["prompts"]:
        x = torch.tensor([ids], dtype=torch.long)
        mask = torch.ones_like(x)
        kw = {"max_new_tokens": max_new, "do_sample": False, "num_beams": 1, "attention_mask": mask,
              "pad_token_id": 0 if eos is None else eos, "eos_token_id": eos}
        calls.clear()
        os.environ["USE_LADE"] = "1"
        with torch.no_grad():
            seq = model.generate(x, **kw)[0].tolist()
        tokens = seq[len(ids):]
        lengths = calls + [len(ids) + len(tokens)]
        # Tokens committed by each forward = growth of the sequence between calls; the last forward
        # may overshoot max_new_tokens (LADE truncates after the loop), so cap the running total.
        accepted, total = [], 0
        for a, b in zip(lengths, lengths[1:]):
            n = min(b - a, len(tokens) - total)
            accepted.append(max(n, 0))
            total += max(n, 0)
        forwards = len(calls)
        os.environ["USE_LADE"] = "0"
        with torch.no_grad():
            greedy = model.generate(x, **kw)[0].tolist()[len(ids):]
        out.append({"tokens": tokens, "forwards": forwards, "accepted": accepted, "greedy": greedy})
    print(json.dumps({
        "versions": {"lade": getattr(lade, "__version__", None) or _dist_version("lade"),
                     "transformers": transformers.__version__, "torch": torch.__version__},
        "seconds": time.perf_counter() - t0,
        "results": out,
    }))
    return 0


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
