"""Frontend hooks into vLLM for request telemetry (every patch names what it relies on; applied through
``patches`` and listed in ``compat.USES``; written against 0.32, 0.33 checked statically).

Read from vllm 0.32.0 (``vllm/v1/engine/output_processor.py``, ``async_llm.py``, ``llm_engine.py``).
All wrappers call the original first or last and never let a telemetry error escape.  Patches:

1. ``AsyncLLM.__init__`` / ``LLMEngine.__init__`` -- the frontend engine objects.  Before the original
   runs (it launches EngineCore with the config), turn on vLLM's per-request spec-decode counters
   (``observability_config.per_request_spec_decode_metrics``, default "none" in 0.32) when speculation
   is configured: they are the only per-request acceptance numbers that reach the frontend.  After
   it, attach the engine's model name and decoder description to its ``output_processor``.
2. ``AsyncLLM.add_request`` -- vLLM drops incoming ``traceparent`` headers when its own tracing
   (``--otlp-traces-endpoint``) is off (async_llm.py, "trace_headers = None").  Keep them in a
   context variable first; ``OutputProcessor.add_request`` runs in the same task and picks them up.
3. ``OutputProcessor.add_request`` -- the only place that sees the full ``SamplingParams``; record
   them, the trace parent and the arrival time on the new ``RequestState``.
4. ``OutputProcessor._update_stats_from_finished`` -- called once per finished request inside
   ``process_outputs`` (after detokenization, with the final finish reason), whether or not stats
   logging is on: the finish hook.
5. ``OutputProcessor.abort_requests`` -- aborted requests leave ``request_states`` without passing
   the finish hook; report them with finish reason "abort".
6. ``OutputProcessor.process_outputs`` -- only when stats logging is off (``vllm.LLM`` default:
   ``RequestState.stats`` is None): note the wall-clock time of each request's first token.
7. ``RequestState.make_request_output`` -- the only call that sees the final ``stop_reason`` (the
   matched stop string, including one the detokenizer found, or the stop token id; a local of
   ``process_outputs`` otherwise); keep it for the finish hook.
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import os
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any

from vllm_lookahead.telemetry.record import Decoder, FinishedRequest

from . import patches
from .version import check_vllm_version

logger = logging.getLogger("vllm_lookahead.telemetry")

_OP = "vllm.v1.engine.output_processor:"
for _name, _target in (("telemetry_AsyncLLM_init", "vllm.v1.engine.async_llm:AsyncLLM.__init__"),
                       ("telemetry_LLMEngine_init", "vllm.v1.engine.llm_engine:LLMEngine.__init__"),
                       ("telemetry_async_add_request", "vllm.v1.engine.async_llm:AsyncLLM.add_request"),
                       ("telemetry_add_request", _OP + "OutputProcessor.add_request"),
                       ("telemetry_finished", _OP + "OutputProcessor._update_stats_from_finished"),
                       ("telemetry_abort", _OP + "OutputProcessor.abort_requests"),
                       ("telemetry_process_outputs", _OP + "OutputProcessor.process_outputs"),
                       ("telemetry_make_request_output", _OP + "RequestState.make_request_output")):
    patches.declare_target(_name, _target, "request telemetry (module docstring, hooks 1-7)", "frontend")

_ATTR = "_vllm_lookahead"  # attribute holding our per-request / per-engine info
_incoming_trace_headers: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "vllm_lookahead_trace_headers", default=None)
_applied = False
# Ids must be unique across processes and runs: vLLM seeds the global `random` (LLM(seed=0) makes
# every run draw the same "random" ids), so keep a private generator, reseeded after fork.
_rng = random.Random(os.urandom(16))
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _rng.seed(os.urandom(16)))


_process_prefix: tuple[int, str] | None = None


def process_id_prefix() -> str:
    """``llm-<16 hex>-``: random per process (new after fork).  ``vllm.LLM`` numbers its requests
    "0", "1", ... in every process, so two offline jobs writing to one topic would send the same
    ids and the sidecar's de-duplication would drop one job's samples; the prefix makes them unique."""
    global _process_prefix
    pid = os.getpid()
    if _process_prefix is None or _process_prefix[0] != pid:
        _process_prefix = (pid, f"llm-{uuid.uuid4().hex[:16]}-")
    return _process_prefix[1]


@dataclass
class EngineInfo:
    model: str
    decoder: Decoder
    # prepended to vLLM's request ids in telemetry; "" where vLLM's ids are already unique (the API
    # server's "cmpl-<uuid>" / "chatcmpl-<uuid>"), process_id_prefix() for LLMEngine (vllm.LLM)
    id_prefix: str = ""


class RequestInfo:
    __slots__ = ("arrival", "first_token", "sampling", "parent", "parent_remote", "trace_id",
                 "stop_reason")

    def __init__(self, arrival: float, sampling: dict[str, Any], parent: Any, parent_remote: bool,
                 trace_id: int):
        self.arrival = arrival
        self.first_token: float | None = None
        self.sampling = sampling
        self.parent = parent
        self.parent_remote = parent_remote
        self.trace_id = trace_id
        self.stop_reason: Any = None


# ---- what we read from vLLM objects --------------------------------------------------------------
def lookahead_params(vllm_config: Any) -> dict[str, Any]:
    """The engine's lookahead settings as the proposer reads them: the one validated reader
    (``LookaheadConfig.from_sources``: additional_config, else $VLLM_LOOKAHEAD_CONFIG), reported as
    canonical names of the values that differ from the defaults.  An invalid config (the worker will
    refuse to start) is reported as such rather than re-parsed a second way."""
    from vllm_lookahead.core.config import LookaheadConfig, LookaheadConfigError

    try:
        return LookaheadConfig.from_sources(getattr(vllm_config, "additional_config", None)).overrides()
    except (LookaheadConfigError, TypeError) as e:
        return {"invalid_config": str(e)}


def serving_dtype(vllm_config: Any) -> str | None:
    """The model's compute dtype ("bfloat16", "float32", ...), read once per engine from its model
    config: the sidecar refuses to compare greedy outputs across dtypes (bf16 rounds differently)."""
    dtype = getattr(getattr(vllm_config, "model_config", None), "dtype", None)
    return None if dtype is None else str(dtype).removeprefix("torch.")


def describe_decoder(vllm_config: Any) -> Decoder:
    """``method``, ``params`` and the serving dtype as reported in telemetry (docs/CONTRACTS.md)."""
    from vllm import __version__ as vllm_version

    from vllm_lookahead import __version__ as plugin_version

    dtype = serving_dtype(vllm_config)
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None:
        return Decoder("none", {}, plugin_version, vllm_version, dtype, seeded_exact=True)
    method = str(getattr(spec, "method", None) or "unknown")
    k = int(getattr(spec, "num_speculative_tokens", 0) or 0)
    params: dict[str, Any] = {"k": k}
    if method == "custom_class" and "vllm_lookahead" in str(getattr(spec, "model", "")):
        method = "lookahead"
        params.update(lookahead_params(vllm_config))
    elif method == "ngram":
        params["prompt_lookup_min"] = getattr(spec, "prompt_lookup_min", None)
        params["prompt_lookup_max"] = getattr(spec, "prompt_lookup_max", None)
    return Decoder(method, params, plugin_version, vllm_version, dtype, seeded_exact=seeded_exact(method, dtype))


def seeded_exact(method: str, dtype: str | None) -> bool:
    """Does a seeded T>0 request give the tokens it gives without speculation (schema 1.5
    ``decoder.seeded_exact``)?  Lookahead's coupled verification makes it so on CPU with float32 logits
    (docs/lookahead.md, "What is guaranteed where"; on CUDA it follows vLLM's native rule but no GPU
    has checked token identity, so it is not claimed there); vLLM's rejection sampler (every other method, and
    lookahead elsewhere) draws a different number of times, so a seeded output differs without a fault."""
    if method != "lookahead" or dtype != "float32":
        return False
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def engine_info(vllm_config: Any, id_prefix: str = "") -> EngineInfo:
    mc = vllm_config.model_config
    name = getattr(mc, "served_model_name", None) or getattr(mc, "model", "unknown")
    if isinstance(name, (list, tuple)):
        name = name[0] if name else "unknown"
    return EngineInfo(model=str(name), decoder=describe_decoder(vllm_config), id_prefix=id_prefix)


def sampling_dict(sp: Any) -> dict[str, Any]:
    if sp is None:
        return {}
    out: dict[str, Any] = {
        "temperature": sp.temperature, "top_p": sp.top_p,
        "top_k": sp.top_k if sp.top_k and sp.top_k > 0 else None,
        "seed": sp.seed, "max_tokens": sp.max_tokens, "n": sp.n,
    }
    if sp.frequency_penalty:
        out["frequency_penalty"] = sp.frequency_penalty
    if sp.presence_penalty:
        out["presence_penalty"] = sp.presence_penalty
    # The sidecar's T>0 conformance test rebuilds the sampler's distribution from these: min-p and
    # any logit modifier must be recorded (a modified distribution is then skipped, not misjudged).
    if getattr(sp, "min_p", 0.0):
        out["min_p"] = sp.min_p
    if getattr(sp, "min_tokens", 0):  # EOS masked until then: T>0 conformance leaves the sample out
        out["min_tokens"] = sp.min_tokens
    if getattr(sp, "repetition_penalty", 1.0) not in (None, 1.0):
        out["repetition_penalty"] = sp.repetition_penalty
    if any(getattr(sp, k, None) for k in ("logit_bias", "allowed_token_ids", "bad_words", "logits_processors")):
        out["logits_modified"] = True
    # The sidecar's exact checks (no token outside allowed_token_ids, no bad word in the output) need
    # the sets themselves.  References only, on the request path: ``record.exact_check_fields`` sorts,
    # caps and hashes them on the sampler thread.  The bad words' token ids are vLLM's own, built by
    # its input processor (``SamplingParams.update_from_tokenizer``) before this hook runs; without a
    # tokenizer there are none, and the strings are recorded instead (the sidecar does not guess).
    if getattr(sp, "allowed_token_ids", None):
        out["allowed_token_ids"] = sp.allowed_token_ids
    bad_ids = getattr(sp, "bad_words_token_ids", None)
    if bad_ids:
        out["bad_words_token_ids"] = bad_ids
    elif getattr(sp, "bad_words", None):
        out["bad_words"] = sp.bad_words
    so = getattr(sp, "structured_outputs", None)
    if so is not None:
        fmt = {k: v for k, v in vars(so).items() if v not in (None, False) and not k.startswith("_")} \
            if hasattr(so, "__dict__") else {"spec": str(so)}
        out["response_format"] = json.loads(json.dumps(fmt, default=str)) if fmt else None
    return out


def operation_name(external_id: str) -> str:
    """GenAI ``gen_ai.operation.name`` from vLLM's id prefixes (chat: "chatcmpl-", completions
    "cmpl-"); ``vllm.LLM`` ids are bare counters and count as text completion."""
    return "chat" if external_id.startswith("chatcmpl") else "text_completion"


_propagator: Any = None


def _parent_from(headers: Any) -> tuple[Any, bool, int]:
    """(OTel context, is remote, trace id) from the current OTel context, else from trace headers."""
    global _propagator
    from opentelemetry import trace

    if _propagator is None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        _propagator = TraceContextTextMapPropagator()
    current = trace.get_current_span().get_span_context()
    if current.is_valid:  # e.g. opentelemetry-instrument's FastAPI span, or the caller of LLM.generate
        from opentelemetry import context as otel_context
        return otel_context.get_current(), False, current.trace_id
    if headers:
        ctx = _propagator.extract(dict(headers))
        sc = trace.get_current_span(ctx).get_span_context()
        if sc.is_valid:
            return ctx, True, sc.trace_id
    return None, False, 0


def finished_request(state: Any, info: EngineInfo, finish_reason: str | None,
                     stop_reason: Any = None, now: float | None = None) -> FinishedRequest:
    """Snapshot of a finished ``RequestState`` (references only; cheap).  ``stop_reason`` defaults
    to the one the ``make_request_output`` hook kept on the state."""
    now = time.time() if now is None else now
    req_info: RequestInfo | None = getattr(state, _ATTR, None)
    stats = state.stats
    det = state.detokenizer
    out_ids = det.output_token_ids if det is not None else None
    arrival = stats.arrival_time if stats is not None else (req_info.arrival if req_info else now)
    first_token = None
    queue_s = tpot = None
    if stats is not None:
        if stats.first_token_latency > 0:
            first_token = arrival + stats.first_token_latency
        if stats.scheduled_ts > 0 and stats.queued_ts > 0:
            queue_s = stats.scheduled_ts - stats.queued_ts
        n = stats.num_generation_tokens
        if n > 1 and stats.last_token_ts > stats.first_token_ts > 0:
            tpot = (stats.last_token_ts - stats.first_token_ts) / (n - 1)
    elif req_info is not None:
        first_token = req_info.first_token
    external = state.external_req_id
    choice_index = None
    if state.parent_req is not None:  # one of n > 1 choices: each is reported on its own
        choice_index = state.request_index
        external = f"{external}#{choice_index}"
    if stop_reason is None and req_info is not None:
        stop_reason = req_info.stop_reason
    trace_id = req_info.trace_id if req_info is not None else 0
    return FinishedRequest(
        request_id=info.id_prefix + external,
        engine_request_id=external if info.id_prefix else None,
        choice_index=choice_index,
        model=state.lora_name or info.model,
        operation=operation_name(state.external_req_id),
        decoder=info.decoder,
        arrival_unix_s=arrival,
        finish_unix_s=now,
        finish_reason=finish_reason,
        prompt=state.prompt,
        prompt_token_ids=state.prompt_token_ids,
        output_text=getattr(det, "output_text", None),
        output_token_ids=out_ids,
        num_prompt_tokens=state.prompt_len or 0,
        num_output_tokens=len(out_ids) if out_ids is not None else 0,
        num_cached_tokens=state.num_cached_tokens or 0,
        first_token_unix_s=first_token,
        queue_s=queue_s,
        tpot_s=tpot,
        sampling=req_info.sampling if req_info is not None else {},
        spec=state.spec_decode_metrics,
        stop_reason=stop_reason,
        trace_id=trace_id or _rng.getrandbits(128) or 1,
        span_id=_rng.getrandbits(64) or 1,
        parent=req_info.parent if req_info is not None else None,
        parent_is_remote=req_info.parent_remote if req_info is not None else False,
        error={"type": "error", "message": "request failed in the engine"}
        if finish_reason == "error" else None,
    )


# ---- the patches -----------------------------------------------------------------------------------
def apply(telemetry: Any) -> None:
    """Install the hooks once per process (re-entrant)."""
    global _applied
    if _applied:
        return
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.engine.output_processor import OutputProcessor

    check_vllm_version()  # the supported range (package metadata); telemetry is a use of the plugin
    cfg = telemetry.config

    def _wrap_engine_init(cls: type, unique_ids: bool) -> None:
        orig = cls.__init__

        @functools.wraps(orig)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            vllm_config = kwargs.get("vllm_config", args[0] if args else None)
            try:
                obs = vllm_config.observability_config
                if (vllm_config.speculative_config is not None and cfg.spec_metrics != "none"
                        and obs.per_request_spec_decode_metrics == "none"):
                    obs.per_request_spec_decode_metrics = cfg.spec_metrics
            except Exception:  # noqa: BLE001
                logger.warning("could not enable per-request spec-decode metrics", exc_info=True)
            orig(self, *args, **kwargs)
            try:
                setattr(self.output_processor, _ATTR,
                        engine_info(vllm_config, process_id_prefix() if not unique_ids else ""))
            except Exception:  # noqa: BLE001
                logger.warning("telemetry: could not describe the engine", exc_info=True)

        patches.apply(f"telemetry_{cls.__name__}_init", lambda _orig: __init__)

    _wrap_engine_init(AsyncLLM, unique_ids=True)  # API server ids: "cmpl-<uuid>", "chatcmpl-<uuid>"
    _wrap_engine_init(LLMEngine, unique_ids=False)  # vllm.LLM ids: "0", "1", ... in every process

    # 2. keep incoming trace headers that vLLM would drop
    orig_async_add = AsyncLLM.add_request
    import inspect
    th_index = list(inspect.signature(orig_async_add).parameters).index("trace_headers")

    @functools.wraps(orig_async_add)
    async def add_request(self: Any, *args: Any, **kwargs: Any) -> Any:
        headers = kwargs.get("trace_headers")
        if headers is None and len(args) >= th_index:
            headers = args[th_index - 1]
        token = _incoming_trace_headers.set(headers)
        try:
            return await orig_async_add(self, *args, **kwargs)
        finally:
            _incoming_trace_headers.reset(token)

    patches.apply("telemetry_async_add_request", lambda _orig: add_request)

    # 3. sampling params, trace parent, arrival
    orig_add = OutputProcessor.add_request

    @functools.wraps(orig_add)
    def op_add_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> None:
        is_new = request.request_id not in self.request_states
        orig_add(self, request, *args, **kwargs)
        if not is_new:
            return
        try:
            state = self.request_states.get(request.request_id)
            if state is None:
                return
            headers = request.trace_headers or _incoming_trace_headers.get()
            parent, remote, trace_id = _parent_from(headers) if telemetry.wants_trace_ids or headers \
                else (None, False, 0)
            sampling = sampling_dict(request.sampling_params)
            parent_req = getattr(state, "parent_req", None)
            if parent_req is not None and sampling:
                # a child of an n > 1 request carries n=1 (ParentRequest._get_child_sampling_params);
                # report what the client asked for
                sampling["n"] = parent_req.n
            setattr(state, _ATTR, RequestInfo(request.arrival_time or time.time(), sampling,
                                              parent, remote, trace_id))
        except Exception:  # noqa: BLE001
            logger.debug("telemetry add_request hook failed", exc_info=True)

    patches.apply("telemetry_add_request", lambda _orig: op_add_request)

    # 4. the finish hook
    orig_finished = OutputProcessor._update_stats_from_finished

    @functools.wraps(orig_finished)
    def _update_stats_from_finished(self: Any, req_state: Any, finish_reason: Any,
                                    iteration_stats: Any) -> None:
        orig_finished(self, req_state, finish_reason, iteration_stats)
        info = getattr(self, _ATTR, None)
        if info is None:
            return
        try:
            reason = str(finish_reason) if finish_reason is not None else None
            telemetry.on_finished(finished_request(req_state, info, reason))
        except Exception:  # noqa: BLE001
            logger.debug("telemetry finish hook failed", exc_info=True)

    patches.apply("telemetry_finished", lambda _orig: _update_stats_from_finished)

    # 5. aborts
    orig_abort = OutputProcessor.abort_requests

    @functools.wraps(orig_abort)
    def abort_requests(self: Any, request_ids: Any, internal: bool) -> list[str]:
        before = dict(self.request_states) if getattr(self, _ATTR, None) is not None else None
        aborted = orig_abort(self, request_ids, internal)
        if before:
            try:
                info = getattr(self, _ATTR)
                now = time.time()
                for rid in aborted:
                    state = before.get(rid)
                    if state is not None:
                        telemetry.on_finished(finished_request(state, info, "abort", now=now))
            except Exception:  # noqa: BLE001
                logger.debug("telemetry abort hook failed", exc_info=True)
        return aborted

    patches.apply("telemetry_abort", lambda _orig: abort_requests)

    # 6. first-token time when vLLM keeps no stats
    orig_process = OutputProcessor.process_outputs

    @functools.wraps(orig_process)
    def process_outputs(self: Any, engine_core_outputs: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.log_stats:
            try:
                now = time.time()
                states = self.request_states
                for out in engine_core_outputs:
                    state = states.get(out.request_id)
                    if state is not None and out.new_token_ids:
                        ri = getattr(state, _ATTR, None)
                        if ri is not None and ri.first_token is None:
                            ri.first_token = now
            except Exception:  # noqa: BLE001
                pass
        return orig_process(self, engine_core_outputs, *args, **kwargs)

    patches.apply("telemetry_process_outputs", lambda _orig: process_outputs)

    # 7. the final stop reason (stop string or stop token id)
    from vllm.v1.engine.output_processor import RequestState

    orig_make_output = RequestState.make_request_output

    @functools.wraps(orig_make_output)
    def make_request_output(self: Any, new_token_ids: Any, pooling_output: Any, finish_reason: Any,
                            stop_reason: Any, *args: Any, **kwargs: Any) -> Any:
        if finish_reason is not None and stop_reason is not None:
            ri = getattr(self, _ATTR, None)
            if ri is not None:
                ri.stop_reason = stop_reason
        return orig_make_output(self, new_token_ids, pooling_output, finish_reason, stop_reason,
                                *args, **kwargs)

    patches.apply("telemetry_make_request_output", lambda _orig: make_request_output)
    _applied = True
