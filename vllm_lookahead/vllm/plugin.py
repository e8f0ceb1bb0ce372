"""The ``vllm.general_plugins`` entry point.

vLLM calls ``register()`` in every process it creates (API server / LLM frontend, EngineCore, each
worker), possibly more than once, so it must be cheap and re-entrant.  Installing the package changes
nothing by itself: each half switches on only when configured.
  * frontend half (telemetry: OTel spans/metrics, output sampler) -- vllm_lookahead.telemetry
  * worker half (runner hook for lookahead) -- installed by the proposer module when vLLM loads it.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("vllm_lookahead")
_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    from .version import check_vllm_version

    # An exception here aborts vLLM's start-up on purpose: a wrong vLLM version must not run silently.
    check_vllm_version()
    from .compat import install_compat_patches

    install_compat_patches()
    try:
        from vllm_lookahead.telemetry.frontend import install_if_configured
    except ImportError:  # telemetry half not built yet
        return
    install_if_configured()
