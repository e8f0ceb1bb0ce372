"""LADE's mask for vLLM's FlexAttention backend (the CUDA path of the 2D layout; design note section 7).

Status: **the mask only, checked on CPU** (tests/lade2d/test_flex_mask.py runs it through torch's own
``flex_attention``/``create_block_mask`` and compares with the SDPA reference).  Not wired into an
engine: the rest of the CUDA path (positions written on the device, the KV fix-up as a slot-to-slot
copy in the Flex cache layout, PIECEWISE CUDA graphs) needs a GPU to be tested, and none was
available, so ``hooks.check_engine`` keeps the 2D layout off on anything but the CPU backend.

How: vLLM's ``FlexAttentionMetadata.get_paged_mask_mod`` maps each (query row, physical KV slot) pair
to logical indices (query: ``decode_offset[req] + row``; KV: the token's position in the request's
cache) and applies ``logical_mask_mod`` (causal).  ``lade_mask_mod`` replaces that last step for
flagged requests: KV before the request's first step row (the prefix) is visible; within the step,
``visible[row, col]`` of the request's plan decides.  Because step rows keep their chain slots
(``p + row``) and LADE only ever looks at rows earlier in vLLM's row order, the LADE mask is a subset
of the causal one -- so vLLM's causal block pruning stays valid and no block can be skipped wrongly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vllm_lookahead.vllm import patches


@dataclass(frozen=True)
class LadeMaskTables:
    """One step's masks, packed for a mask_mod: per request an offset into ``visible`` (-1 = causal)."""

    base: torch.Tensor  # int64 [num_reqs]: start of the request's [lmax, lmax] block in `visible`, or -1
    visible: torch.Tensor  # bool [num_flagged * lmax * lmax]
    lmax: int

    @classmethod
    def build(cls, num_reqs: int, flagged: list[tuple[int, torch.Tensor]], device: Any = "cpu") -> LadeMaskTables:
        """``flagged``: (batch index, bool [L, L] visibility in vLLM row order) per flagged request."""
        lmax = max((v.shape[0] for _, v in flagged), default=1)
        base = torch.full((num_reqs,), -1, dtype=torch.int64)
        blocks = torch.zeros(max(len(flagged), 1), lmax, lmax, dtype=torch.bool)
        for j, (i, vis) in enumerate(flagged):
            n = vis.shape[0]
            blocks[j, :n, :n] = vis
            base[i] = j * lmax * lmax
        return cls(base.to(device), blocks.reshape(-1).to(device), lmax)


def lade_mask_mod(tables: LadeMaskTables, req: torch.Tensor, logical_q: torch.Tensor, logical_kv: torch.Tensor,
                  step_start: torch.Tensor) -> torch.Tensor:
    """Visibility of logical KV ``logical_kv`` for logical query ``logical_q`` of request ``req``.

    ``step_start[req]``: logical index of the request's first row in this step (vLLM's
    ``decode_offset``, = tokens already cached).  Unflagged requests get the causal mask.
    """
    base = tables.base[req]
    start = step_start[req]
    row = (logical_q - start).clamp(0, tables.lmax - 1)
    col = (logical_kv - start).clamp(0, tables.lmax - 1)
    in_step = tables.visible[base.clamp(min=0) + row * tables.lmax + col]
    lade = (logical_kv < start) | in_step
    return torch.where(base >= 0, lade & (logical_q >= logical_kv), logical_q >= logical_kv)


_CURRENT_TABLES: Any = None
_ON_BUILD: Any = None


@patches.declare("flex_lade_mask", "vllm.v1.attention.backends.flex_attention:FlexAttentionMetadata.get_paged_mask_mod",
                 "2D layout on CUDA: LADE's mask for flagged requests inside FlexAttention", "worker")
def _build_paged_mask_mod(original: Any) -> Any:
    def get_paged_mask_mod(self: Any) -> Any:
        tables = _CURRENT_TABLES() if _CURRENT_TABLES is not None else None
        if tables is None:
            return original(self)
        if _ON_BUILD is not None:
            _ON_BUILD(self)
        doc_ids = self.doc_ids

        def final_mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, physical_kv_idx: torch.Tensor):
            is_valid, logical_q, logical_kv = self._convert_physical_to_logical(doc_ids, q_idx, physical_kv_idx)
            return is_valid & lade_mask_mod(tables, doc_ids[q_idx], logical_q, logical_kv, self.decode_offset)

        return final_mask_mod

    return get_paged_mask_mod


def install_flex_mask_patch(current_tables: Any, on_build: Any = None) -> bool:
    """Wrap ``FlexAttentionMetadata.get_paged_mask_mod`` so flagged requests get LADE's mask.

    ``current_tables()`` returns this step's ``LadeMaskTables`` or None (no 2D request in the step);
    ``on_build(metadata)`` is called when a LADE mask is built (the 2D path takes the slot mapping there).
    """
    global _CURRENT_TABLES, _ON_BUILD
    _CURRENT_TABLES, _ON_BUILD = current_tables, on_build
    return patches.apply("flex_lade_mask")
