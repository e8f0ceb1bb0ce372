"""Count target forward passes of in-process engines (benchmark only; patch ``step_counter``).

Compression = generated tokens / forward passes is the figure that carries from CPU to GPU, and vLLM
exposes no step count, so the benchmark wraps ``GPUModelRunner.execute_model`` while it measures and
reverts it afterwards (``patches.revert``).  Only in-process engines share this module's counter.

It also times the steps that carry prompt tokens (a new request's prefill, or a chunk of one, next to the
running requests' decode rows) apart.  The prompt work in them is the same whatever the drafter does,
and dilutes any drafter's end-to-end lead; the decode rows beside it are not, so the share of the wall
time in these steps bounds the prompt work's share from above rather than measuring it.
"""

from __future__ import annotations

import time
from typing import Any

from . import patches

_ACTIVE: list[StepCounter] = []


@patches.declare("step_counter", "vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model",
                 "benchmark: count forward passes and their wall time", "tool")
def _build_execute_model(orig: Any) -> Any:
    def execute_model(runner: Any, *args: Any, **kwargs: Any) -> Any:
        prompt = carries_prompt_tokens(args[0] if args else kwargs.get("scheduler_output"))
        t = time.perf_counter()
        try:
            return orig(runner, *args, **kwargs)
        finally:
            dt = time.perf_counter() - t
            for counter in _ACTIVE:
                counter.steps += 1
                counter.seconds += dt
                if prompt:
                    counter.prompt_steps += 1
                    counter.prompt_seconds += dt

    return execute_model


def carries_prompt_tokens(scheduler_output: Any) -> bool:
    """Does the step schedule prompt tokens?  A decoding request schedules one token plus its draft
    tokens; any more in the step are prompt tokens (a prefill, a chunk of one, or a preempted request's
    recomputation)."""
    if scheduler_output is None:
        return False
    decode_tokens = len(scheduler_output.num_scheduled_tokens) + sum(
        len(d) for d in scheduler_output.scheduled_spec_decode_tokens.values())
    return scheduler_output.total_num_scheduled_tokens > decode_tokens


class StepCounter:
    """``with StepCounter() as c: ...`` -- ``c.steps`` forward passes, ``c.seconds`` spent in them;
    ``c.prompt_steps`` / ``c.prompt_seconds`` the part of them that carried prompt tokens."""

    def __init__(self) -> None:
        self.steps = self.prompt_steps = 0
        self.seconds = self.prompt_seconds = 0.0

    def __enter__(self) -> StepCounter:
        patches.apply("step_counter")
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _ACTIVE.remove(self)
        if not _ACTIVE:
            patches.revert("step_counter")
