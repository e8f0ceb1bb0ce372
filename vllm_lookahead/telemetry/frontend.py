"""The plugin's frontend half: install the hooks in the process that serves requests, and fan each
finished request out to the OTel thread and the sampler.

``install_if_configured()`` is called by ``vllm_lookahead.vllm.plugin.register()`` in *every* vLLM
process.  It does nothing unless ``VLLM_LOOKAHEAD_TELEMETRY=1``, nothing in EngineCore or worker
processes (only the frontend sees finished requests), and nothing the second time.
"""

from __future__ import annotations

import atexit
import logging
import threading

from vllm_lookahead.vllm.processes import is_frontend_process, is_worker_process

from .config import TelemetryConfig
from .otel import OTelEmitter
from .record import FinishedRequest
from .sampler import Sampler
from .stats import SamplerStats, register_otel, register_prometheus
from .worker import BoundedWorker

logger = logging.getLogger("vllm_lookahead.telemetry")


class FrontendTelemetry:
    """One per process.  ``on_finished`` is the request-path entry: two non-blocking hand-offs."""

    def __init__(self, config: TelemetryConfig, *, otel: OTelEmitter | None = None,
                 sampler: Sampler | None = None, register_atexit: bool = True):
        self.config = config
        self.stats = sampler.stats if sampler is not None else SamplerStats()
        self.sampler = sampler or Sampler(config, self.stats, register_atexit=False)
        self.otel = otel if otel is not None else (
            OTelEmitter(capture_content=config.capture_content) if config.otel else None)
        self._otel_worker = None
        if self.otel is not None:
            emitter = self.otel
            self._otel_worker = BoundedWorker(
                "vllm-lookahead-otel", 4096, emitter.emit,
                on_start=lambda: emitter.start(on_meter=lambda m: register_otel(self.stats, m)),
                on_stop=emitter.shutdown)
        if register_atexit:
            atexit.register(self.shutdown)

    @property
    def wants_trace_ids(self) -> bool:
        return self.otel is not None

    def on_finished(self, req: FinishedRequest) -> None:
        """Request path: never raises, never waits."""
        try:
            worker = self._otel_worker
            if worker is not None and not worker.submit(req):
                self.stats.otel_dropped += 1
            self.sampler.offer(req)
        except Exception:  # noqa: BLE001 (telemetry must never fail a request)
            logger.debug("telemetry hand-off failed", exc_info=True)

    def shutdown(self, timeout_s: float = 3.0) -> None:
        """Bounded flush of both threads (spans first: they are cheap)."""
        if self._otel_worker is not None:
            self._otel_worker.stop(timeout_s / 2)
        self.sampler.shutdown(timeout_s / 2)


_lock = threading.Lock()
_telemetry: FrontendTelemetry | None = None


def current() -> FrontendTelemetry | None:
    """The installed telemetry of this process (None when off)."""
    return _telemetry


def install_if_configured(env: dict[str, str] | None = None) -> FrontendTelemetry | None:
    """Install the frontend hooks when configured; re-entrant; a no-op outside the frontend."""
    global _telemetry
    if _telemetry is not None:
        return _telemetry
    config = TelemetryConfig.from_env(env)
    if not config.enabled:
        return None
    if config.spec_metrics == "detailed" and not is_worker_process():
        # the scheduler's process (EngineCore, or a frontend without multiprocessing): which tokens were drafted
        from vllm_lookahead.vllm.spec_steps import install

        install()
    if not is_frontend_process():
        return None
    with _lock:
        if _telemetry is not None:
            return _telemetry
        telemetry = FrontendTelemetry(config)
        register_prometheus(telemetry.stats)
        from vllm_lookahead.vllm.frontend_patch import apply

        apply(telemetry)
        _telemetry = telemetry
        logger.info("vllm_lookahead telemetry on: otel=%s sample_rate=%s sink=%s", config.otel,
                    config.sample_rate, config.sink.url)
        return telemetry
