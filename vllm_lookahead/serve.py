"""``vllm-lookahead serve MODEL [vllm serve options]``: vLLM's own ``vllm serve``, made to run here.

It is vLLM's CLI (``vllm.entrypoints.cli.main``) with five differences, the first two needed for what
the README promises:

* it runs with the CPU wheel, whose ``vllm`` console script fails at start-up (``vllm/serve_patch.py``
  says where and why); on a CUDA install nothing is patched and it is exactly ``vllm serve``;
* ``--dtype`` defaults to ``float32`` when not given: the lossless claim "T=0 output equals no
  speculation token for token" is measured in float32.  In bfloat16, verifying k draft tokens in one
  forward can round differently from decoding them one by one, so outputs may diverge after a few
  tokens -- a property of bf16 batch shapes, not of the drafts (docs/lookahead.md).  Pass
  ``--dtype bfloat16`` (or ``auto``) explicitly for speed;
* on CPU, vLLM's compile cache is one that loads at the next start (``vllm/fixes.py``, fix 3);
* on CPU, a seeded request whose prefill is chunked does not kill the engine, with or without
  speculation (``vllm/fixes.py``, fix 4; applied in the engine's processes by ``vllm/plugin.py``);
* with lookahead's speculative config it accepts ``min_p`` and ``logit_bias``, which vLLM refuses with
  any speculative config, and serves them without drafts (``vllm/sampling_cover.py``).

Any other argument goes to vLLM unchanged; ``vllm-lookahead serve --help`` prints vLLM's help.
"""

from __future__ import annotations

import os
import sys

from vllm_lookahead.vllm.plugin import ENGINE_FIXES_ENV

DEFAULT_DTYPE = "float32"


def with_default_dtype(args: list[str]) -> list[str]:
    """``args`` plus ``--dtype float32`` unless a dtype is given (``--dtype X`` or ``--dtype=X``)."""
    if any(a == "--dtype" or a.startswith("--dtype=") for a in args) or any(a in ("-h", "--help") for a in args):
        return list(args)
    return [*args, "--dtype", DEFAULT_DTYPE]


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[2:] if argv is None else argv)
    from vllm_lookahead.vllm.fixes import use_loadable_compile_cache
    from vllm_lookahead.vllm.sampling_cover import serve_all_sampling_fields
    from vllm_lookahead.vllm.serve_patch import install_cli_version_fix

    install_cli_version_fix()
    os.environ[ENGINE_FIXES_ENV] = "1"  # every engine process of this server: vllm/plugin.py
    serve_all_sampling_fields()  # min_p / logit_bias: 200 as without speculation (vllm/sampling_cover.py)
    use_loadable_compile_cache()  # a restarted server loads its compiled model instead of compiling again
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", "serve", *with_default_dtype(args)]
    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
