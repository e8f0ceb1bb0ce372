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
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from vllm_lookahead.core import LookaheadConfig, LookaheadDrafter

from . import coupled_verify, draft_reply, greedy_verify
from .fixes import apply_tool_fixes, fix_cpu_expand_if_broken, fix_seeded_chunked_prefill_if_broken
from .plain_steps import install_plain_steps
from .requests import draft_room, isolation_key, request_temperature
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


class LookaheadProposer:
    verifies_steps = True
    """Whether a step's verdict may come from the argmax (``greedy_verify``) or coupled sampling
    (``coupled_verify``) instead of vLLM's rejection sampler; a subclass that rewrites the sampler's
    output after it (``finish_verification``) sets it False."""

    def __init__(self, vllm_config: Any, chain_k: int | None = None):
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
        self.drafter = LookaheadDrafter(self.config, chain_k or self.k)
        PROFILE.drafter = self.drafter
        self._runner: Any = None
        self._captured: tuple[list[str], list[int]] | None = None  # (row ids, verified draft counts)
        self._verdict: Any = None  # a SamplerOutput made from the argmax (greedy_verify), until taken
        self._coupled: Any = None  # (runner, logits, metadata) of a T>0 step coupled_verify samples, until taken
        self._warned = False
        self._cover = DraftCover()  # rows whose sampling vLLM's verifier does not cover get no drafts
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
            return
        # a greedy step whose verdict is the plain argmax is verified here, from the numpy argmax
        # (greedy_verify.py: vLLM's CPU rejection sampler clones the logits and runs torch's argmax;
        # numpy's is ~10x faster over a CPU float32 batch, and no detach() where none is needed)
        verdict = self.verifies_steps and greedy_verify.argmax_is_the_verdict(runner, logits, spec_decode_metadata)
        if verdict:
            argmax = (logits.detach() if logits.requires_grad else logits).numpy().argmax(axis=-1)
            self._verdict = greedy_verify.sampler_output(argmax, spec_decode_metadata)
        self._captured = (list(runner.input_batch.req_ids), list(spec_decode_metadata.num_draft_tokens))
        # a T>0 step sampled as plain decoding samples each position (coupled_verify.py): seeded requests
        # reproduce token for token; computed in take_verdict, outside the proposer's own time
        if (not verdict and self.verifies_steps
                and coupled_verify.applies(runner, logits, spec_decode_metadata)):
            self._coupled = (runner, logits, spec_decode_metadata)
        # which verifier takes a T>0 step with drafts: counted, so the gate measures coupling (STEPS)
        if (not verdict and not runner.input_batch.sampling_metadata.all_greedy
                and any(spec_decode_metadata.num_draft_tokens)):
            coupled_verify.count_step(self._coupled is not None, logits.is_cpu)

    def take_verdict(self) -> Any:
        """The ``SamplerOutput`` of the step just captured when it was verified from the argmax
        (``greedy_verify``) or sampled position by position as plain decoding would (``coupled_verify``, T>0);
        None: vLLM's rejection sampler verifies it (called by runner_patch)."""
        verdict, self._verdict = self._verdict, None
        coupled, self._coupled = self._coupled, None
        if verdict is None and coupled is not None:
            verdict = coupled_verify.sampler_output(*coupled)
        return verdict

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
        captured, self._captured = self._captured, None
        req_ids = runner.input_batch.req_ids[: len(sampled_token_ids)]
        return self._propose_arrays(runner, req_ids, captured, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)

    def _propose_arrays(self, runner: Any, req_ids: list[str], captured: tuple[list[str], list[int]] | None,
                        sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                        token_ids_cpu: np.ndarray) -> list[list[int]]:
        """A drafter step (``LookaheadDrafter.step``): the runner's arrays as they are, no
        per-row objects.  Verified draft counts come from the step's spec-decode metadata, in the
        captured row order (the same as now unless the batch was reordered in between: then by id)."""
        if captured is None:
            verified = [0] * len(req_ids)
        elif captured[0] == req_ids:
            verified = captured[1]
        else:
            by_id = dict(zip(*captured))
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
