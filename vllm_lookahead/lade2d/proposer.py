"""``Lade2DProposer``: the lookahead proposer with LADE's 2D layout -- what an engine gets by naming
``vllm_lookahead.lade2d.Lade2DProposer`` in ``speculative_config`` (the ``lookahead2d:`` SPEC).

It is the chain proposer plus three steps of its own around it (``lade_steps.LadeSteps``): before
vLLM's sampler it captures the 2D requests' argmax rows, after it the multi-candidate verifier rewrites
their rows (``finish_verification``, called by ``runner_patch``), and after the chain drafts it replaces
an eligible request's draft by its 2D step's rows.  A measured arbiter per batch size picks 2D, the
chain or no drafts for each step (``policy``).  Its steps are verified by vLLM's rejection sampler
and then its own verifier, never by the chain's argmax or coupled verdicts (``verifies_steps``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from vllm_lookahead.core import RowStep
from vllm_lookahead.vllm.proposer import PROFILE, LookaheadProposer

from .config import Lade2DConfig
from .lade_steps import LadeSteps


class Lade2DProposer(LookaheadProposer):
    verifies_steps = False

    def __init__(self, vllm_config: Any):
        self.lade = Lade2DConfig.from_sources(getattr(vllm_config, "additional_config", None))
        k = int(vllm_config.speculative_config.num_speculative_tokens)
        # chain requests draft chain-sized drafts: k is sized for the 2D rows
        super().__init__(vllm_config, chain_k=min(k, self.lade.chain_max_draft or k))
        self.steps = LadeSteps(self.config, self.lade, self.k)

    def _capture(self, runner: Any, logits: Any, spec_decode_metadata: Any) -> None:
        super()._capture(runner, logits, spec_decode_metadata)
        self.steps.step2d = None
        if logits is not None and spec_decode_metadata is not None:
            self.steps.capture(logits, logits.argmax(dim=-1), spec_decode_metadata)

    # Called by runner_patch inside GPUModelRunner._sample, after vLLM's own sampler.
    def finish_verification(self, runner: Any, sampler_output: Any) -> None:
        t0 = time.perf_counter()
        try:
            self.steps.finish(sampler_output)
        finally:
            PROFILE.seconds += time.perf_counter() - t0

    def _propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                 token_ids_cpu: np.ndarray) -> list[list[int]]:
        runner = self._runner
        ran_2d = self.steps.take()
        if ran_2d and self._captured is not None:  # a 2D step's rows are not a chain: no chain draft was verified
            ids, counts = self._captured
            self._captured = (ids, [0 if rid in ran_2d else nd for rid, nd in zip(ids, counts)])
        drafts = super()._propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        if runner is None:
            return drafts
        n = len(sampled_token_ids)
        req_ids = runner.input_batch.req_ids
        num_tokens = np.asarray(num_tokens_no_spec[:n]).tolist()
        prompt_lens = np.asarray(runner.input_batch.num_prompt_tokens[:n]).tolist()
        rows = [RowStep(req_ids[i], token_ids_cpu[i], num_tokens[i], list(new), 0, prompt_lens[i])
                for i, new in enumerate(sampled_token_ids)]
        # a 2D step's rows below are a layout the verifier reads as a whole, never cut
        self.steps.drafts(runner, rows, drafts, ran_2d)
        # Never more than k per row: longer drafts crash vLLM's spec-decode metrics (IndexError).
        return [d[: self.k] for d in drafts]
