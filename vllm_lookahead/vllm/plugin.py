"""The ``vllm.general_plugins`` entry point: inert unless telemetry is on.

vLLM calls ``register()`` in every process it creates (API server / ``LLM`` frontend, EngineCore, each
worker), in every environment the package is installed in, whatever the model and config.  So it
imports nothing of vLLM, checks no version and patches nothing unless asked.  How each half of the
plugin knows it was asked, per process type:

* lookahead (worker half) -- not here at all.  vLLM imports ``speculative_config.model`` =
  ``vllm_lookahead.LookaheadProposer`` inside the worker only when an engine is configured with it
  (``custom_class_proposer.create_custom_proposer``); ``LookaheadProposer.__init__`` then checks the
  vLLM version and applies its worker patches (``runner_sample``, ``plain_steps``, ...,
  the CPU expand fix when its probe finds the kernel broken).
* lookahead (engine half) -- only in the EngineCore process of an engine that drafts with a proposer of
  this package on the multiprocess executor: ``register()`` is called from ``EngineCore.__init__``, whose
  ``vllm_config`` it reads (``_engine_config``), and installs ``draft_reply``'s engine patches (a step's
  drafts come back with its sampled tokens: one RPC per step less).  Any other engine: nothing.
* engine fixes -- in every engine of a ``vllm-lookahead serve`` server, with or without speculation
  (``VLLM_LOOKAHEAD_ENGINE_FIXES=1``, set by ``serve.py`` and inherited by the processes vLLM spawns): in
  EngineCore and worker processes, the seeded chunked-prefill fix when the device's generators need it
  (``fixes.py``, fix 4), so that a plain server of ours serves every seeded request lookahead's does.
* telemetry (frontend half) -- on when ``VLLM_LOOKAHEAD_TELEMETRY=1`` (environment, inherited by every
  process vLLM spawns); only the frontend process installs hooks (``telemetry.frontend``: EngineCore and
  workers are recognised by vLLM's process names), after the version check.
Anything else: ``register()`` routes this package's log records to vLLM's handlers, looks at up to four stack
frames and two environment variables, and returns (tested: no patch applied, patched functions
identical, also with a vLLM version outside the supported range).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

logger = logging.getLogger("vllm_lookahead")
_registered = False

TELEMETRY_ENV = "VLLM_LOOKAHEAD_TELEMETRY"
ENGINE_FIXES_ENV = "VLLM_LOOKAHEAD_ENGINE_FIXES"


def telemetry_requested(env: dict[str, str] | None = None) -> bool:
    """Set to anything but an explicit "off" value: the telemetry config then validates it (a typo
    such as ``VLLM_LOOKAHEAD_TELEMETRY=maybe`` fails start-up instead of silently meaning off)."""
    value = (os.environ if env is None else env).get(TELEMETRY_ENV, "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


def _engine_config() -> Any:
    """The ``VllmConfig`` of the engine whose ``EngineCore.__init__`` is loading the plugins right now
    (vLLM 0.32 calls ``load_general_plugins()`` there, and ``register()`` from it), else None.  Why a
    frame: ``register()`` takes no arguments, and the EngineCore is a spawned process that inherits
    nothing from the frontend's configuration but this object."""
    frame = sys._getframe(1)
    for _ in range(4):
        frame = frame.f_back if frame is not None else None
        if frame is None:
            return None
        if frame.f_code.co_name == "__init__":
            config = frame.f_locals.get("vllm_config")
            if type(config).__name__ == "VllmConfig":
                return config
    return None


def log_through_vllm() -> None:
    """Send this package's log records (``vllm_lookahead``) to vLLM's handlers at vLLM's level, so that
    what the plugin finds and applies in each process (version, fixes, patches) appears in the server's
    log beside vLLM's own lines.  Only our logger is touched, once."""
    ours, theirs = logging.getLogger("vllm_lookahead"), logging.getLogger("vllm")
    if ours.handlers or not theirs.handlers:
        return
    for handler in theirs.handlers:
        ours.addHandler(handler)
    ours.setLevel(theirs.level)
    ours.propagate = False


def _apply_engine_fixes() -> None:
    """The worker-side fixes every engine of ``vllm-lookahead serve`` gets (a lookahead engine's proposer
    applies them too; applying twice is a no-op).  Only in EngineCore / worker processes: the frontend
    runs no model."""
    from vllm_lookahead.vllm.processes import is_frontend_process

    if is_frontend_process():
        return
    from vllm.platforms import current_platform

    from vllm_lookahead.vllm.fixes import fix_seeded_chunked_prefill_if_broken

    logger.info("vllm-lookahead: %s", fix_seeded_chunked_prefill_if_broken(current_platform.device_type))


def register() -> None:
    global _registered
    if _registered:
        return
    log_through_vllm()
    if os.environ.get(ENGINE_FIXES_ENV) == "1":
        _apply_engine_fixes()
    config = _engine_config()
    if config is not None:
        from vllm_lookahead.vllm import draft_reply

        if draft_reply.applies(config):
            from vllm_lookahead.vllm.version import check_vllm_version

            check_vllm_version()  # (outside the range the worker refuses the engine with this same error)
            draft_reply.install_engine()
            logger.info("vllm-lookahead: drafts return with the sampled tokens (draft_reply: one RPC per step less)")
    if not telemetry_requested():
        return
    _registered = True
    # An exception here aborts vLLM's start-up on purpose: telemetry that was asked for and cannot run
    # (bad configuration, unsupported vLLM) must not be silently off.
    from vllm_lookahead.telemetry.frontend import install_if_configured

    install_if_configured()
