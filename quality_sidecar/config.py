"""``ServiceConfig``: the sidecar's settings (the top-level keys of ``--config sidecar.yaml``; detector
settings under ``monitor:`` and ``conformance:``).  Its own module so that the pipeline and the service
both read it without importing each other; ``quality_sidecar.service.ServiceConfig`` is the public name.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from .baseline_scoring import ConformanceConfig
from .monitor import MonitorConfig

# Keys that were removed, with why and what to do instead: a config that still sets one stops with this
# message rather than a bare "unknown config key".
REMOVED_KEYS = {
    "monitor.aa_mismatch_rate": "monitor.aa_mismatch_rate was removed: exact_match no longer tests against a "
                                "configured A/A rate (a guess that, in bf16, sent exact decoders to rollback); it "
                                "compares the candidate's mismatch rate with the baseline arm's measured one; delete "
                                "the key",
    "monitor.exact_match_delta": "monitor.exact_match_delta was removed: exact_match is a two-sample test now, not a "
                                 "CUSUM tuned to a shift; its false-alarm rate is the ERT of every chart (ert_total); "
                                 "delete the key",
    "monitor.aa_min_pairs": "monitor.aa_min_pairs was replaced by monitor.exact_match_block: the candidate pairs per "
                            "test, and the A/A pairs a source needs before exact_match gives any verdict",
    "conformance.retries": "conformance.retries was removed: transient failures (timeouts, refused connections, "
                           "408/429/5xx) are now retried until the baseline server answers (backoff 0.5 s doubling, "
                           "capped at 30 s) and never given up, so there is no attempt limit to set; delete the key",
}


@dataclass
class ServiceConfig:
    source: str = ""
    group: str = "quality-sidecar"
    dlq: str | None = None
    alerts: str | None = None
    webhook_url: str | None = None
    baseline_url: str | None = None
    baseline_dtype: str | None = None  # the baseline server's dtype: replays of samples served at another are refused
    replay_fraction: float = 0.1
    state_path: str | None = None
    reference_path: str | None = None
    dedupe_window: int = 100_000
    commit_interval_s: float = 1.0
    max_poll_records: int = 500
    batch_linger_s: float = 0.1
    max_message_bytes: int = 4 * 1024 * 1024
    format_code_fraction: float = 1.0
    safety_backend: str | None = None
    validation: str = "fast"
    max_samples: int | None = None
    progress: bool = True
    kafka_cluster_name: str = ""  # cluster_name label of the lag metrics (default: the bootstrap servers)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    conformance: ConformanceConfig = field(default_factory=ConformanceConfig)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ServiceConfig:
        d = dict(d)
        mon = d.pop("monitor", {}) or {}
        conf = d.pop("conformance", {}) or {}
        known = {f.name for f in fields(cls)}
        bad = set(d) - known
        mknown = {f.name for f in fields(MonitorConfig)}
        cknown = {f.name for f in fields(ConformanceConfig)}
        removed = sorted(({f"monitor.{k}" for k in mon} | {f"conformance.{k}" for k in conf}) & set(REMOVED_KEYS))
        if removed:
            raise ValueError("; ".join(REMOVED_KEYS[k] for k in removed))
        if bad or set(mon) - mknown or set(conf) - cknown:
            raise ValueError(f"unknown config keys: "
                             f"{sorted(bad | (set(mon) - mknown) | {'conformance.' + k for k in set(conf) - cknown})}")
        return cls(**d, monitor=MonitorConfig(**mon), conformance=ConformanceConfig(**conf))

