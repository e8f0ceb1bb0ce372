"""``LookaheadProposer``: lookahead decoding as a vLLM 0.32 ``custom_class`` speculative proposer.

    LLM(model=..., speculative_config={"model": "vllm_lookahead.LookaheadProposer",
                                       "num_speculative_tokens": 4},
        additional_config={"lookahead": {"ngram": 4, "pool_size": 8}})

vLLM builds it in each worker as ``LookaheadProposer(vllm_config)`` and, after every forward pass,
calls ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)`` for the
rows of ``runner.input_batch``.  Drafts are verified by vLLM's own rejection sampler in the next step,
which is what keeps outputs lossless (greedy match at T=0, the draft-free rejection rule at T>0).

Design ("Jacobi inside the verification chain"): the k draft slots carry a context match, a pool
n-gram or the current Jacobi iterate; the target argmax at every verified row (captured by
``runner_patch``) yields the next iterate and trajectory n-grams.  All algorithmic state lives in
``vllm_lookahead.core`` keyed by request id, so row reordering, preemption and ``n > 1`` are handled by
id, never by row index.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from vllm_lookahead.core import LookaheadConfig, LookaheadDrafter, RowStep

from .runner_patch import install_runner_hook
from .version import check_vllm_version

logger = logging.getLogger("vllm_lookahead")


class _Profile:
    """CPU time spent in the proposer and its runner hook, per process (read by the benchmark)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self.rows = 0  # request rows handled, summed over calls (cost per row transfers across models)


PROFILE = _Profile()


class LookaheadProposer:
    def __init__(self, vllm_config: Any):
        check_vllm_version()
        install_runner_hook()
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.config = LookaheadConfig.from_sources(getattr(vllm_config, "additional_config", None))
        self.drafter = LookaheadDrafter(self.config, self.k)
        self._runner: Any = None
        self._captured: tuple[list[str], Any, list[int]] | None = None
        self._warned = False
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
        if logits is None or spec_decode_metadata is None:
            self._captured = None
            return
        import torch

        argmax = logits.argmax(dim=-1)
        if argmax.device.type != "cpu":
            host = torch.empty(argmax.shape, dtype=argmax.dtype, device="cpu", pin_memory=True)
            host.copy_(argmax, non_blocking=True)  # read in propose(), after vLLM's bookkeeping sync
            argmax = host
        self._captured = (list(runner.input_batch.req_ids), argmax,
                          list(spec_decode_metadata.num_draft_tokens))

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
        argmax_rows: dict[str, tuple[int, np.ndarray]] = {}
        if captured is not None:
            cap_ids, argmax, num_draft = captured
            flat = argmax.numpy() if hasattr(argmax, "numpy") else np.asarray(argmax)
            offset = 0
            for rid, nd in zip(cap_ids, num_draft):
                argmax_rows[rid] = (nd, flat[offset : offset + nd + 1])
                offset += nd + 1
        rows = []
        for i, new in enumerate(sampled_token_ids):
            rid = req_ids[i]
            verified, am = argmax_rows.get(rid, (0, None))
            rows.append(RowStep(req_id=rid, context=token_ids_cpu[i], num_tokens=int(num_tokens_no_spec[i]),
                                new_tokens=list(new), verified=int(verified), argmax=am,
                                prompt_len=int(batch.num_prompt_tokens[i])))
        drafts = self.drafter.step(rows)
        # Never more than k per row: longer drafts crash vLLM's spec-decode metrics (IndexError).
        return [d[: self.k] for d in drafts]
