"""LADE's 2D step inside vLLM 0.32's forward pass: positions, masked attention, verifier, KV fix-up.

Written against vLLM 0.32 (0.33 checked statically, ``compat.USES``); design and line anchors in
docs/design/lookahead-2d.md.  The proposer hands vLLM a 2D request's rows as an ordinary draft
(``LadePlan.drafts``) and parks the plan in ``PENDING``.  Three class-level wraps then make the step
LADE's instead of a chain:

1. ``GPUModelRunner._prepare_inputs`` (after the original): for each parked plan whose request is
   scheduled with exactly those drafts at the expected position, rewrite the rows' positions to their
   logical ones (RoPE).  Slot mapping is computed inside the original from the chain positions, so
   every row keeps its own scratch slot ``p + row``.  The step's flagged requests go to ``CURRENT``.
   Anything that changed the plan (truncation by the token budget, preemption) leaves the request to
   vLLM's chain verification of the same drafts -- lossless, and candidate 0 still counts.
2. ``CPUAttentionBackendImpl.forward`` (after the stock kernel, which ran causally on every row):
   overwrite the flagged requests' rows with SDPA over [the prefix gathered from the paged cache] +
   [this step's raw K/V] under LADE's mask (``masked_attention``), and stash those rows' K/V.
3. ``GPUModelRunner._sample`` (via ``runner_patch``): verify every candidate against the argmax
   (``lade.verify_greedy``), overwrite the request's row of ``sampled_token_ids`` -- the scheduler
   derives accepted counts and the KV rollback from that row alone -- and, when a candidate other
   than the first wins, copy its rows' K/V into the slots right after the prefix with the backend's
   own writer (``do_kv_cache_update``).

On CUDA with FlexAttention (experimental: written against vLLM 0.32, never run on a GPU) step 2 is
LADE's mask inside FlexAttention instead (``flex_mask.py``) and the fix-up copies cache slots.

Greedy requests are verified by longest match (``verify_greedy``), sampled ones by LADE's lossless
multi-candidate rule (``verify_sampled``) on the distribution vLLM's sampler would use; requests whose
logits depend on state the verifier does not see (penalties, logit bias, ...) stay on the chain
(``eligible``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from vllm_lookahead.vllm import patches

from .flex_mask import LadeMaskTables, install_flex_mask_patch
from .lade import LadePlan, verify_greedy, verify_sampled
from .masked_attention import layout_probe, masked_attention

logger = logging.getLogger("vllm_lookahead")

SAMPLING_EPS = 1e-5  # vLLM's _SAMPLING_EPS: temperature below it is greedy


@dataclass
class FlaggedRequest:
    """A request of this step that runs as 2D: where its rows sit and what they are."""

    req_id: str
    batch_index: int
    q0: int  # first row in the flattened step
    plan: LadePlan
    sampling_params: Any = None
    mask: torch.Tensor | None = None  # bool [L, p + L]: the prefix, then the plan's visibility (all layers)
    accepted: list[int] = field(default_factory=list)
    matched: int = 0
    winner: int = -1
    argmax: list[int] = field(default_factory=list)

    @property
    def num_rows(self) -> int:
        return len(self.plan.tokens)


@dataclass
class StepPlan:
    num_tokens: int
    requests: list[FlaggedRequest]
    # per attention layer: (impl, layer, kv_cache, K rows, V rows, slots) of the flagged requests' rows,
    # concatenated in request order -- what the KV fix-up copies from and to
    stash: list[tuple[Any, Any, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    rows_done: int = 0  # attention layers that applied LADE's mask (0: the step must not be verified as 2D)
    rows: torch.Tensor | None = None  # the flagged requests' rows in the flattened step, request order
    # FlexAttention (CUDA) path: the mask tables, this step's slot mapping (captured when vLLM builds the
    # mask) and the layers' caches for the slot-to-slot KV fix-up
    flex_tables: LadeMaskTables | None = None
    slot_mapping: torch.Tensor | None = None
    kv_caches: list[torch.Tensor] = field(default_factory=list)


PENDING: dict[str, LadePlan] = {}
CURRENT: StepPlan | None = None
BACKEND = "cpu"  # "cpu": masked SDPA after the stock kernel; "flex": LADE's mask inside FlexAttention
FIXUP_ENABLED = True  # tests switch it off once to show the exactness test depends on it
TRACE: dict[str, list[tuple[int, int, int]]] | None = None  # when a dict: req id -> (rows, committed, winner) per 2D step


class _Counters:
    """Process-wide counts of what the 2D path did (read by the benchmark and the tests)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.steps = 0  # request-steps verified as 2D
        self.fallbacks = 0  # plans vLLM did not schedule as planned (verified as a chain instead)
        self.fixups = 0  # request-steps whose winner was not candidate 0 (KV copied)
        self.accepted = 0  # candidate tokens accepted by the 2D verifier
        self.rows = 0  # query rows of those request-steps (current token included)


