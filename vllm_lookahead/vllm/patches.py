"""The one patch mechanism: every change this project makes to vLLM's code, declared and recorded here.

Why one mechanism (modelled on ArcticInference's ``ArcticPatch``): before it, each module wrapped vLLM
functions its own way (five idempotence idioms), so nobody could say what a process had changed.  Now:

* each patch is *declared* once in ``PATCHES`` (name, ``module:Owner.attr`` target, why, where it
  runs) by the module that owns its logic, with a ``build(original) -> replacement`` function;
* ``apply(name)`` is the only installer: it resolves the target, builds the replacement from the
  current original and sets it; applying a patch whose replacement is already in place is a no-op;
* ``applied()`` lists what this process has patched, ``original(name)`` returns what was replaced
  and ``revert(name)`` puts it back (tests and scoped patches such as the step counter).

Declaring a patch changes nothing; only ``apply`` does.  A process in which nothing of this project
was asked for (no lookahead proposer, telemetry off) has ``applied() == []`` (tested).
The vLLM symbols these targets name are listed once more, with their expected signatures, in
``compat.USES`` -- checked live on vLLM 0.32 and statically against vLLM 0.33's source.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("vllm_lookahead")


@dataclass(frozen=True)
class Patch:
    name: str
    target: str
    """``"package.module:Owner.attr"`` (or ``"package.module:attr"``): what is replaced."""
    why: str
    scope: str
    """Where it is applied: "worker" (model runner process), "engine" (the scheduler's process: EngineCore),
    "frontend" (API server / LLM process),
    "cli" (the ``vllm-lookahead serve`` process only) or "tool" (our own in-process tools)."""
    build: Callable[[Any], Any] | None
    """``original -> replacement``; None when the replacement is a closure built at apply time
    (``apply(name, build)``: the telemetry hooks close over the process's telemetry object)."""


PATCHES: dict[str, Patch] = {}
_APPLIED: dict[str, tuple[Any, str, Any, Any]] = {}  # name -> (owner, attr, original, replacement)


def declare(name: str, target: str, why: str, scope: str) -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
    """Decorator: register ``build(original) -> replacement`` as patch ``name`` (nothing is applied)."""
    if scope not in ("worker", "engine", "frontend", "cli", "tool"):
        raise ValueError(f"patch {name}: unknown scope {scope!r}")

    def register(build: Callable[[Any], Any] | None) -> Callable[[Any], Any] | None:
        if name in PATCHES and PATCHES[name].target != target:
            raise ValueError(f"patch {name!r} declared twice with different targets")
        PATCHES[name] = Patch(name, target, why, scope, build)
        return build

    return register


def declare_target(name: str, target: str, why: str, scope: str) -> None:
    """Declare a patch whose replacement is passed to ``apply(name, build)`` when applied."""
    declare(name, target, why, scope)(None)  # type: ignore[arg-type]


def resolve(target: str) -> tuple[Any, str]:
    """(owner object, attribute name) of a ``module:Owner.attr`` target (imports the module)."""
    module_name, _, path = target.partition(":")
    owner: Any = importlib.import_module(module_name)
    *parents, attr = path.split(".")
    for part in parents:
        owner = getattr(owner, part)
    return owner, attr


def current(name: str) -> Any:
    """The object now at patch ``name``'s target (for identity checks)."""
    owner, attr = resolve(PATCHES[name].target)
    return getattr(owner, attr)


def apply(name: str, build: Callable[[Any], Any] | None = None) -> bool:
    """Install patch ``name`` (``build`` overrides the declared builder); True if this call changed anything.  Re-applying is a no-op while our
    replacement is in place; if the target object was replaced since (vLLM registered a new CPU kernel
    override for a second in-process engine), the patch is applied to the new one."""
    patch = PATCHES[name]
    owner, attr = resolve(patch.target)
    now = getattr(owner, attr)
    done = _APPLIED.get(name)
    if done is not None and done[0] is owner and _in_chain(done[3], now):
        return False
    builder = build or patch.build
    if builder is None:
        raise ValueError(f"patch {name!r} has no builder: pass one to apply()")
    replacement = builder(now)
    try:
        replacement.__wrapped__ = now
        replacement._vllm_lookahead_patch = name
    except (AttributeError, TypeError):
        pass
    setattr(owner, attr, replacement)
    _APPLIED[name] = (owner, attr, now, replacement)
    logger.debug("vllm-lookahead: patched %s (%s)", patch.target, name)
    return True


def _in_chain(replacement: Any, now: Any) -> bool:
    """Is ``replacement`` the object at the target, or wrapped by what is there (patches stack when
    two target the same function, e.g. the runner hook and a gate fault)?"""
    seen = 0
    while now is not None and seen < 16:
        if now is replacement:
            return True
        now, seen = getattr(now, "__wrapped__", None), seen + 1
    return False


def applied() -> list[str]:
    """Names of the patches in force in this process (those reverted are not listed)."""
    return sorted(n for n, (owner, attr, _, repl) in _APPLIED.items()
                  if _in_chain(repl, getattr(owner, attr, None)))


def original(name: str) -> Any:
    """What patch ``name`` replaced (None if it was never applied in this process)."""
    done = _APPLIED.get(name)
    return None if done is None else done[2]


def revert(name: str) -> bool:
    """Put the original back; True if something was reverted."""
    done = _APPLIED.pop(name, None)
    if done is None:
        return False
    owner, attr, orig, repl = done
    if getattr(owner, attr, None) is repl:
        setattr(owner, attr, orig)
        return True
    return False


# Modules that declare patches (imported by ``load_all`` so that ``PATCHES`` is complete).
DECLARING_MODULES = (
    "vllm_lookahead.vllm.runner_patch",
    "vllm_lookahead.vllm.plain_steps",
    "vllm_lookahead.vllm.draft_reply",
    "vllm_lookahead.vllm.prompt_scores",
    "vllm_lookahead.vllm.fixes",
    "vllm_lookahead.vllm.sampling_cover",
    "vllm_lookahead.vllm.frontend_patch",
    "vllm_lookahead.vllm.spec_steps",
    "vllm_lookahead.vllm.serve_patch",
    "vllm_lookahead.vllm.step_counter",
)


def load_all() -> dict[str, Patch]:
    """Import every declaring module, the opt-in extensions' too (``vllm_lookahead.extensions``;
    declaring applies nothing), and return the registry: those, plus what other code declared through
    ``declare`` (the test-only faults)."""
    from vllm_lookahead.extensions import PACKAGES

    extensions = tuple(m for p in PACKAGES for m in importlib.import_module(p).PATCH_MODULES)
    for module in DECLARING_MODULES + extensions:
        importlib.import_module(module)
    return PATCHES
