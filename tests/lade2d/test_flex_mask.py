"""LADE's FlexAttention mask (the CUDA path's mask, ``vllm_lookahead.lade2d.flex_mask``), checked on CPU.

1. Through vLLM's own paged index mapping: the patched ``FlexAttentionMetadata.get_paged_mask_mod``,
   on a two-request batch with out-of-order physical blocks, gives LADE's visibility (prefix + plan)
   for the flagged request and plain causal for the other -- pair by pair, against a dense oracle.
2. Through torch's ``create_block_mask`` + ``flex_attention``: the output equals SDPA with the dense
   mask, and differs from causal attention on the rows LADE masks (so the check has teeth).
The engine wiring on a GPU is not done (see the module docstring); this is what can be checked here.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from vllm_lookahead.lade2d.flex_mask import (
    LadeMaskTables,
    install_flex_mask_patch,
    lade_mask_mod,
)
from vllm_lookahead.lade2d.lade import LadeState

pytestmark = [pytest.mark.vllm]
BLOCK = 16


def steady_plan(p: int):
    """A steady-state plan (candidates + full window) for a request with ``p`` cached tokens."""
    prompt = [1, 2, 3, 4, 5, 2, 3, 6, 1, 2, 3, 7] * 4
    st = LadeState(3, 3, 3, seed=0)
    st.observe(prompt + [2], len(prompt) + 1, len(prompt))
    for _ in range(3):
        plan = st.plan(2, p)
        st.absorb(plan, [3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2][: len(plan.tokens)] * 2, 0)
    plan = st.plan(2, p)
    assert plan.full and len(plan.guesses) >= 2
    return plan


def dense_expected(plan, p: int) -> torch.Tensor:
    """bool [L, p + L]: the prefix, then the plan's in-step visibility."""
    n = len(plan.tokens)
    return torch.cat([torch.ones(n, p, dtype=torch.bool), plan.visible], dim=1)


def test_patched_paged_mask_mod_gives_lade_visibility():
    from vllm.v1.attention.backends.flex_attention import FlexAttentionMetadata

    pa, pb, qb = 37, 21, 3
    plan = steady_plan(pa)
    la = len(plan.tokens)
    seq = [pa + la, pb + qb]
    q_lens = [la, qb]
    # physical blocks: request 0 uses [5, 1, 3, 0], request 1 uses [4, 2]; physical_to_logical inverts
    tables_phys = [[5, 1, 3, 0], [4, 2]]
    n_phys = 6
    p2l = torch.full((2, n_phys), -1, dtype=torch.long)
    for r, blocks in enumerate(tables_phys):
        for logical, phys in enumerate(blocks):
            p2l[r, phys] = logical
    qsl = torch.tensor([0, la, la + qb])
    current = {"tables": LadeMaskTables.build(2, [(0, plan.visible)])}
    install_flex_mask_patch(lambda: current["tables"])
    meta = FlexAttentionMetadata(
        causal=True, num_actual_tokens=la + qb, max_query_len=la, query_start_loc=qsl, query_start_loc_cpu=qsl,
        max_seq_len=max(seq), seq_lens=torch.tensor(seq), block_table=torch.zeros(2, 4, dtype=torch.long),
        slot_mapping=torch.zeros(la + qb, dtype=torch.long), total_cache_tokens=n_phys * BLOCK,
        block_size=BLOCK, max_possible_sequence_length=4 * BLOCK, num_reqs=2, physical_to_logical=p2l,
        decode_offset=torch.tensor([seq[0] - q_lens[0], seq[1] - q_lens[1]]),
        num_blocks_per_seq=torch.tensor([4, 2]), persistent_kv_indices=torch.zeros(1),
        persistent_kv_num_blocks=torch.zeros(1), persistent_doc_ids=torch.zeros(la + qb, dtype=torch.int32))
    assert meta.doc_ids.tolist() == [0] * la + [1] * qb
    mask_mod = meta.get_paged_mask_mod()
    q_idx = torch.arange(la + qb)[:, None]
    kv_idx = torch.arange(n_phys * BLOCK)[None, :]
    got = mask_mod(torch.zeros(()), torch.zeros(()), q_idx, kv_idx)

    want = torch.zeros_like(got)
    exp_a = dense_expected(plan, pa)
    for r, blocks in enumerate(tables_phys):
        for logical, phys in enumerate(blocks):
            for off in range(BLOCK):
                lk = logical * BLOCK + off
                if lk >= seq[r]:
                    continue
                for row in range(q_lens[r]):
                    q = qsl[r] + row
                    want[q, phys * BLOCK + off] = exp_a[row, lk] if r == 0 else lk <= pb + row
    assert torch.equal(got, want)
    current["tables"] = None  # no 2D request in the step: vLLM's own causal mask_mod
    causal = meta.get_paged_mask_mod()(torch.zeros(()), torch.zeros(()), q_idx, kv_idx)
    assert not torch.equal(causal, want) and bool((want & ~causal).sum() == 0)  # LADE is a sub-mask of causal


def test_flex_attention_with_the_lade_mask_equals_sdpa():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    p = 40
    plan = steady_plan(p)
    n = len(plan.tokens)
    tables = LadeMaskTables.build(1, [(0, plan.visible)])
    req = torch.zeros((), dtype=torch.long)
    start = torch.tensor([p])

    def mask_mod(b, h, q_idx, kv_idx):
        return lade_mask_mod(tables, req.expand_as(q_idx), q_idx + p, kv_idx, start)

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, n, 64, generator=g)
    k = torch.randn(1, 4, p + n, 64, generator=g)
    v = torch.randn(1, 4, p + n, 64, generator=g)
    block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=n, KV_LEN=p + n, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "called without torch.compile": the eager path is the point here
        got = flex_attention(q, k, v, block_mask=block_mask)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_expected(plan, p))
    causal = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(n, p + n, dtype=torch.bool).tril(p))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    differs = (causal - want).abs().amax(dim=(0, 1, 3)) > 1e-3
    masked_rows = (~plan.visible & torch.ones(n, n, dtype=torch.bool).tril()).any(dim=1)
    assert torch.equal(differs, masked_rows)


def test_flex_kv_fixup_copies_slots_in_the_flex_layout():
    """The CUDA path's KV fix-up: K and V of the winner's slots land in the slots after the prefix, in
    FlexAttention's cache layout ``[blocks, kv_heads, block_size, 2 * head_dim]`` (what vLLM 0.32's
    ``FlexAttentionImpl.do_kv_cache_update`` writes through ``transpose(1, 2)``); nothing else changes."""
    from vllm_lookahead.lade2d.hooks import copy_slots_flex

    blocks, heads, bs, d = 6, 2, 16, 8
    g = torch.Generator().manual_seed(0)
    cache = torch.randn(blocks, heads, bs, 2 * d, generator=g)
    before = cache.clone()
    src = torch.tensor([37, 38, 81])  # rows of a later candidate (slots p+r)
    dst = torch.tensor([33, 34, 35])  # slots p+1..p+m, across a block boundary for 81 -> 35 too
    copy_slots_flex(cache, src, dst)
    token_view = cache.transpose(1, 2).reshape(blocks * bs, heads, 2 * d)  # slot -> [heads, K|V]
    old_view = before.transpose(1, 2).reshape(blocks * bs, heads, 2 * d)
    assert torch.equal(token_view[dst], old_view[src])
    untouched = torch.ones(blocks * bs, dtype=torch.bool)
    untouched[dst] = False
    assert torch.equal(token_view[untouched], old_view[untouched])
