"""The one patch lookahead needs inside vLLM's model runner (patch ``runner_sample``).

Why: the proposer needs each step's verification before vLLM's rejection sampler consumes it -- the
verified draft counts (the drafter credits them to its acceptance estimates), a greedy step's argmax
(``greedy_verify.py`` gives the verdict from it), and for a proposer that verifies rows itself the
logits at every row.  ``GPUModelRunner._sample(logits, spec_decode_metadata)`` is the narrowest place
that sees all verification logits before rejection, in the same row order that the following ``propose()`` call sees;
the CPU runner inherits it, so one patch covers CPU and CUDA.

What: wrap ``_sample`` so that, before sampling, the proposer's ``capture_verification(runner, logits,
metadata)`` runs, and after it ``finish_verification(runner, sampler_output)`` where the proposer has
one (a subclass's own verifier rewrites its requests' rows there).  When the capture already
verified a greedy step from its argmax (``take_verdict()``, ``greedy_verify.py``), or a T>0 step is sampled
position by position as plain decoding samples it (``coupled_verify.py``: seeded requests reproduce token
for token), that output stands in for vLLM's rejection sampler.  Runners whose drafter is not ours
pass straight through.

Applied by ``LookaheadProposer.__init__`` (worker), through ``patches.apply``.
"""

from __future__ import annotations

from typing import Any

from . import patches


@patches.declare("runner_sample", "vllm.v1.worker.gpu_model_runner:GPUModelRunner._sample",
                 "expose the target argmax at every verified position to the lookahead proposer, and let its "
                 "verdict (greedy argmax; T>0 coupled sampling, so seeded requests reproduce) stand in for "
                 "vLLM's rejection sampler", "worker")
def _build_sample(original: Any) -> Any:
    def _sample(self: Any, logits: Any, spec_decode_metadata: Any) -> Any:
        drafter = getattr(self, "drafter", None)
        capture = getattr(drafter, "capture_verification", None)
        output = None
        if capture is not None:
            capture(self, logits, spec_decode_metadata)
            take = getattr(drafter, "take_verdict", None)
            output = take() if take is not None else None  # greedy argmax or T>0 coupled verdict, or None
        if output is None:
            output = original(self, logits, spec_decode_metadata)
        else:
            self.input_batch.update_async_output_token_ids()  # what vLLM's _sample does first
        finish = getattr(drafter, "finish_verification", None)
        if finish is not None:
            finish(self, output)
        return output

    _sample.__doc__ = original.__doc__
    return _sample


def install_runner_hook() -> bool:
    """Patch ``GPUModelRunner._sample`` once per process; returns True if this call installed it."""
    return patches.apply("runner_sample")
