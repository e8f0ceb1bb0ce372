"""The output sampler: a deterministic decision per request id, a bounded queue, one thread per process.

Request path (``offer``): one hash of the request id, two integer adds and a non-blocking put; the
sample is *built* (copies, sha256, schema validation, JSON) on the sampler thread.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
from typing import Any

from quality_sidecar.schema import validation_errors

from .config import TelemetryConfig
from .record import FinishedRequest, build_sample
from .sinks import Sink, make_sink
from .stats import SamplerStats
from .worker import BoundedWorker

logger = logging.getLogger("vllm_lookahead.telemetry")

_SCALE = float(1 << 64)


def sample_fraction(request_id: str) -> float:
    """Uniform in [0, 1), a pure function of the request id (same answer in every process/replica,
    so a request that fans out or is retried with the same id is sampled everywhere or nowhere)."""
    digest = hashlib.blake2b(request_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SCALE


def sample_errors(sample: dict[str, Any]) -> list[str]:
    """Schema-v1 violations of ``sample`` (empty when valid), affordable on every sample.

    jsonschema walks token-id arrays item by item (~4 ms for a few hundred tokens); the schema's rule
    for them is just "non-negative integers", checked here directly, and the rest of the sample goes
    through the real validator (``quality_sidecar.schema``) with the arrays left out.
    """
    errs: list[str] = []
    output = sample.get("output") or {}
    for path, ids in (("prompt_token_ids", sample.get("prompt_token_ids")),
                      ("output/token_ids", output.get("token_ids"))):
        if ids is not None and not all(type(t) is int and t >= 0 for t in ids):
            errs.append(f"{path}: token ids must be non-negative integers")
    light = {**sample, "prompt_token_ids": None, "output": {**output, "token_ids": None}}
    return errs + validation_errors(light)


def should_sample(request_id: str, rate: float, *, is_error: bool = False,
                  sample_errors: bool = True) -> bool:
    if is_error and sample_errors:
        return True
    if rate <= 0.0:
        return False
    if rate >= 1.0:
        return True
    return sample_fraction(request_id) < rate


class Sampler:
    def __init__(self, config: TelemetryConfig, stats: SamplerStats | None = None,
                 sink: Sink | None = None, register_atexit: bool = True):
        self.config = config
        self.stats = stats or SamplerStats()
        self._sink = sink
        self._own_sink = sink is None  # built from the config (lazily), so rebuilt after fork
        self._worker = BoundedWorker("vllm-lookahead-sampler", config.queue_size, self._handle,
                                     on_stop=self._close_sink, idle=self._idle)
        if register_atexit:
            atexit.register(self.shutdown)
        if hasattr(os, "register_at_fork"):
            # a Kafka producer's IO thread does not survive fork: the child builds its own sink
            os.register_at_fork(after_in_child=self._forget_sink)

    def _forget_sink(self) -> None:
        if self._own_sink:
            self._sink = None

    # ---- request path ---------------------------------------------------------------------------
    def offer(self, req: FinishedRequest) -> bool:
        """Decide, and hand a sampled request to the thread.  Never raises, never waits."""
        stats = self.stats
        stats.finished += 1
        cfg = self.config
        if not should_sample(req.decision_id, cfg.sample_rate, is_error=req.is_error,
                             sample_errors=cfg.sample_errors):
            return False
        stats.sampled += 1
        if not self._worker.submit(req):
            stats.dropped["queue_full"] += 1
        return True

    # ---- sampler thread -------------------------------------------------------------------------
    @property
    def sink(self) -> Sink:
        if self._sink is None:
            cfg = self.config
            self._sink = make_sink(cfg.sink, cfg.kafka_auth, self.stats, cfg.kafka_compression)
        return self._sink

    def build(self, req: FinishedRequest) -> dict[str, Any]:
        cfg = self.config
        return build_sample(req, arm=cfg.arm, release=cfg.release, instance=cfg.instance,
                            redact_prompts=cfg.redact_prompts)

    def _handle(self, req: FinishedRequest) -> None:
        sample = self.build(req)
        errors = sample_errors(sample)
        if errors:
            self.stats.dropped["invalid"] += 1
            logger.warning("sample for %s does not match schema v1, dropped: %s", req.request_id,
                           errors[0])
            return
        value = json.dumps(sample, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        self.sink.send(req.request_id, value)

    def _idle(self) -> bool:
        return bool(self._sink.idle()) if self._sink is not None else False

    def _close_sink(self, timeout_s: float) -> None:
        if self._sink is not None:
            self._sink.close(timeout_s)

    # ---- lifecycle ------------------------------------------------------------------------------
    def shutdown(self, timeout_s: float = 3.0) -> None:
        """Bounded flush: drain the queue and the sink for at most ``timeout_s`` (atexit)."""
        self._worker.stop(timeout_s)
        if self._worker.started:  # what the thread did not reach in time (minus the stop marker)
            self.stats.dropped["shutdown"] += max(0, self._worker.qsize() - 1)

    @property
    def queued(self) -> int:
        return self._worker.qsize()
