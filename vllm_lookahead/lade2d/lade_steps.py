"""The 2D layout's share of the proposer: which requests run LADE's step, their state, and the measured
choice between 2D, the chain and no drafts.  ``Lade2DProposer`` holds one ``LadeSteps`` and calls it
around its chain drafts."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from vllm_lookahead.core.arbiter import ThroughputArbiter
from vllm_lookahead.core.config import LookaheadConfig, LookaheadConfigError
from vllm_lookahead.core.drafter import RowStep
from vllm_lookahead.core.jit import load_kernels

from . import hooks
from .config import ALIASES, LIMITS, Lade2DConfig
from .lade import LadeState

logger = logging.getLogger("vllm_lookahead")


class LadeSteps:
    def __init__(self, config: LookaheadConfig, lade: Lade2DConfig, k: int) -> None:
        if lade.rows - 1 > k:
            raise LookaheadConfigError(
                f"lookahead2d config: W={lade.window} N={lade.ngram} G={lade.candidates} "
                f"(+{lade.context_candidate} context tokens) needs (N-1)(W+G)-1 = {lade.rows - 1} draft "
                f"tokens, but num_speculative_tokens is {k}")
        self.config, self.lade, self.k = config, lade, k
        self.states: dict[str, LadeState] = {}  # per-request window/pool state
        self._ok: bool | None = None  # None until the KV layout probe ran on the live engine
        self.step2d: hooks.StepPlan | None = None  # the step being verified
        # by (batch size, 2D possible): what pays depends on the batch size
        self.arbiters: dict[tuple[int, bool], ThroughputArbiter] = {}
        self._last_layout: tuple[str, tuple[int, bool], float] | None = None  # (layout, arbiter key, time)
        hooks.install_lade2d_hooks()

    def capture(self, logits: Any, argmax: Any, spec_decode_metadata: Any) -> None:
        """Before vLLM's sampler: the step's 2D requests and their argmax rows."""
        self.step2d = hooks.verify_step(logits, argmax, spec_decode_metadata)

    def finish(self, sampler_output: Any) -> None:
        """After vLLM's sampler: the multi-candidate verifier rewrites the 2D requests' rows."""
        if self.step2d is not None:
            hooks.apply_verification(self.step2d, sampler_output)

    def take(self) -> dict[str, hooks.FlaggedRequest]:
        """The requests the step just verified ran as 2D, by id (and forget the step)."""
        step2d, self.step2d = self.step2d, None
        return {req.req_id: req for req in step2d.requests} if step2d is not None else {}

    def drafts(self, runner: Any, rows: list[RowStep], drafts: list[list[int]],
               ran_2d: dict[str, hooks.FlaggedRequest]) -> None:
        """Replace the chain drafts of eligible requests by their 2D step's rows (``hooks``)."""
        if self._ok is None:
            self._ok, why = hooks.check_engine(runner)
            if not self._ok:
                logger.warning("vllm-lookahead: 2D layout disabled, chain drafts used instead: %s", why)
        live = {row.req_id for row in rows}
        for rid in [r for r in self.states if r not in live]:  # finished or preempted
            del self.states[rid]
        use = bool(self._ok) and len(rows) <= self.lade.max_batch
        layout = self._choose_layout(rows, use)
        if layout == "off":  # the arbiter measured that no draft pays at this batch size
            drafts[:] = [[] for _ in drafts]
        for i, row in enumerate(rows):
            st = self.states.get(row.req_id)
            done = ran_2d.get(row.req_id)
            if st is not None and done is not None:
                st.absorb(done.plan, done.argmax, done.matched)
            if layout != "2d" or not row.new_tokens:
                continue
            req = runner.requests.get(row.req_id)
            sp = getattr(req, "sampling_params", None)
            if not hooks.eligible(sp):
                continue
            if st is None:
                st = self.states[row.req_id] = LadeState(*self._shape(sp), seed=self.lade.seed)
            st.observe(row.context, row.num_tokens, row.prompt_len)
            current = int(row.context[row.num_tokens - 1])
            plan = st.plan(current, row.num_tokens - 1, self._extra_candidates(row))
            if 0 < len(plan.drafts) <= self.k:
                hooks.PENDING[row.req_id] = plan
                drafts[i] = plan.drafts

    def _extra_candidates(self, row: RowStep) -> list[list[int]]:
        """2D candidates beyond LADE's pool, if configured: a confident context match (prompt lookup over the
        request's committed tokens)."""
        lade = self.lade
        if not lade.context_candidate:
            return []
        toks = np.asarray(row.context[: row.num_tokens], dtype=np.int32)
        end, length, _ = load_kernels().suffix_match_evidence(toks, row.num_tokens, self.config.min_match,
                                                              self.config.max_match)
        if end < 0 or length < lade.context_min_match:
            return []
        return [toks[end : end + lade.context_candidate].tolist()]

    def _choose_layout(self, rows: list[RowStep], possible: bool) -> str:
        """2D, chain or off for the next step: with policy "measure" the arbiter of this batch size
        decides, fed with the step just done; "always": 2D when possible."""
        now = time.perf_counter()
        last, self._last_layout = self._last_layout, None
        if last is not None:
            self.arbiters[last[1]].observe(last[0], sum(len(r.new_tokens) for r in rows), now - last[2])
        if self.lade.policy == "always":
            return "2d" if possible else "chain"
        key = (len(rows), possible)
        arbiter = self.arbiters.get(key)
        if arbiter is None:
            arbiter = self.arbiters[key] = ThroughputArbiter(("chain", "2d", "off") if possible else ("chain", "off"))
        layout = arbiter.choose()
        self._last_layout = (layout, key, now)
        return layout

    def _shape(self, sampling_params: Any) -> tuple[int, int, int]:
        """W, N, G for a request: the engine's, or smaller ones the client asked for in
        ``SamplingParams.extra_args["lookahead"]`` -- keys W/N/G (``config.ALIASES``) or their long
        names, clamped to the declared lower bound (``config.LIMITS``) and capped at the
        engine's values."""
        keys = ("window", "ngram", "candidates")
        shape = [getattr(self.lade, k) for k in keys]
        asked = (getattr(sampling_params, "extra_args", None) or {}).get("lookahead") or {}
        if isinstance(asked, dict):
            asked = {ALIASES.get(k, k): v for k, v in asked.items()}
            for j, key in enumerate(keys):
                v = asked.get(key)
                if isinstance(v, int) and not isinstance(v, bool):
                    shape[j] = min(max(v, int(LIMITS[key][0])), shape[j])
        return shape[0], shape[1], shape[2]
