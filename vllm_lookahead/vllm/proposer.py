"""``LookaheadProposer``: lookahead decoding as a vLLM 0.32 ``custom_class`` speculative proposer.

    LLM(model=..., speculative_config={"model": "vllm_lookahead.LookaheadProposer",
                                       "num_speculative_tokens": 4},
        additional_config={"lookahead": {"memory_tokens": 65536}})

vLLM builds it in each worker as ``LookaheadProposer(vllm_config)`` and, after every forward pass,
calls ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)`` for the
rows of ``runner.input_batch``.  Drafts are verified by vLLM's own rejection sampler in the next step,
which is what keeps outputs lossless (greedy match at T=0, the draft-free rejection rule at T>0).

Design: the k draft slots carry the best candidate of the context match (prompt lookup over prompt +
output) and the engine-wide memory of earlier outputs, cut at its estimated commit probability
(``vllm_lookahead.core.drafter``).  All algorithmic state lives in ``vllm_lookahead.core`` keyed by
request id, so row reordering, preemption and ``n > 1`` are handled by id, never by row index.

With ``layout="2d"`` (experimental) the proposer can instead hand vLLM LADE's whole step (G candidates +
the Jacobi window) as the draft of an eligible request; ``lade2d`` then runs it with LADE's mask and
verifies it with a multi-candidate verifier (docs/lookahead.md, "The 2D layout").  A measured arbiter per
batch size (``core.arbiter``) picks 2D, the chain or no drafts for each step.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from vllm_lookahead.core import LookaheadConfig, LookaheadConfigError, LookaheadDrafter, RowStep
from vllm_lookahead.core.arbiter import ThroughputArbiter
from vllm_lookahead.core.config import ALIASES, LADE_LIMITS
from vllm_lookahead.core.jit import load_kernels
from vllm_lookahead.experimental import lade2d
from vllm_lookahead.experimental.lade import LadeState

from . import greedy_verify
from .fixes import apply_tool_fixes, fix_cpu_expand_if_broken
from .plain_steps import install_plain_steps
from .runner_patch import install_runner_hook
from .version import check_vllm_version

logger = logging.getLogger("vllm_lookahead")


class _Profile:
    """CPU time spent in the proposer and its runner hook, per process (read by the benchmark)."""

    def __init__(self) -> None:
        # the drafter of the proposer built last in this process (the benchmark records its summary:
        # drafts and acceptance by source, the busy-batch guard's choices); reset() leaves it
        self.drafter: LookaheadDrafter | None = None
        self.reset()

    def reset(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self.rows = 0  # request rows handled, summed over calls (cost per row transfers across models)


PROFILE = _Profile()


def draft_room(requests: Any, req_ids: list[str], num_tokens: list[int], prompt_lens: list[int], k: int) -> list[int]:
    """How many draft tokens each row can still use: one step commits its accepted drafts plus one token,
    so a request ``r`` output tokens short of its ``max_tokens`` uses at most ``r - 1`` drafts (capped at
    ``k``).  Why: vLLM schedules whatever is drafted, and near the cap the rest are rows that cost step
    time and can never be committed -- every request that stops at ``max_tokens`` pays that in its last
    step or two."""
    room = []
    for rid, nt, pl in zip(req_ids, num_tokens, prompt_lens):
        req = requests.get(rid)
        params = getattr(req, "sampling_params", None)
        max_tokens = getattr(params, "max_tokens", None)
        room.append(k if max_tokens is None else max(0, min(k, pl + max_tokens - nt - 1)))
    return room


def isolation_key(req: Any) -> tuple[Any, Any]:
    """Whose earlier outputs a request may draft from: (LoRA adapter, tenant).  The tenant is
    ``SamplingParams.extra_args["lookahead"]["tenant"]`` (or ``extra_args["tenant"]``); requests of
    different adapters or tenants never see each other's outputs in the engine-wide memory.  The model
    is implicit: the memory lives in one engine."""
    lora = getattr(req, "lora_request", None)
    lora_id = getattr(lora, "lora_name", None) or getattr(lora, "lora_int_id", None) if lora else None
    extra = getattr(getattr(req, "sampling_params", None), "extra_args", None) or {}
    la = extra.get("lookahead") if isinstance(extra.get("lookahead"), dict) else {}
    tenant = la.get("tenant", extra.get("tenant"))
    return (lora_id, None if tenant is None else str(tenant))


class LookaheadProposer:
    def __init__(self, vllm_config: Any):
        # The plugin is used here (vLLM loaded this class in the worker): check the vLLM range, apply
        # the worker patches (patches.PATCHES), and fix vLLM's CPU expand kernel if the probe finds it
        # broken (T>0 speculative sampling, fixes.py).  None of this happens where lookahead is not used.
        check_vllm_version()
        # the drafter loads numba (core/kernels.py): a second engine started later in this process must
        # survive it (fixes.py, safe_rebind_kernels; a no-op where the scan is fine)
        apply_tool_fixes()
        install_runner_hook()
        install_plain_steps()  # steps without drafts skip vLLM's rejection sampler (plain_steps.py)
        logger.info("vllm-lookahead: %s", fix_cpu_expand_if_broken())
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.config = LookaheadConfig.from_sources(getattr(vllm_config, "additional_config", None))
        lade = self.config.lade
        chain_k = min(self.k, lade.chain_max_draft or self.k) if self.config.layout == "2d" else self.k
        self.drafter = LookaheadDrafter(self.config, chain_k)
        PROFILE.drafter = self.drafter
        self._runner: Any = None
        self._captured: tuple[list[str], Any, list[int]] | None = None
        self._verdict: Any = None  # a SamplerOutput made from the argmax (greedy_verify), until taken
        self._warned = False
        # LADE's 2D layout (config layout="2d"): per-request window/pool state, the verified step
        self.lade: dict[str, LadeState] = {}
        self._lade_ok: bool | None = None  # None until the KV layout probe ran on the live engine
        self._step2d: lade2d.StepPlan | None = None
        # by (batch size, 2D possible): what pays depends on the batch size
        self.arbiters: dict[tuple[int, bool], ThroughputArbiter] = {}
        self._last_layout: tuple[str, tuple[int, bool], float] | None = None  # (layout, arbiter key, time)
        if self.config.layout == "2d":
            if lade.rows - 1 > self.k:
                raise LookaheadConfigError(
                    f"lookahead config: layout=2d with W={lade.window} N={lade.ngram} G={lade.candidates} "
                    f"(+{lade.context_candidate} context tokens) needs (N-1)(W+G)-1 = {lade.rows - 1} draft "
                    f"tokens, but num_speculative_tokens is {self.k}")
            lade2d.install_lade2d_hooks()
        logger.info("vllm-lookahead proposer: k=%d config=%s", self.k, self.config.as_dict())

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load: drafts come from the target model's own outputs.  (The CPU runner calls
        this unconditionally, so it must exist.)"""

    # Called by runner_patch inside GPUModelRunner._sample, before rejection sampling.
    def capture_verification(self, runner: Any, logits: Any, spec_decode_metadata: Any) -> None:
        t0 = time.perf_counter()
        try:
            self._capture(runner, logits, spec_decode_metadata)
        finally:
            PROFILE.seconds += time.perf_counter() - t0

    def _capture(self, runner: Any, logits: Any, spec_decode_metadata: Any) -> None:
        self._runner = runner
        self._verdict = None
        if logits is None or spec_decode_metadata is None:
            self._captured = self._step2d = None
            return
        import torch

        cfg = self.config
        # a greedy step whose verdict is the plain argmax is verified here, from the numpy argmax
        # (greedy_verify.py: vLLM's CPU rejection sampler clones the logits and runs torch's argmax)
        verdict = (cfg.fast_greedy_verify and cfg.layout != "2d"
                   and greedy_verify.argmax_is_the_verdict(runner, logits, spec_decode_metadata))
        # the chain drafter needs the verified counts, not the argmax (only the 2D layout reads it)
        drafter_skips_argmax = cfg.layout != "2d"
        argmax: Any = None
        if verdict or (not drafter_skips_argmax and cfg.layout != "2d" and logits.is_cpu
                       and logits.dtype == torch.float32):
            # numpy's argmax over a CPU float32 batch is ~10x faster than torch's (26 vs 310 us for
            # 90 rows x 4096 on one thread): the capture is on every step's critical path.  For the same
            # reason `is_cpu`, not `device.type` (measured inside the engine at batch 1: ~2.5 us vs ~19 us
            # for the device and dtype checks), and no `detach()` where the logits need none (9 vs 16 us)
            argmax = (logits.detach() if logits.requires_grad else logits).numpy().argmax(axis=-1)
            if verdict:
                self._verdict = greedy_verify.sampler_output(argmax, spec_decode_metadata)
            if drafter_skips_argmax:
                argmax = None  # computed for the verdict only
        elif not drafter_skips_argmax:
            argmax = logits.argmax(dim=-1)
            if cfg.layout == "2d":
                self._step2d = lade2d.verify_step(logits, argmax, spec_decode_metadata)
            if argmax.device.type != "cpu":
                host = torch.empty(argmax.shape, dtype=argmax.dtype, device="cpu", pin_memory=True)
                host.copy_(argmax, non_blocking=True)  # read in propose(), after vLLM's bookkeeping sync
                argmax = host
        self._captured = (list(runner.input_batch.req_ids), argmax, list(spec_decode_metadata.num_draft_tokens))

    def take_verdict(self) -> Any:
        """The ``SamplerOutput`` of the step just captured when it was verified from the argmax
        (``greedy_verify``); None: vLLM's rejection sampler verifies it (called by runner_patch)."""
        verdict, self._verdict = self._verdict, None
        return verdict

    # Called by runner_patch inside GPUModelRunner._sample, after vLLM's own sampler.
    def finish_verification(self, runner: Any, sampler_output: Any) -> None:
        if self._step2d is None:
            return
        t0 = time.perf_counter()
        try:
            lade2d.apply_verification(self._step2d, sampler_output)
        finally:
            PROFILE.seconds += time.perf_counter() - t0

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None, **_: Any) -> list[list[int]]:
        t0 = time.perf_counter()
        try:
            return self._propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        finally:
            PROFILE.seconds += time.perf_counter() - t0
            PROFILE.calls += 1
            PROFILE.rows += len(sampled_token_ids)

    def _propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                 token_ids_cpu: np.ndarray) -> list[list[int]]:
        runner = self._runner
        if runner is None:  # the runner hook never ran: draft nothing rather than guess row identities
            if not self._warned:
                logger.warning("vllm-lookahead: runner hook not active; proposing no drafts")
                self._warned = True
            return [[] for _ in sampled_token_ids]
        batch = runner.input_batch
        req_ids = batch.req_ids
        captured = self._captured
        self._captured = None
        n = len(sampled_token_ids)
        if self.config.layout != "2d":
            return self._propose_arrays(runner, req_ids[:n], captured, sampled_token_ids, num_tokens_no_spec,
                                        token_ids_cpu)
        step2d, self._step2d = self._step2d, None
        ran_2d = {req.req_id: req for req in step2d.requests} if step2d is not None else {}
        if ran_2d and captured is not None:  # a 2D step's rows are not a chain: no chain draft was verified
            captured = (captured[0], captured[1], [0 if rid in ran_2d else nd for rid, nd in zip(captured[0], captured[2])])
        drafts = self._propose_arrays(runner, req_ids[:n], captured, sampled_token_ids, num_tokens_no_spec,
                                      token_ids_cpu)
        num_tokens = np.asarray(num_tokens_no_spec[:n]).tolist()
        prompt_lens = np.asarray(batch.num_prompt_tokens[:n]).tolist()
        rows = [RowStep(req_ids[i], token_ids_cpu[i], num_tokens[i], list(new), 0, prompt_lens[i])
                for i, new in enumerate(sampled_token_ids)]
        # a 2D step's rows below are a layout the verifier reads as a whole, never cut
        self._lade_drafts(runner, rows, drafts, ran_2d)
        # Never more than k per row: longer drafts crash vLLM's spec-decode metrics (IndexError).
        return [d[: self.k] for d in drafts]

    def _propose_arrays(self, runner: Any, req_ids: list[str], captured: tuple[list[str], Any, list[int]] | None,
                        sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                        token_ids_cpu: np.ndarray) -> list[list[int]]:
        """A batch-path step (``LookaheadDrafter.step_arrays``): the runner's arrays as they are, no
        per-row objects.  Verified draft counts come from the step's spec-decode metadata, in the
        captured row order (the same as now unless the batch was reordered in between: then by id)."""
        if captured is None:
            verified = [0] * len(req_ids)
        elif captured[0] == req_ids:
            verified = captured[2]
        else:
            by_id = dict(zip(captured[0], captured[2]))
            verified = [by_id.get(rid, 0) for rid in req_ids]
        self._step2d = None
        requests = runner.requests
        prompt_lens = runner.input_batch.num_prompt_tokens
        room = draft_room(requests, req_ids, np.asarray(num_tokens_no_spec[: len(req_ids)]).tolist(),
                          np.asarray(prompt_lens[: len(req_ids)]).tolist(), self.k)
        return self.drafter.step_arrays(req_ids, token_ids_cpu, num_tokens_no_spec, sampled_token_ids, verified,
                                        prompt_lens, lambda rid: isolation_key(requests.get(rid)), room)

    def _lade_drafts(self, runner: Any, rows: list[RowStep], drafts: list[list[int]],
                     ran_2d: dict[str, lade2d.FlaggedRequest]) -> None:
        """Replace the chain drafts of eligible requests by their 2D step's rows (``lade2d``)."""
        cfg = self.config
        if self._lade_ok is None:
            self._lade_ok, why = lade2d.check_engine(runner)
            if not self._lade_ok:
                logger.warning("vllm-lookahead: layout=2d disabled, chain layout used instead: %s", why)
        live = {row.req_id for row in rows}
        for rid in [r for r in self.lade if r not in live]:  # finished or preempted
            del self.lade[rid]
        use = bool(self._lade_ok) and len(rows) <= cfg.lade.max_batch
        layout = self._choose_layout(rows, use)
        if layout == "off":  # the arbiter measured that no draft pays at this batch size
            drafts[:] = [[] for _ in drafts]
        for i, row in enumerate(rows):
            st = self.lade.get(row.req_id)
            done = ran_2d.get(row.req_id)
            if st is not None and done is not None:
                st.absorb(done.plan, done.argmax, done.matched)
            if layout != "2d" or not row.new_tokens:
                continue
            req = runner.requests.get(row.req_id)
            sp = getattr(req, "sampling_params", None)
            if not lade2d.eligible(sp):
                continue
            if st is None:
                st = self.lade[row.req_id] = LadeState(*self._lade_shape(sp), seed=cfg.lade.seed)
            st.observe(row.context, row.num_tokens, row.prompt_len)
            current = int(row.context[row.num_tokens - 1])
            plan = st.plan(current, row.num_tokens - 1, self._extra_candidates(row, current))
            if 0 < len(plan.drafts) <= self.k:
                lade2d.PENDING[row.req_id] = plan
                drafts[i] = plan.drafts

    def _extra_candidates(self, row: RowStep, current: int) -> list[list[int]]:
        """2D candidates beyond LADE's pool, if configured: a confident context match (prompt lookup over the
        request's committed tokens)."""
        lade = self.config.lade
        if not lade.context_candidate:
            return []
        toks = np.asarray(row.context[: row.num_tokens], dtype=np.int32)
        end, length, _ = load_kernels().suffix_match_evidence(toks, row.num_tokens, self.config.min_match,
                                                              self.config.max_match)
        if end < 0 or length < lade.context_min_match:
            return []
        return [toks[end : end + lade.context_candidate].tolist()]

    def _choose_layout(self, rows: list[RowStep], possible: bool) -> str:
        """2D, chain or off for the next step (2D engines only): with lade.policy "measure" the
        arbiter of this batch size decides, fed with the step just done; "always": 2D when possible."""
        now = time.perf_counter()
        last, self._last_layout = self._last_layout, None
        if last is not None:
            self.arbiters[last[1]].observe(last[0], sum(len(r.new_tokens) for r in rows), now - last[2])
        if self.config.lade.policy == "always":
            return "2d" if possible else "chain"
        key = (len(rows), possible)
        arbiter = self.arbiters.get(key)
        if arbiter is None:
            arbiter = self.arbiters[key] = ThroughputArbiter(("chain", "2d", "off") if possible else ("chain", "off"))
        layout = arbiter.choose()
        self._last_layout = (layout, key, now)
        return layout

    def _lade_shape(self, sampling_params: Any) -> tuple[int, int, int]:
        """W, N, G for a request: the engine's, or smaller ones the client asked for in
        ``SamplingParams.extra_args["lookahead"]`` -- keys W/N/G with the one meaning of
        ``core.config.ALIASES`` (or their long names), clamped to the declared lower bound
        (``core.config.LADE_LIMITS``) and capped at the engine's values."""
        keys = ("window", "ngram", "candidates")
        shape = [getattr(self.config.lade, k) for k in keys]
        asked = (getattr(sampling_params, "extra_args", None) or {}).get("lookahead") or {}
        if isinstance(asked, dict):
            asked = {ALIASES.get(k, k): v for k, v in asked.items()}
            for j, key in enumerate(keys):
                v = asked.get(key)
                if isinstance(v, int) and not isinstance(v, bool):
                    shape[j] = min(max(v, int(LADE_LIMITS[key][0])), shape[j])
        return shape[0], shape[1], shape[2]
