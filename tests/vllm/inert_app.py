"""Run by tests/vllm/test_plugin_inert.py in a fresh interpreter: start a real in-process vLLM engine in
an environment where vllm-lookahead is installed (its entry point is registered) and print what the
plugin changed, as JSON.

argv: MODEL FAKE_VERSION SPEC
  FAKE_VERSION -- "" keeps the real version; otherwise ``vllm.__version__`` is set to it before any
                  engine starts.  This SIMULATES a vLLM outside the supported range: ``vllm.__version__``
                  is the version source ``version.check_vllm_version`` reads (installing another vLLM
                  is not possible on this machine).  vLLM itself does not read ``__version__`` to run.
  SPEC         -- "none" (plugin installed, not configured) or "lookahead" (configured, k=2).
"""

from __future__ import annotations

import json
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.pop("VLLM_LOOKAHEAD_TELEMETRY", None)
os.environ.pop("VLLM_LOOKAHEAD_CONFIG", None)


def snapshot(patches) -> dict[str, object]:
    out: dict[str, object] = {}
    for name in patches.PATCHES:
        try:
            out[name] = patches.current(name)
        except AttributeError:  # e.g. the CPU kernel override does not exist before an engine starts
            out[name] = None
    return out


def main() -> None:
    model, fake_version, spec = sys.argv[1:4]
    import vllm

    if fake_version:
        vllm.__version__ = fake_version
    from vllm import LLM, SamplingParams

    from vllm_lookahead.vllm import patches

    patches.load_all()  # declaring applies nothing; it makes the registry complete for the identity check
    before = snapshot(patches)
    kwargs = dict(model=model, dtype="float32", max_model_len=256, max_num_seqs=4, enforce_eager=True,
                  distributed_executor_backend="uni")
    if spec == "lookahead":
        kwargs["speculative_config"] = {"model": "vllm_lookahead.LookaheadProposer", "num_speculative_tokens": 2}
    try:
        llm = LLM(**kwargs)
    except Exception as e:  # noqa: BLE001 (reported to the test)
        print("RESULT " + json.dumps({"started": False, "error": f"{type(e).__name__}: {e}"[-600:]}))
        return
    out = llm.generate(["def add(a, b):"], SamplingParams(max_tokens=8, temperature=0.0))
    after = snapshot(patches)
    from vllm.utils import cpu_triton_utils
    from vllm.v1.sample import rejection_sampler as rs

    print("RESULT " + json.dumps({
        "started": True,
        "plugin_module_loaded": "vllm_lookahead.vllm.plugin" in sys.modules,
        "telemetry_loaded": "vllm_lookahead.telemetry.frontend" in sys.modules,
        "applied": patches.applied(),
        "changed": sorted(n for n in before if before[n] is not None and before[n] is not after[n]),
        "declared": sorted(patches.PATCHES),
        "expand_impl_is_vllms": getattr(rs.expand_kernel, "_impl", None) is cpu_triton_utils._expand_kernel_impl,
        "tokens": len(out[0].outputs[0].token_ids),
        "vllm_version": vllm.__version__,
    }))


if __name__ == "__main__":
    main()
