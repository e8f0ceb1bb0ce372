"""Loading a causal LM for the reference decoder, and the one forward pass it needs.

The reference decoder drives a plain Hugging Face ``LlamaForCausalLM`` (transformers 5.x): it passes its
own 4D attention mask and position ids and edits the ``DynamicCache`` between steps.  Those two touch
points live here so the decoder reads as the algorithm.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_model(path: str | Path, dtype: str = "float32") -> PreTrainedModel:
    """Load a causal LM from a local directory for decoding (eval mode, no grad needed).

    float32 is the default because only float32 makes "identical to plain greedy" a fair test: in
    half precision, a different number of query rows per matmul may flip near-tied argmaxes.
    """
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {sorted(_DTYPES)}")
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} is not a model directory (no config.json)")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[dtype])
    model.eval()
    return model


def vocab_size(model: PreTrainedModel) -> int:
    return int(model.config.vocab_size)


@torch.no_grad()
def forward_rows(
    model: PreTrainedModel,
    cache: DynamicCache,
    tokens: list[int],
    positions: list[int] | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run ``tokens`` after the cached prefix; returns float32 logits [len(tokens), vocab].

    With ``positions``/``mask`` omitted this is an ordinary causal forward (what plain greedy uses).
    The cache grows by ``len(tokens)`` entries; callers trim it with :func:`keep_cache_rows`.
    """
    device = model.device
    kwargs: dict = {}
    if positions is not None:
        kwargs["position_ids"] = torch.tensor([positions], dtype=torch.long, device=device)
    if mask is not None:
        kwargs["attention_mask"] = mask.to(device=device, dtype=model.dtype)
    out = model(
        input_ids=torch.tensor([tokens], dtype=torch.long, device=device),
        past_key_values=cache,
        use_cache=True,
        **kwargs,
    )
    return out.logits[0].float()


def keep_cache_rows(cache: DynamicCache, keep: list[int]) -> None:
    """Keep only the cache entries at sequence indices ``keep`` (in that order), in every layer.

    This is how the decoder drops the lookahead window and the rejected candidates after a step while
    keeping the KV of the current token and of the accepted candidate's tokens (what LADE copies).
    """
    for layer in cache.layers:
        idx = torch.tensor(keep, dtype=torch.long, device=layer.keys.device)
        layer.keys = layer.keys.index_select(-2, idx)
        layer.values = layer.values.index_select(-2, idx)


def cache_len(cache: DynamicCache) -> int:
    return int(cache.get_seq_length())
