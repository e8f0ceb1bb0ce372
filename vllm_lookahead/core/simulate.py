"""Greedy speculative decoding in plain Python, to measure a drafter without an engine.

``verify(context, draft)`` must return the target's argmax after ``context`` and after each prefix of
``draft`` (``len(draft) + 1`` tokens) -- exactly what one verification forward pass yields.  The loop
commits the longest matching prefix plus the bonus token, as vLLM's greedy rejection sampler does, so
the output equals plain greedy decoding by construction and ``steps`` counts target forward passes.
Used by the unit tests (with toy "models") and by benchmarks (with a real model behind ``verify``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .config import LookaheadConfig
from .drafter import LookaheadDrafter

Verify = Callable[[Sequence[int], Sequence[int]], Sequence[int]]


@dataclass
class SimResult:
    tokens: list[int]
    steps: int
    drafted: int
    accepted: int

    @property
    def compression(self) -> float:
        return len(self.tokens) / self.steps if self.steps else 0.0


def simulate(verify: Verify, prompt: Sequence[int], max_new_tokens: int, k: int,
             cfg: LookaheadConfig | None = None, eos: int | None = None,
             drafter: LookaheadDrafter | None = None, req_id: str = "r0") -> SimResult:
    drafter = drafter or LookaheadDrafter(cfg or LookaheadConfig(), k)

    def step(new: list[int], verified: int) -> list[int]:
        return drafter.step([req_id], np.asarray([ctx], dtype=np.int32), np.array([len(ctx)], dtype=np.int32), [new], [verified],
                            np.array([len(prompt)]), lambda _: None)[0]

    ctx = list(prompt)
    out: list[int] = []
    steps = drafted = accepted = 0
    # Prefill: the first forward pass yields the first token; the drafter sees the prompt.
    first = int(verify(ctx, [])[0])
    steps += 1
    ctx.append(first)
    out.append(first)
    draft = step([first], 0)
    while len(out) < max_new_tokens and (eos is None or out[-1] != eos):
        draft = draft[: max(0, max_new_tokens - len(out) - 1)]
        argmax = [int(t) for t in verify(ctx, draft)]
        steps += 1
        a = 0
        while a < len(draft) and draft[a] == argmax[a]:
            a += 1
        new = argmax[: a + 1]
        if eos is not None and eos in new:
            new = new[: new.index(eos) + 1]
        drafted += len(draft)
        accepted += a
        ctx.extend(new)
        out.extend(new)
        draft = step(list(new), len(draft))
        if len(draft) > k:
            raise AssertionError(f"drafter proposed {len(draft)} > k={k} tokens")
    return SimResult(out[:max_new_tokens], steps, drafted, accepted)
