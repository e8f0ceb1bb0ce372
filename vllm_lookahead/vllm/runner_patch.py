"""The one patch lookahead needs inside vLLM 0.32's model runner.

Why: vLLM's rejection sampler computes the target's argmax at every draft position but returns only
the accepted prefix.  Lookahead needs the argmax *past* the first rejection too -- it is the next
Jacobi iterate and the raw material of the trajectory n-grams.  ``GPUModelRunner._sample(logits,
spec_decode_metadata)`` is the narrowest place that sees all verification logits before rejection, in
the same row order that the following ``propose()`` call sees; the CPU runner inherits it, so one patch
covers CPU and CUDA.

What: wrap ``_sample`` so that, before sampling, the proposer's ``capture_verification(runner, logits,
metadata)`` runs, and after it ``finish_verification(runner, sampler_output)`` (the 2D layout's
multi-candidate verifier rewrites its requests' rows there, ``lade2d.py``).  It only launches an argmax and an asynchronous device-to-host copy (no host sync on
CUDA); the result is read in ``propose()``, which vLLM calls after its own bookkeeping sync.

Pinned to vLLM 0.32 (checked by ``version.check_vllm_version``); re-applying is a no-op.
"""

from __future__ import annotations

from typing import Any

from .version import check_vllm_version

_MARK = "_vllm_lookahead_hook"


def install_runner_hook() -> bool:
    """Patch ``GPUModelRunner._sample`` once per process; returns True if this call installed it."""
    check_vllm_version()
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if getattr(GPUModelRunner._sample, _MARK, False):
        return False
    original = GPUModelRunner._sample

    def _sample(self: Any, logits: Any, spec_decode_metadata: Any) -> Any:
        drafter = getattr(self, "drafter", None)
        capture = getattr(drafter, "capture_verification", None)
        if capture is not None:
            capture(self, logits, spec_decode_metadata)
        output = original(self, logits, spec_decode_metadata)
        finish = getattr(drafter, "finish_verification", None)
        if finish is not None:
            finish(self, output)
        return output

    setattr(_sample, _MARK, True)
    _sample.__wrapped__ = original  # type: ignore[attr-defined]
    _sample.__doc__ = original.__doc__
    GPUModelRunner._sample = _sample
    return True
