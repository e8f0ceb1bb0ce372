"""Stage 1 of issue 8: the masked attention path over vLLM's paged CPU KV cache.

Against vLLM's own kernels, no engine: the layout probe must pass on this machine's ISA, and with a
causal step mask ``masked_attention`` must reproduce ``cpu_attention_with_kv_cache`` for every request of
a mixed batch (different prefix lengths, block tables out of order).  A LADE-style mask must differ
from causal exactly where the masks differ, and equal a dense reference computed independently.
"""

from __future__ import annotations

import pytest
import torch

from vllm_lookahead.lade2d.masked_attention import (
    gather_prefix,
    layout_probe,
    masked_attention,
)

pytestmark = pytest.mark.vllm

H, HKV, D, BS = 4, 2, 64, 32


def _isa(dtype):
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    return _get_attn_isa(dtype, BS, D)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layout_probe(dtype):
    isa = _isa(dtype)
    ok, why = layout_probe(dtype, isa, HKV, D, BS)
    if isa == "vec":
        assert ok, why
    else:  # another layout (e.g. amx for bf16 on AMX machines): the probe must refuse, not guess
        assert not ok and isa in why


def _batch(seed=0, dtype=torch.float32):
    """A cache holding 3 requests' prefixes, their step rows, and what the stock kernel needs."""
    from vllm import _custom_ops as ops

    g = torch.Generator().manual_seed(seed)
    prefixes, steps = [37, 70, 5], [5, 3, 8]
    n_blocks = 12
    cache = torch.zeros(n_blocks, HKV, BS, 2 * D, dtype=dtype)
    kc, vc = cache.view(n_blocks, HKV, 2 * BS, D).chunk(2, dim=2)
    perm = torch.randperm(n_blocks, generator=g)
    tables, used, reqs = [], 0, []
    for p, L in zip(prefixes, steps):
        nb = -(-(p + L) // BS)
        blocks = perm[used:used + nb]
        used += nb
        tables.append(torch.cat([blocks, torch.zeros(4 - nb, dtype=torch.long)]))
        k = torch.randn(p + L, HKV, D, generator=g).to(dtype)
        v = torch.randn(p + L, HKV, D, generator=g).to(dtype)
        q = torch.randn(L, H, D, generator=g).to(dtype)
        slots = torch.tensor([int(blocks[t // BS]) * BS + t % BS for t in range(p + L)])
        ops.cpu_attn_reshape_and_cache(k, v, kc, vc, slots, _isa(dtype))  # prefix + step rows, like vLLM
        reqs.append((p, L, q, k[p:], v[p:], blocks))
    return cache, torch.stack(tables).to(torch.int32), reqs


def _stock(cache, table, reqs, dtype):
    from vllm import _custom_ops as ops

    query = torch.cat([q for _, _, q, _, _, _ in reqs])
    qsl = torch.tensor([0] + list(torch.cumsum(torch.tensor([L for _, L, *_ in reqs]), 0)), dtype=torch.int32)
    seq_lens = torch.tensor([p + L for p, L, *_ in reqs], dtype=torch.int32)
    isa = _isa(dtype)
    meta = ops.cpu_attn_get_scheduler_metadata(num_reqs=len(reqs), num_heads=H, num_kv_heads=HKV, head_dim=D,
                                               seq_lens=seq_lens, dtype=dtype, query_start_loc=qsl, causal=True,
                                               sliding_window_size=-1, isa=isa, enable_kv_split=False)
    out = torch.empty_like(query)
    nb = cache.shape[0]
    kc, vc = cache.view(nb, HKV, 2 * BS, D).chunk(2, dim=2)
    ops.cpu_attention_with_kv_cache(query=query, key_cache=kc, value_cache=vc, output=out, query_start_loc=qsl,
                                    seq_lens=seq_lens, scale=D ** -0.5, causal=True, alibi_slopes=None,
                                    sliding_window=-1, block_table=table, softcap=0.0, scheduler_metadata=meta,
                                    s_aux=None)
    return out, qsl


def test_causal_mask_reproduces_the_stock_kernel():
    dtype = torch.float32
    cache, table, reqs = _batch()
    stock, qsl = _stock(cache, table, reqs, dtype)
    for i, (p, L, q, k, v, _blocks) in enumerate(reqs):
        ours = masked_attention(q, k, v, cache, table[i], p, torch.ones(L, L).tril().bool(), D ** -0.5)
        torch.testing.assert_close(ours, stock[qsl[i]:qsl[i + 1]], atol=2e-5, rtol=1e-4)


def test_gather_prefix_reads_what_the_kernel_wrote():
    cache, table, reqs = _batch(seed=3)
    for i, (p, L, _, k, v, _) in enumerate(reqs):
        kp, vp = gather_prefix(cache, table[i], p + L)
        torch.testing.assert_close(kp[:, p:], k.transpose(0, 1))
        torch.testing.assert_close(vp[:, p:], v.transpose(0, 1))


def test_lade_mask_matches_a_dense_reference_and_differs_from_causal_only_where_masked():
    cache, table, reqs = _batch(seed=1)
    p, L, q, k, v, _ = reqs[2]  # 8 step rows: [x, b1, b1, b2, b2, w, w, w] -- two branches + a window
    mask = torch.zeros(L, L, dtype=torch.bool)
    mask[:, 0] = True                       # every row sees the last committed token's row
    for lo, hi in ((1, 3), (3, 5)):         # verification branches: causal inside, blind to each other
        for r in range(lo, hi):
            mask[r, lo:r + 1] = True
    for r in range(5, 8):                   # window rows: see themselves only (plus row 0 and the prefix)
        mask[r, r] = True
    ours = masked_attention(q, k, v, cache, table[2], p, mask, D ** -0.5)
    kp, vp = gather_prefix(cache, table[2], p)
    kk = torch.cat([kp, k.transpose(0, 1)], 1).repeat_interleave(H // HKV, 0)
    vv = torch.cat([vp, v.transpose(0, 1)], 1).repeat_interleave(H // HKV, 0)
    full = torch.cat([torch.ones(L, p, dtype=torch.bool), mask], 1)
    att = (q.transpose(0, 1) @ kk.transpose(1, 2)) * D ** -0.5
    ref = torch.softmax(att.masked_fill(~full, float("-inf")), -1) @ vv
    torch.testing.assert_close(ours, ref.transpose(0, 1), atol=2e-5, rtol=1e-4)
    causal = masked_attention(q, k, v, cache, table[2], p, torch.ones(L, L).tril().bool(), D ** -0.5)
    same_rows = [r for r in range(L) if torch.equal(mask[r], torch.ones(L, L).tril().bool()[r])]
    assert same_rows == [0, 1, 2]
    torch.testing.assert_close(ours[same_rows], causal[same_rows])
    assert not torch.allclose(ours[3:], causal[3:])