COUNTERS = _Counters()


def eligible(sampling_params: Any) -> bool:
    """Can the 2D verifiers stand in for vLLM's sampler for this request?

    Greedy (argmax of raw logits) and plain sampling (temperature, top-k, top-p: the distribution is
    rebuilt from the raw logits exactly as vLLM's sampler does) are handled; anything that changes the
    logits through state the verifier does not see -- penalties, bad words, logit bias, allowed
    tokens, min_tokens, min_p, structured output -- or that needs logprobs or a per-request seed
    (vLLM's per-request generators would drift) stays on the chain.
    """
    sp = sampling_params
    if sp is None:
        return False
    return (sp.logprobs is None and sp.seed is None and not sp.min_p
            and not sp.presence_penalty and not sp.frequency_penalty and sp.repetition_penalty == 1.0
            and not sp.min_tokens and not sp.logit_bias and not sp.allowed_token_ids and not sp.bad_words
            and getattr(sp, "structured_outputs", None) is None)


def target_probs(logits: torch.Tensor, sampling_params: Any) -> np.ndarray:
    """The target's next-token distribution per row, as vLLM's sampler builds it (T, top-k, top-p)."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    sp = sampling_params
    rows = logits.float() / sp.temperature
    n = rows.shape[0]
    k = torch.full((n,), sp.top_k, dtype=torch.int64) if 0 < sp.top_k < rows.shape[1] else None
    p = torch.full((n,), sp.top_p, dtype=torch.float32) if sp.top_p < 1.0 else None
    k = k.to(rows.device) if k is not None else None
    p = p.to(rows.device) if p is not None else None
    rows = apply_top_k_top_p(rows, k, p)
    return torch.softmax(rows, dim=-1).cpu().numpy()


def check_engine(runner: Any) -> tuple[bool, str]:
    """(ok, why not): can this engine run the 2D step?  CPU backend: probes the KV layout.  CUDA:
    FlexAttention only, with piecewise (not full) CUDA graphs -- a full graph replay would bypass the
    mask.  The CUDA path has never run on a GPU (none was available): it logs a warning when chosen."""
    global BACKEND
    if getattr(runner, "uses_mrope", False):
        return False, "M-RoPE models are not supported"
    layers = runner.compilation_config.static_forward_context
    impls = [(name, layer) for name, layer in layers.items() if hasattr(layer, "impl")]
    if not impls:
        return False, "no attention layers found"
    kinds = {type(layer.impl).__name__ for _, layer in impls}
    if len(kinds) != 1 or kinds.pop() not in ("CPUAttentionBackendImpl", "FlexAttentionImpl"):
        return False, (f"attention backend(s) {sorted({type(lay.impl).__name__ for _, lay in impls})}: the 2D "
                       "layout needs the CPU backend or FLEX_ATTENTION (attention_backend='FLEX_ATTENTION')")
    for name, layer in impls:
        impl = layer.impl
        if getattr(impl, "alibi_slopes", None) is not None or getattr(impl, "sliding_window", None) not in (None, -1) \
                or getattr(impl, "logits_soft_cap", None) not in (None, 0, 0.0) or getattr(impl, "sinks", None) is not None:
            return False, f"layer {name}: alibi, sliding window, softcap or sinks are not supported"
    _, layer = impls[0]
    kv = _layer_cache(layer)
    if not isinstance(kv, torch.Tensor) or kv.dim() != 4:
        return False, "unexpected KV cache shape"
    if type(layer.impl).__name__ == "FlexAttentionImpl":
        mode = runner.compilation_config.cudagraph_mode
        if mode is not None and mode.has_full_cudagraphs():
            return False, ("FULL CUDA graphs replay attention without the LADE mask; use "
                           "compilation_config={'cudagraph_mode': 'PIECEWISE'}")
        BACKEND = "flex"
        install_flex_mask_patch(lambda: CURRENT.flex_tables if CURRENT is not None else None, _take_slot_mapping)
        logger.warning("vllm-lookahead: the 2D layout on FlexAttention is EXPERIMENTAL: written against vLLM 0.32, "
                       "never run on a GPU by this project")
        return True, ""
    BACKEND = "cpu"
    return layout_probe(kv.dtype, layer.isa, kv.shape[1], kv.shape[3] // 2, kv.shape[2])


def _take_slot_mapping(metadata: Any) -> None:
    if CURRENT is not None:
        CURRENT.slot_mapping = metadata.slot_mapping


def _layer_cache(layer: Any) -> torch.Tensor:
    return layer.kv_cache[0] if isinstance(layer.kv_cache, list) else layer.kv_cache


@patches.declare("lade2d_prepare_inputs", "vllm.v1.worker.gpu_model_runner:GPUModelRunner._prepare_inputs",
                 "2D layout: rewrite the positions of a 2D request's rows and flag the step", "worker")
def _build_prepare_inputs(prepare_orig: Any) -> Any:
    def _prepare_inputs(self: Any, scheduler_output: Any, num_scheduled_tokens: np.ndarray) -> Any:
        result = prepare_orig(self, scheduler_output, num_scheduled_tokens)
        global CURRENT
        CURRENT = None
        if PENDING:
            CURRENT = _flag_requests(self, scheduler_output, num_scheduled_tokens)
        return result

    _prepare_inputs.__doc__ = prepare_orig.__doc__
    return _prepare_inputs


@patches.declare("lade2d_cpu_attention", "vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.forward",
                 "2D layout: LADE's mask for the flagged requests' rows on the CPU backend", "worker")
def _build_forward(forward_orig: Any) -> Any:
    def forward(self: Any, layer: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: Any, output: torch.Tensor, *args: Any, **kw: Any) -> Any:
        out = forward_orig(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kw)
        step = CURRENT
        if step is None or attn_metadata is None or attn_metadata.num_actual_tokens != step.num_tokens:
            return out
        _masked_rows(self, layer, step, query, key, value, kv_cache, attn_metadata, output)
        return out

    forward.__doc__ = forward_orig.__doc__
    return forward


def install_lade2d_hooks() -> bool:
    """Wrap ``_prepare_inputs`` and the CPU attention ``forward`` once per process."""
    a = patches.apply("lade2d_prepare_inputs")
    b = patches.apply("lade2d_cpu_attention")
    return a or b


def _flag_requests(runner: Any, scheduler_output: Any, num_scheduled_tokens: np.ndarray) -> StepPlan | None:
    batch = runner.input_batch
    scheduled = scheduler_output.scheduled_spec_decode_tokens
    ends = np.cumsum(num_scheduled_tokens[: batch.num_reqs])
    flagged: list[FlaggedRequest] = []
    pending = dict(PENDING)
    PENDING.clear()
    for rid, plan in pending.items():
        i = batch.req_id_to_index.get(rid)
        length = len(plan.tokens)
        if (i is None or i >= batch.num_reqs or list(scheduled.get(rid, ())) != plan.drafts
                or int(batch.num_computed_tokens_cpu[i]) != plan.position
                or int(num_scheduled_tokens[i]) != length):
            COUNTERS.fallbacks += 1
            continue
        q0 = int(ends[i]) - length
        positions = torch.from_numpy(plan.rel_pos + plan.position)
        runner.positions[q0 : q0 + length] = positions.to(runner.positions.device, non_blocking=True)
        mask = None
        if BACKEND == "cpu":
            mask = torch.cat([torch.ones(length, plan.position, dtype=torch.bool), plan.visible], dim=1)
        flagged.append(FlaggedRequest(rid, i, q0, plan, runner.requests[rid].sampling_params, mask))
    if not flagged:
        return None
    rows = torch.cat([torch.arange(r.q0, r.q0 + r.num_rows) for r in flagged])
    step = StepPlan(int(scheduler_output.total_num_scheduled_tokens), flagged, rows=rows)
    if BACKEND == "flex":  # the mask is applied inside FlexAttention (flex_mask.py); nothing per layer
        step.flex_tables = LadeMaskTables.build(batch.num_reqs, [(r.batch_index, r.plan.visible) for r in flagged],
                                                device=runner.positions.device)
        step.kv_caches = [_layer_cache(layer) for layer in runner.compilation_config.static_forward_context.values()
                          if hasattr(layer, "impl")]
        step.rows_done = 1
    return step


def _masked_rows(impl: Any, layer: Any, step: StepPlan, query: torch.Tensor, key: torch.Tensor,
                 value: torch.Tensor, kv_cache: torch.Tensor, attn_metadata: Any, output: torch.Tensor) -> None:
    for req in step.requests:
        sl = slice(req.q0, req.q0 + req.num_rows)
        block_ids = attn_metadata.block_table[req.batch_index]
        output[sl] = masked_attention(query[sl], key[sl], value[sl], kv_cache, block_ids,
                                      req.plan.position, req.mask, impl.scale).view_as(output[sl])
    idx = step.rows
    step.stash.append((impl, layer, kv_cache, key[idx].clone(), value[idx].clone(),
                       attn_metadata.slot_mapping[idx].clone()))
    step.rows_done += 1


def verify_step(logits: torch.Tensor, argmax: torch.Tensor, spec_decode_metadata: Any) -> StepPlan | None:
    """Multi-candidate verification of this step's flagged requests (before vLLM samples).

    ``argmax``: the target's argmax at every logits row (the proposer computes it once for all rows)."""
    step = CURRENT
    if step is None or spec_decode_metadata is None or step.rows_done == 0:
        return None
    cu = spec_decode_metadata.cu_num_sampled_tokens.tolist()
    for req in step.requests:
        end = cu[req.batch_index]
        start = end - req.num_rows
        rows = logits[start:end]
        req.argmax = argmax[start:end].tolist()  # the window's Jacobi update uses argmax in both modes
        plan, sp = req.plan, req.sampling_params
        if sp.temperature < SAMPLING_EPS:
            req.accepted, req.matched, req.winner = verify_greedy(req.argmax[0], plan.guesses,
                                                                  plan.guess_rows, req.argmax)
        else:  # seeded from torch's global RNG, which vLLM seeds with the engine seed
            rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,))))
            req.accepted, req.matched, req.winner = verify_sampled(target_probs(rows, sp), plan.guesses,
                                                                   plan.guess_rows, rng)
    return step


