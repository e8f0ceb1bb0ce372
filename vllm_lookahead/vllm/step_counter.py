"""Count target forward passes of in-process engines (benchmark only; patch ``step_counter``).

Compression = generated tokens / forward passes is the figure that carries from CPU to GPU, and vLLM
exposes no step count, so the benchmark wraps ``GPUModelRunner.execute_model`` while it measures and
reverts it afterwards (``patches.revert``).  Only in-process engines share this module's counter.
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
        t = time.perf_counter()
        try:
            return orig(runner, *args, **kwargs)
        finally:
            dt = time.perf_counter() - t
            for counter in _ACTIVE:
                counter.steps += 1
                counter.seconds += dt

    return execute_model


class StepCounter:
    """``with StepCounter() as c: ...`` -- ``c.steps`` forward passes, ``c.seconds`` spent in them."""

    def __init__(self) -> None:
        self.steps = 0
        self.seconds = 0.0

    def __enter__(self) -> StepCounter:
        patches.apply("step_counter")
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _ACTIVE.remove(self)
        if not _ACTIVE:
            patches.revert("step_counter")
