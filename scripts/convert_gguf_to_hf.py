"""Turn a GGUF file into a float32 Hugging Face checkpoint directory that vLLM loads.

Called by scripts/setup_real_model.sh (see models/smollm2-135m-instruct.md); usable on its own::

    .venv/bin/python scripts/convert_gguf_to_hf.py --gguf FILE.gguf --out DIR

Why this exists: vLLM's own GGUF path is not in the CPU wheel's tested set, and the project's lossless
claims are measured in float32.  transformers reads GGUF (with the ``gguf`` package) and dequantises
every tensor to float32; the model it returns still carries a GGUF ``quantization_config`` that
``save_pretrained`` refuses, so the weights are copied into a plain ``LlamaForCausalLM`` built from the
same config (minus that entry) and saved as safetensors with the tokenizer and chat template.  The
result is deterministic for fixed versions of transformers/gguf/torch (setup_real_model.sh pins them
and checks the files against committed checksums).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path


def convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    torch.manual_seed(0)  # the fresh model's init is overwritten, but keep even that fixed
    src, name = str(gguf.parent), gguf.name
    tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    cfg_dict = loaded.config.to_dict()
    for key in ("quantization_config", "_model_name_or_path"):
        cfg_dict.pop(key, None)
    cfg = AutoConfig.for_model(**cfg_dict)
    model = MODEL_FOR_CAUSAL_LM_MAPPING[type(cfg)](cfg).to(torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.eval()
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    convert(args.gguf, args.out)


if __name__ == "__main__":
    main()
