"""The vLLM version this plugin patches, and the check that refuses any other.

The patches in this package reach into vLLM's V1 model runner and output processor, which are not
stable interfaces; running them on another minor version could silently break losslessness, so any
other version fails loudly.  ``VLLM_LOOKAHEAD_SKIP_VERSION_CHECK=1`` overrides (at your own risk).
"""

from __future__ import annotations

import os

SUPPORTED_VLLM = "0.32"  # major.minor; matches the `cpu` / `cuda` extras in pyproject.toml


class UnsupportedVLLMVersion(RuntimeError):
    pass


def check_vllm_version(version: str | None = None) -> str:
    """Return the installed vLLM version, or raise UnsupportedVLLMVersion with the fix."""
    if version is None:
        import vllm

        version = vllm.__version__
    if os.environ.get("VLLM_LOOKAHEAD_SKIP_VERSION_CHECK") == "1":
        return version
    major_minor = ".".join(version.split("+")[0].split(".")[:2])
    if major_minor != SUPPORTED_VLLM:
        raise UnsupportedVLLMVersion(
            f"vllm-lookahead patches vLLM {SUPPORTED_VLLM}.x internals but vLLM {version} is installed. "
            f"Install `vllm-lookahead[cpu]` or `[cuda]` (vLLM {SUPPORTED_VLLM}.x), or set "
            "VLLM_LOOKAHEAD_SKIP_VERSION_CHECK=1 to try anyway (losslessness is then unverified)."
        )
    return version
