"""``ServiceConfig``: the sidecar's settings (the top-level keys of ``--config sidecar.yaml``; detector
settings under ``monitor:`` and ``conformance:``).  Its own module so that the pipeline and the service
both read it without importing each other; ``quality_sidecar.service.ServiceConfig`` is the public name.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from .baseline_scoring import ConformanceConfig
from .monitor import REMOVED_MONITOR_KEYS, MonitorConfig


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
        removed = sorted(set(mon) & set(REMOVED_MONITOR_KEYS))
        if removed:
            raise ValueError("; ".join(REMOVED_MONITOR_KEYS[k] for k in removed))
        if bad or set(mon) - mknown or set(conf) - cknown:
            raise ValueError(f"unknown config keys: "
                             f"{sorted(bad | (set(mon) - mknown) | {'conformance.' + k for k in set(conf) - cknown})}")
        return cls(**d, monitor=MonitorConfig(**mon), conformance=ConformanceConfig(**conf))