def apply_verification(step: StepPlan, sampler_output: Any) -> None:
    """Overwrite the flagged rows of ``sampled_token_ids`` and move a later winner's KV into place."""
    global CURRENT
    sampled = sampler_output.sampled_token_ids
    offset = 0
    for req in step.requests:
        row = sampled[req.batch_index]
        row.fill_(-1)
        row[: len(req.accepted)] = torch.tensor(req.accepted, dtype=row.dtype, device=row.device)
        if req.winner > 0 and req.matched > 0 and FIXUP_ENABLED:
            src = torch.tensor(req.plan.guess_rows[req.winner][: req.matched]) + offset
            dst = torch.arange(1, req.matched + 1) + offset  # rows 1..m hold slots p+1..p+m
            for impl, layer, kv_cache, k, v, slots in step.stash:  # CPU: rewrite from the raw K/V
                impl.do_kv_cache_update(layer, k[src], v[src], kv_cache, slots[dst])
            if step.flex_tables is not None and step.slot_mapping is not None:  # Flex: copy slot to slot
                slots = step.slot_mapping[step.rows.to(step.slot_mapping.device)]
                for kv_cache in step.kv_caches:
                    copy_slots_flex(kv_cache, slots[src.to(slots.device)], slots[dst.to(slots.device)])
            COUNTERS.fixups += 1
        COUNTERS.steps += 1
        COUNTERS.accepted += req.matched
        COUNTERS.rows += req.num_rows
        if TRACE is not None:
            TRACE.setdefault(req.req_id, []).append((req.num_rows, len(req.accepted), req.winner))
        offset += req.num_rows
    CURRENT = None


def copy_slots_flex(kv_cache: torch.Tensor, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
    """Copy K and V of cache slots ``src_slots`` to ``dst_slots`` in FlexAttention's layout
    ``[num_blocks, kv_heads, block_size, 2 * head_dim]`` (K and V halves of the last axis; vLLM 0.32's
    ``FlexAttentionImpl.do_kv_cache_update``).  Source and destination must not overlap."""
    bs = kv_cache.shape[2]
    src_b, src_n = src_slots // bs, src_slots % bs
    dst_b, dst_n = dst_slots // bs, dst_slots % bs
    kv_cache[dst_b, :, dst_n] = kv_cache[src_b, :, src_n]
