"""The batch-level lookahead drafter: request states keyed by request id plus the adaptive policy.

Pure Python/numpy so that it is testable without vLLM; ``vllm_lookahead.vllm.proposer`` feeds it the
runner's rows each step.  The policy keeps lookahead from making serving slower:
  * per request: an EMA of accepted tokens per drafted token; below ``min_acceptance`` the request
    stops drafting and only probes every ``probe_interval`` steps (not at batch sizes up to
    ``free_draft_batch_size`` (default 1), where draft rows are nearly free);
  * per batch: above ``batch_size_threshold`` running requests only requests whose EMA clears
    ``busy_min_acceptance`` draft freely, and all drafts together fit ``max_batch_draft_tokens`` (best
    first);
  * a request below the floor in force still drafts *confident* context matches (``confident_fallback``:
    a suffix of >= ``confident_match`` tokens seen before, no pool/Jacobi fill), because those are
    accepted often enough to pay for their rows even when rows cost compute.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from .config import LookaheadConfig
from .pool import NGramPool
from .state import RequestState


@dataclass
class RowStep:
    """What the engine tells the drafter about one running request after a forward pass."""

    req_id: str
    context: np.ndarray | list[int]  # committed tokens; at least num_tokens long
    num_tokens: int
    new_tokens: list[int]  # accepted drafts + bonus token this step; [] while still prefilling
    verified: int = 0  # draft tokens verified for this row this step
    argmax: np.ndarray | list[int] | None = None  # target argmax at the verified + 1 rows
    prompt_len: int = 0


class LookaheadDrafter:
    def __init__(self, cfg: LookaheadConfig, num_speculative_tokens: int):
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        self.cfg = cfg
        self.k = num_speculative_tokens
        self.states: dict[str, RequestState] = {}
        self.shared = (NGramPool(cfg.ngram, cfg.pool_size, cfg.shared_pool_keys)
                       if cfg.shared_pool_keys > 0 else None)
        self._dormant: OrderedDict[str, RequestState] = OrderedDict()

    def _state(self, row: RowStep) -> RequestState:
        st = self.states.get(row.req_id)
        if st is None:
            st = self._dormant.pop(row.req_id, None) or RequestState(self.cfg, self.k, row.prompt_len, self.shared)
            self.states[row.req_id] = st
        return st

    def step(self, rows: list[RowStep]) -> list[list[int]]:
        """Observe one engine step for every running request and return the next drafts, in row order."""
        live = {r.req_id for r in rows}
        for rid in [r for r in self.states if r not in live]:  # finished or preempted
            self._dormant[rid] = self.states.pop(rid)
            while len(self._dormant) > self.cfg.max_dormant_requests:
                self._dormant.popitem(last=False)
        states = []
        for row in rows:
            st = self._state(row)
            st.observe(row.context, row.num_tokens, row.new_tokens, row.verified, row.argmax)
            states.append(st)
        budgets, confident = self._budgets(rows, states)
        return [st.propose(b, confident_only=c) for st, b, c in zip(states, budgets, confident)]

    def _budgets(self, rows: list[RowStep], states: list[RequestState]) -> tuple[list[int], list[bool]]:
        """Draft budget per row, and whether the row may only draft confident context matches."""
        cfg = self.cfg
        busy = len(rows) > cfg.batch_size_threshold
        free = len(rows) <= cfg.free_draft_batch_size
        want, confident = [], []
        for row, st in zip(rows, states):
            if not row.new_tokens:  # still in prefill: nothing to draft from yet
                want.append(0)
                confident.append(False)
                continue
            floor = cfg.busy_min_acceptance if busy else (0.0 if free else cfg.min_acceptance)
            if st.ema >= floor:
                st.idle_steps = 0
                want.append(self.k)
                confident.append(False)
            else:
                st.idle_steps += 1
                probe = st.idle_steps % cfg.probe_interval == 0
                want.append(self.k if probe or cfg.confident_fallback else 0)
                confident.append(not probe)
        total = sum(want)
        if total <= cfg.max_batch_draft_tokens:
            return want, confident
        budgets = [0] * len(want)
        left = cfg.max_batch_draft_tokens
        for i in sorted(range(len(want)), key=lambda i: -states[i].ema):
            take = min(want[i], left)
            budgets[i] = take
            left -= take
        return budgets, confident

    def forget(self, req_id: str) -> None:
        self.states.pop(req_id, None)
        self._dormant.pop(req_id, None)

    def summary(self) -> dict[str, float]:
        all_states = list(self.states.values()) + list(self._dormant.values())
        drafted = sum(s.stats.drafted for s in all_states)
        accepted = sum(s.stats.accepted for s in all_states)
        return {"requests": len(all_states), "drafted": drafted, "accepted": accepted,
                "acceptance_rate": accepted / drafted if drafted else 0.0}
