"""``LookaheadProposer``: lookahead decoding as a vLLM 0.32 ``custom_class`` speculative proposer.

    LLM(model=..., speculative_config={"model": "vllm_lookahead.LookaheadProposer",
                                       "num_speculative_tokens": 4},
        additional_config={"lookahead": {"memory_tokens": 65536}})

vLLM builds it in each worker as ``LookaheadProposer(vllm_config)`` and, after every forward pass,
calls ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)`` for the
rows of ``runner.input_batch``.  Drafts are verified in the next step by vLLM's own rules, which is what
keeps outputs lossless: the greedy match at T=0 (``greedy_verify``, else vLLM's rejection sampler), and at
T>0 on CPU each position sampled as plain decoding samples it, the draft accepted while equal
(``coupled_verify``: seeded requests reproduce token for token), else vLLM's rejection sampler.

Design: the k draft slots carry the best candidate of the context match (prompt lookup over prompt +
output) and the engine-wide memory of earlier outputs, cut at its estimated commit probability
(``vllm_lookahead.core.drafter``).  All algorithmic state lives in ``vllm_lookahead.core`` keyed by
request id, so row reordering, preemption and ``n > 1`` are handled by id, never by row index.

With ``layout="2d"`` (experimental) the proposer can instead hand vLLM LADE's whole step (G candidates +
the Jacobi window) as the draft of an eligible request; ``experimental.lade2d`` then runs it with LADE's mask and
verifies it with a multi-candidate verifier (docs/lookahead.md, "The 2D layout").  A measured arbiter per
batch size (``core.arbiter``) picks 2D, the chain or no drafts for each step.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from vllm_lookahead.core import LookaheadConfig, LookaheadDrafter, RowStep

from . import coupled_verify, draft_reply, greedy_verify
from .fixes import apply_tool_fixes, fix_cpu_expand_if_broken, fix_seeded_chunked_prefill_if_broken
from .plain_steps import install_plain_steps
from .runner_patch import install_runner_hook
from .sampling_cover import DraftCover, install_worker_cover
from .version import check_vllm_version

logger = logging.getLogger("vllm_lookahead")


class _Profile:
    """CPU time spent in the proposer and its runner hook, per process (read by the benchmark)."""

    def __init__(self) -> None:
        # the drafter of the proposer built last in this process (the benchmark records its summary:
        # drafts and acceptance by source, the busy-batch guard's choices); reset() leaves it
        self.drafter: LookaheadDrafter | None = None
        self.reset()

    def reset(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self.rows = 0  # request rows handled, summed over calls (cost per row transfers across models)


PROFILE = _Profile()


def draft_room(requests: Any, req_ids: list[str], num_tokens: list[int], prompt_lens: list[int], k: int) -> list[int]:
    """How many draft tokens each row can still use: one step commits its accepted drafts plus one token,
    so a request ``r`` output tokens short of its ``max_tokens`` uses at most ``r - 1`` drafts (capped at
    ``k``).  Why: vLLM schedules whatever is drafted, and near the cap the rest are rows that cost step
    time and can never be committed -- every request that stops at ``max_tokens`` pays that in its last
    step or two."""
    room = []
    for rid, nt, pl in zip(req_ids, num_tokens, prompt_lens):
        req = requests.get(rid)
        params = getattr(req, "sampling_params", None)
        max_tokens = getattr(params, "max_tokens", None)
        room.append(k if max_tokens is None else max(0, min(k, pl + max_tokens - nt - 1)))
    return room


def isolation_key(req: Any) -> tuple[Any, Any]:
    """Whose earlier outputs a request may draft from: (LoRA adapter, tenant).  The tenant is
    ``SamplingParams.extra_args["lookahead"]["tenant"]`` (or ``extra_args["tenant"]``); requests of
    different adapters or tenants never see each other's outputs in the engine-wide memory.  The model
    is implicit: the memory lives in one engine."""
    lora = getattr(req, "lora_request", None)
    lora_id = getattr(lora, "lora_name", None) or getattr(lora, "lora_int_id", None) if lora else None
    extra = getattr(getattr(req, "sampling_params", None), "extra_args", None) or {}
    la = extra.get("lookahead") if isinstance(extra.get("lookahead"), dict) else {}
    tenant = la.get("tenant", extra.get("tenant"))
    return (lora_id, None if tenant is None else str(tenant))


def request_temperature(req: Any) -> float:
    """A request's sampling temperature (0: greedy; a request without sampling parameters is greedy):
    the drafter estimates its drafts with the acceptance of its sampler class (``core.acceptance``)."""
    params = getattr(req, "sampling_params", None)
    temperature = getattr(params, "temperature", None)
    return 0.0 if temperature is None else float(temperature)


class LookaheadProposer:
    def __init__(self, vllm_config: Any):
        # The plugin is used here (vLLM loaded this class in the worker): check the vLLM range, apply
        # the worker patches (patches.PATCHES), and fix vLLM's CPU expand kernel if the probe finds it
        # broken (T>0 speculative sampling, fixes.py).  None of this happens where lookahead is not used.
        check_vllm_version()
        # the drafter loads numba (core/kernels.py): a second engine started later in this process must
        # survive it (fixes.py, safe_rebind_kernels; a no-op where the scan is fine)
        apply_tool_fixes(frontend=False)
        install_runner_hook()
        install_plain_steps()  # steps without drafts skip vLLM's rejection sampler (plain_steps.py)
        install_worker_cover()  # logit bias / min-p processors exist with speculation (sampling_cover.py)
        if draft_reply.applies(vllm_config):  # drafts return with the sampled tokens: one RPC less per step
            draft_reply.install_worker()
        logger.info("vllm-lookahead: %s", fix_cpu_expand_if_broken())
        # a seeded request in chunked prefill must not kill a CPU engine (fixes.py, probe on the device)
        device = getattr(getattr(vllm_config, "device_config", None), "device", None) or "cpu"
        logger.info("vllm-lookahead: %s", fix_seeded_chunked_prefill_if_broken(device))
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.config = LookaheadConfig.from_sources(getattr(vllm_config, "additional_config", None))
        two_d = self.config.layout == "2d"
        chain_k = min(self.k, self.config.lade.chain_max_draft or self.k) if two_d else self.k
        self.drafter = LookaheadDrafter(self.config, chain_k)
        PROFILE.drafter = self.drafter
        self._runner: Any = None
        self._captured: tuple[list[str], Any, list[int]] | None = None
        self._verdict: Any = None  # a SamplerOutput made from the argmax (greedy_verify), until taken
        self._coupled: Any = None  # (runner, logits, metadata) of a T>0 step coupled_verify samples, until taken
        self._warned = False
        self._cover = DraftCover()  # rows whose sampling vLLM's verifier does not cover get no drafts
        # the experimental 2D layout (layout="2d"): its requests' state and steps
        self.lade2d: Any = None
        if two_d:
            from vllm_lookahead.experimental.lade_steps import LadeSteps

            self.lade2d = LadeSteps(self.config, self.k)
        logger.info("vllm-lookahead proposer: k=%d config=%s", self.k, self.config.as_dict())

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load: drafts come from the target model's own outputs.  (The CPU runner calls
        this unconditionally, so it must exist.)"""

    # Called by runner_patch inside GPUModelRunner._sample, before rejection sampling.
    def capture_verification(self, runner: Any, logits: Any, spec_decode_metadata: Any) -> None:
        t0 = time.perf_counter()
        try:
            self._capture(runner, logits, spec_decode_metadata)
        finally:
            PROFILE.seconds += time.perf_counter() - t0

    def _capture(self, runner: Any, logits: Any, spec_decode_metadata: Any) -> None:
        self._runner = runner
        self._verdict = None
        self._coupled = None
        if logits is None or spec_decode_metadata is None:
            self._captured = None
            if self.lade2d is not None:
                self.lade2d.step2d = None
            return
        import torch

        cfg = self.config
        # a greedy step whose verdict is the plain argmax is verified here, from the numpy argmax
        # (greedy_verify.py: vLLM's CPU rejection sampler clones the logits and runs torch's argmax)
        verdict = (cfg.fast_greedy_verify and cfg.layout != "2d"
                   and greedy_verify.argmax_is_the_verdict(runner, logits, spec_decode_metadata))
        # the chain drafter needs the verified counts, not the argmax (only the 2D layout reads it)
        drafter_skips_argmax = cfg.layout != "2d"
        argmax: Any = None
        if verdict or (not drafter_skips_argmax and cfg.layout != "2d" and logits.is_cpu
                       and logits.dtype == torch.float32):
            # numpy's argmax over a CPU float32 batch is ~10x faster than torch's (26 vs 310 us for
            # 90 rows x 4096 on one thread): the capture is on every step's critical path.  For the same
            # reason `is_cpu`, not `device.type` (measured inside the engine at batch 1: ~2.5 us vs ~19 us
            # for the device and dtype checks), and no `detach()` where the logits need none (9 vs 16 us)
            argmax = (logits.detach() if logits.requires_grad else logits).numpy().argmax(axis=-1)
            if verdict:
                self._verdict = greedy_verify.sampler_output(argmax, spec_decode_metadata)
            if drafter_skips_argmax:
                argmax = None  # computed for the verdict only
        elif not drafter_skips_argmax:
            argmax = logits.argmax(dim=-1)
            if self.lade2d is not None:
                self.lade2d.capture(logits, argmax, spec_decode_metadata)
            if argmax.device.type != "cpu":
                host = torch.empty(argmax.shape, dtype=argmax.dtype, device="cpu", pin_memory=True)
                host.copy_(argmax, non_blocking=True)  # read in propose(), after vLLM's bookkeeping sync
                argmax = host
        self._captured = (list(runner.input_batch.req_ids), argmax, list(spec_decode_metadata.num_draft_tokens))
        # a T>0 step sampled as plain decoding samples each position (coupled_verify.py): seeded requests
        # reproduce token for token; computed in take_verdict, outside the proposer's own time
        if not verdict and cfg.layout != "2d" and coupled_verify.applies(runner, logits, spec_decode_metadata):
            self._coupled = (runner, logits, spec_decode_metadata)
        # which verifier takes a T>0 step with drafts: counted, so the gate measures coupling (STEPS)
        if (not verdict and not runner.input_batch.sampling_metadata.all_greedy
                and any(spec_decode_metadata.num_draft_tokens)):
            coupled_verify.count_step(self._coupled is not None)

    def take_verdict(self) -> Any:
        """The ``SamplerOutput`` of the step just captured when it was verified from the argmax
        (``greedy_verify``) or sampled position by position as plain decoding would (``coupled_verify``, T>0);
        None: vLLM's rejection sampler verifies it (called by runner_patch)."""
        verdict, self._verdict = self._verdict, None
        coupled, self._coupled = self._coupled, None
        if verdict is None and coupled is not None:
            verdict = coupled_verify.sampler_output(*coupled)
        return verdict

    # Called by runner_patch inside GPUModelRunner._sample, after vLLM's own sampler.
    def finish_verification(self, runner: Any, sampler_output: Any) -> None:
        if self.lade2d is None:
            return
        t0 = time.perf_counter()
        try:
            self.lade2d.finish(sampler_output)
        finally:
            PROFILE.seconds += time.perf_counter() - t0

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None, **_: Any) -> list[list[int]]:
        t0 = time.perf_counter()
        try:
            return self._propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        finally:
            PROFILE.seconds += time.perf_counter() - t0
            PROFILE.calls += 1
            PROFILE.rows += len(sampled_token_ids)

    def _propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                 token_ids_cpu: np.ndarray) -> list[list[int]]:
        runner = self._runner
        if runner is None:  # the runner hook never ran: draft nothing rather than guess row identities
            if not self._warned:
                logger.warning("vllm-lookahead: runner hook not active; proposing no drafts")
                self._warned = True
            return [[] for _ in sampled_token_ids]
        batch = runner.input_batch
        req_ids = batch.req_ids
        captured = self._captured
        self._captured = None
        n = len(sampled_token_ids)
        if self.lade2d is None:
            return self._propose_arrays(runner, req_ids[:n], captured, sampled_token_ids, num_tokens_no_spec,
                                        token_ids_cpu)
        ran_2d = self.lade2d.take()
        if ran_2d and captured is not None:  # a 2D step's rows are not a chain: no chain draft was verified
            captured = (captured[0], captured[1], [0 if rid in ran_2d else nd for rid, nd in zip(captured[0], captured[2])])
        drafts = self._propose_arrays(runner, req_ids[:n], captured, sampled_token_ids, num_tokens_no_spec,
                                      token_ids_cpu)
        num_tokens = np.asarray(num_tokens_no_spec[:n]).tolist()
        prompt_lens = np.asarray(batch.num_prompt_tokens[:n]).tolist()
        rows = [RowStep(req_ids[i], token_ids_cpu[i], num_tokens[i], list(new), 0, prompt_lens[i])
                for i, new in enumerate(sampled_token_ids)]
        # a 2D step's rows below are a layout the verifier reads as a whole, never cut
        self.lade2d.drafts(runner, rows, drafts, ran_2d)
        # Never more than k per row: longer drafts crash vLLM's spec-decode metrics (IndexError).
        return [d[: self.k] for d in drafts]

    def _propose_arrays(self, runner: Any, req_ids: list[str], captured: tuple[list[str], Any, list[int]] | None,
                        sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                        token_ids_cpu: np.ndarray) -> list[list[int]]:
        """A drafter step (``LookaheadDrafter.step``): the runner's arrays as they are, no
        per-row objects.  Verified draft counts come from the step's spec-decode metadata, in the
        captured row order (the same as now unless the batch was reordered in between: then by id)."""
        if captured is None:
            verified = [0] * len(req_ids)
        elif captured[0] == req_ids:
            verified = captured[2]
        else:
            by_id = dict(zip(captured[0], captured[2]))
            verified = [by_id.get(rid, 0) for rid in req_ids]
        requests = runner.requests
        prompt_lens = runner.input_batch.num_prompt_tokens
        room = draft_room(requests, req_ids, np.asarray(num_tokens_no_spec[: len(req_ids)]).tolist(),
                          np.asarray(prompt_lens[: len(req_ids)]).tolist(), self.k)
        # logit bias, or min-p at T>0: served as plain decoding serves them, without drafts (sampling_cover.py)
        for i in self._cover.undraftable_rows(runner.input_batch, len(req_ids)):
            room[i] = 0
        return self.drafter.step(req_ids, token_ids_cpu, num_tokens_no_spec, sampled_token_ids, verified,
                                 prompt_lens, lambda rid: isolation_key(requests.get(rid)), room,
                                 lambda rid: request_temperature(requests.get(rid)))
