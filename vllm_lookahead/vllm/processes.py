"""Which vLLM process this is, from the names vLLM 0.32 gives its processes: the plugin's entry point runs
in all of them and must act only in the right one (the frontend serves requests; EngineCore schedules;
workers run the model).

Names: ``v1/engine/utils.py`` "EngineCore[_DPn]", ``v1/executor/multiproc_executor.py`` "VllmWorker-n",
Ray "DPEngineCoreActor" / "Worker".  A process without multiprocessing (``LLM`` with
``VLLM_ENABLE_V1_MULTIPROCESSING=0``) is all three at once and is named like a frontend.
"""

from __future__ import annotations

import multiprocessing

BACKEND_PROCESS_PREFIXES = ("EngineCore", "VllmWorker", "DPEngineCore", "Worker")
WORKER_PREFIXES = ("VllmWorker", "Worker")


def _name(name: str | None) -> str:
    return multiprocessing.current_process().name if name is None else name


def is_frontend_process(name: str | None = None) -> bool:
    return not _name(name).startswith(BACKEND_PROCESS_PREFIXES)


def is_worker_process(name: str | None = None) -> bool:
    return _name(name).startswith(WORKER_PREFIXES)
