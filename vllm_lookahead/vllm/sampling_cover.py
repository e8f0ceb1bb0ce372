"""Serve every sampling field vLLM serves without speculation (issue 55): ``logit_bias`` and ``min_p``.

Why: vLLM 0.32/0.33 refuses ``logit_bias`` and ``min_p`` on any engine with a speculative config
(``SamplingParams._validate_spec_decode``: HTTP 400 "not yet supported with speculative decoding"),
because its rejection sampler does not apply them at draft positions: ``RejectionSampler.
apply_logits_processors`` runs only the min-tokens processor of the non-argmax-invariant ones (no
logit bias) and ``apply_sampling_constraints`` only temperature, top-k and top-p (no min-p).  A
plain server answers the same request with 200.  Lookahead chooses per request how much to draft,
so it can serve such a request exactly as plain decoding does: it drafts nothing for it.

Why no drafts is exact: a row with zero drafts in a speculative step is sampled only by the bonus
sampler -- vLLM's own ``Sampler`` on that row's last-position logits with the full sampling metadata
(allowed tokens, bad words, *every* logits processor including logit bias, penalties, temperature,
min-p, top-k/top-p), one draw from the request's generator -- and the rejection sampler adds no draw
for a row without drafts (``generate_uniform_probs`` and ``sample_recovered_tokens`` skip them).  A
step in which no row has drafts takes vLLM's plain path anyway (``plain_steps.py``).  Tested against a
plain server field by field (``tests/vllm/test_serve_readme.py``).

Three parts:

* frontend -- patch ``spec_sampling_fields``: ``SamplingParams._validate_spec_decode`` lets ``min_p``
  and ``logit_bias`` through when the speculative config is lookahead's (``custom_class`` with a
  ``vllm_lookahead.`` model); every other config, and every other check vLLM adds there, is vLLM's own
  (the original runs on a copy of the params with those two fields neutral).  Applied by
  ``vllm-lookahead serve`` and our in-process tools; a user's own ``LLM(...)`` process calls
  ``serve_all_sampling_fields()`` (the frontend never imports the proposer, and ``plugin.register``
  stays inert).
* worker -- patch ``spec_logitsprocs``: with a speculative config vLLM 0.32 builds only the min-tokens
  logits processor (``build_logitsprocs``: "min_p and logit_bias parameters won't work with speculative
  decoding"), so even an undrafted row would lose its bias.  A lookahead runner gets vLLM's own
  non-speculative set (the builtins: min-tokens, logit bias, min-p; the speculative config hidden for
  the call); custom processors stay refused as vLLM refuses them.  The rejection sampler still applies
  only min-tokens at draft positions, which is why the rows below get no drafts.  Applied by the
  proposer, whose constructor runs before the runner builds its processors.
* worker -- ``undraftable_rows``: the rows the chain must not draft for: a logit bias (any
  temperature) or min-p at T>0 (min-p never moves a greedy argmax).  Read from vLLM's own builtin
  processors' state (row-indexed, current for the step just run), found once; a step in which neither
  holds a request costs two attribute reads.
"""

from __future__ import annotations

import copy
from typing import Any

from . import patches

_SAMPLING_EPS = 1e-5  # vLLM's threshold for "greedy" (sampling_params._SAMPLING_EPS)


def is_lookahead(speculative_config: Any) -> bool:
    """Is this engine's speculative config lookahead's proposer (or one of this package's)?"""
    if speculative_config is None or getattr(speculative_config, "method", None) != "custom_class":
        return False
    return str(getattr(speculative_config, "model", "") or "").startswith("vllm_lookahead.")


@patches.declare("spec_sampling_fields", "vllm.sampling_params:SamplingParams._validate_spec_decode",
                 "vLLM refuses min_p and logit_bias with any speculative config; lookahead serves them "
                 "exactly by drafting nothing for such a request", "frontend")
def _build_validate(original: Any) -> Any:
    def _validate_spec_decode(self: Any, speculative_config: Any) -> None:
        if not is_lookahead(speculative_config) or (self.min_p <= _SAMPLING_EPS and not self.logit_bias):
            return original(self, speculative_config)
        neutral = copy.copy(self)  # vLLM's other spec-decode checks (if a release adds any) still run
        neutral.min_p, neutral.logit_bias = 0.0, None
        return original(neutral, speculative_config)

    _validate_spec_decode.__doc__ = original.__doc__
    return _validate_spec_decode


def serve_all_sampling_fields() -> bool:
    """Let a lookahead engine in this (frontend) process accept ``min_p`` and ``logit_bias``; True if
    this call applied the patch.  Engines with any other speculative config are unaffected."""
    return patches.apply("spec_sampling_fields")


@patches.declare("spec_logitsprocs", "vllm.v1.worker.gpu_model_runner:build_logitsprocs",
                 "with any speculative config vLLM builds only the min-tokens processor (no logit bias, no "
                 "min-p); a lookahead runner needs vLLM's builtins to serve those requests", "worker")
def _build_logitsprocs(original: Any) -> Any:
    def build_logitsprocs(vllm_config: Any, *args: Any, **kwargs: Any) -> Any:
        custom = kwargs.get("custom_logitsprocs", args[3] if len(args) > 3 else ())
        spec = vllm_config.speculative_config
        if custom or not is_lookahead(spec):
            return original(vllm_config, *args, **kwargs)  # vLLM's refusal of custom processors stands
        vllm_config.speculative_config = None  # vLLM's own non-speculative branch: every builtin processor
        try:
            return original(vllm_config, *args, **kwargs)
        finally:
            vllm_config.speculative_config = spec

    return build_logitsprocs


def install_worker_cover() -> bool:
    """In a lookahead worker, before its runner builds its logits processors (``GPUModelRunner.__init__``
    creates the drafter first); True if this call applied it."""
    return patches.apply("spec_logitsprocs")


class DraftCover:
    """Which rows of the persistent batch the chain may draft for (see the module docstring)."""

    def __init__(self) -> None:
        self._procs: Any = None
        self._bias: Any = None
        self._min_p: Any = None

    def _find(self, logitsprocs: Any) -> None:
        from vllm.v1.sample.logits_processor.builtin import (
            LogitBiasLogitsProcessor,
            MinPLogitsProcessor,
        )

        self._procs = logitsprocs
        self._bias = self._min_p = None
        for proc in logitsprocs.all:
            if isinstance(proc, LogitBiasLogitsProcessor):
                self._bias = proc
            elif isinstance(proc, MinPLogitsProcessor):
                self._min_p = proc

    def undraftable_rows(self, batch: Any, n: int) -> list[int]:
        """Rows < ``n`` whose sampling vLLM's rejection sampler does not apply at draft positions."""
        procs = batch.logitsprocs
        if procs is not self._procs:
            self._find(procs)
        bias, min_p = self._bias, self._min_p
        if not (bias is not None and bias.biases) and not (min_p is not None and min_p.min_p_count):
            return []
        rows = set()
        if bias is not None and bias.biases:
            rows.update(i for i in bias.biases if i < n)
        if min_p is not None and min_p.min_p_count:
            temperature = batch.temperature_cpu
            rows.update(i for i in range(n) if min_p.min_p_cpu[i] > 0 and temperature[i] >= _SAMPLING_EPS)
        return sorted(rows)
