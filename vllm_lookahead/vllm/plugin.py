"""The ``vllm.general_plugins`` entry point: inert unless telemetry is on.

vLLM calls ``register()`` in every process it creates (API server / ``LLM`` frontend, EngineCore, each
worker), in every environment the package is installed in, whatever the model and config.  So it
imports nothing of vLLM, checks no version and patches nothing unless asked.  How each half of the
plugin knows it was asked, per process type:

* lookahead (worker half) -- not here at all.  vLLM imports ``speculative_config.model`` =
  ``vllm_lookahead.LookaheadProposer`` inside the worker only when an engine is configured with it
  (``custom_class_proposer.create_custom_proposer``); ``LookaheadProposer.__init__`` then checks the
  vLLM version and applies its worker patches (``runner_sample``, the 2D hooks when ``layout="2d"``,
  the CPU expand fix when its probe finds the kernel broken).  Frontend and EngineCore need nothing.
* telemetry (frontend half) -- on when ``VLLM_LOOKAHEAD_TELEMETRY=1`` (environment, inherited by every
  process vLLM spawns); only the frontend process installs hooks (``telemetry.frontend``: EngineCore and
  workers are recognised by vLLM's process names), after the version check.
Anything else: ``register()`` returns after one environment lookup (tested: no patch applied, patched
functions identical, also with a vLLM version outside the supported range).
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("vllm_lookahead")
_registered = False

TELEMETRY_ENV = "VLLM_LOOKAHEAD_TELEMETRY"


def telemetry_requested(env: dict[str, str] | None = None) -> bool:
    """Set to anything but an explicit "off" value: the telemetry config then validates it (a typo
    such as ``VLLM_LOOKAHEAD_TELEMETRY=maybe`` fails start-up instead of silently meaning off)."""
    value = (os.environ if env is None else env).get(TELEMETRY_ENV, "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


def register() -> None:
    global _registered
    if _registered or not telemetry_requested():
        return
    _registered = True
    # An exception here aborts vLLM's start-up on purpose: telemetry that was asked for and cannot run
    # (bad configuration, unsupported vLLM) must not be silently off.
    from vllm_lookahead.telemetry.frontend import install_if_configured

    install_if_configured()
