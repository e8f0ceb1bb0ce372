"""Telemetry configuration from the environment (the table in docs/CONTRACTS.md).

Read once per process when the frontend half is installed.  A bad value raises ``ValueError`` naming
the variable and the accepted values: misconfiguration must stop ``vllm serve`` at start-up, never
surface on the request path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
ARMS = ("baseline", "candidate", "unknown")
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
DEFAULT_SINK = "file://./lookahead-samples.jsonl"


def env_flag(name: str, default: bool, env: dict[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    raw = env.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}={raw!r}: expected 1/0 (or true/false)")


def _env_float(name: str, default: float, lo: float, hi: float, env: dict[str, str]) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a number in [{lo}, {hi}]") from None
    if not lo <= value <= hi:
        raise ValueError(f"{name}={raw!r}: expected a number in [{lo}, {hi}]")
    return value


def _env_int(name: str, default: int, lo: int, env: dict[str, str]) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected an integer >= {lo}") from None
    if value < lo:
        raise ValueError(f"{name}={raw!r}: expected an integer >= {lo}")
    return value


@dataclass(frozen=True)
class SinkSpec:
    """Where samples go: ``kind`` is "kafka" (bootstrap servers + topic) or "file" (path)."""

    kind: str
    url: str
    bootstrap: tuple[str, ...] = ()
    topic: str = ""
    path: str = ""


def parse_sink(url: str) -> SinkSpec:
    """Parse ``kafka://HOST:PORT[,HOST:PORT]/TOPIC`` or ``file:///path/samples.jsonl``.

    ``file://./rel.jsonl`` (a relative path) is accepted too: it is the embedded default.
    """
    err = (f"VLLM_LOOKAHEAD_SAMPLE_SINK={url!r}: expected kafka://HOST:PORT[,HOST:PORT]/TOPIC "
           "or file:///path/samples.jsonl")
    if url.startswith("kafka://"):
        rest = url[len("kafka://"):]
        hosts, _, topic = rest.partition("/")
        topic = unquote(topic.strip("/"))
        servers = tuple(h.strip() for h in hosts.split(",") if h.strip())
        if not servers or not topic or "/" in topic:
            raise ValueError(err)
        for server in servers:
            host, sep, port = server.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"{err} (bad server {server!r})")
        return SinkSpec(kind="kafka", url=url, bootstrap=servers, topic=topic)
    if url.startswith("file://"):
        rest = url[len("file://"):]
        if rest.startswith("./") or rest.startswith("../"):
            path = rest  # relative to the working directory
        else:
            parsed = urlparse(url)
            path = unquote(parsed.path)
        if not path or path.endswith("/"):
            raise ValueError(err)
        return SinkSpec(kind="file", url=url, path=path)
    raise ValueError(err)


@dataclass(frozen=True)
class KafkaAuth:
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None

    def producer_kwargs(self) -> dict[str, object]:
        kw: dict[str, object] = {"security_protocol": self.security_protocol}
        if self.sasl_mechanism:
            kw["sasl_mechanism"] = self.sasl_mechanism
        if self.sasl_username is not None:
            kw["sasl_plain_username"] = self.sasl_username
        if self.sasl_password is not None:
            kw["sasl_plain_password"] = self.sasl_password
        if self.ssl_cafile:
            kw["ssl_cafile"] = self.ssl_cafile
        return kw


@dataclass(frozen=True)
class TelemetryConfig:
    enabled: bool = False
    otel: bool = True
    capture_content: bool = False
    sample_rate: float = 0.01
    sample_errors: bool = True
    sink: SinkSpec = field(default_factory=lambda: parse_sink(DEFAULT_SINK))
    redact_prompts: bool = False
    arm: str = "unknown"
    release: str | None = None
    instance: str | None = None
    queue_size: int = 1024
    kafka_auth: KafkaAuth = field(default_factory=KafkaAuth)
    kafka_compression: str | None = "gzip"
    spec_metrics: str = "detailed"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> TelemetryConfig:
        env = dict(os.environ if env is None else env)
        enabled = env_flag("VLLM_LOOKAHEAD_TELEMETRY", False, env)
        arm = env.get("VLLM_LOOKAHEAD_ARM", "unknown").strip() or "unknown"
        if arm not in ARMS:
            raise ValueError(f"VLLM_LOOKAHEAD_ARM={arm!r}: expected one of {', '.join(ARMS)}")
        proto = env.get("VLLM_LOOKAHEAD_KAFKA_SECURITY_PROTOCOL", "PLAINTEXT").strip().upper() or "PLAINTEXT"
        if proto not in SECURITY_PROTOCOLS:
            raise ValueError(f"VLLM_LOOKAHEAD_KAFKA_SECURITY_PROTOCOL={proto!r}: expected one of "
                             + ", ".join(SECURITY_PROTOCOLS))
        compression = env.get("VLLM_LOOKAHEAD_KAFKA_COMPRESSION", "gzip").strip().lower()
        if compression not in ("gzip", "none", "lz4", "snappy", "zstd"):
            raise ValueError(f"VLLM_LOOKAHEAD_KAFKA_COMPRESSION={compression!r}: expected gzip, lz4, "
                             "snappy, zstd or none")
        spec_metrics = env.get("VLLM_LOOKAHEAD_SPEC_METRICS", "detailed").strip().lower()
        if spec_metrics not in ("none", "summary", "detailed"):
            raise ValueError(f"VLLM_LOOKAHEAD_SPEC_METRICS={spec_metrics!r}: expected none, summary "
                             "or detailed")
        return cls(
            enabled=enabled,
            otel=env_flag("VLLM_LOOKAHEAD_OTEL", True, env),
            capture_content=env_flag("VLLM_LOOKAHEAD_CAPTURE_CONTENT", False, env),
            sample_rate=_env_float("VLLM_LOOKAHEAD_SAMPLE_RATE", 0.01, 0.0, 1.0, env),
            sample_errors=env_flag("VLLM_LOOKAHEAD_SAMPLE_ERRORS", True, env),
            sink=parse_sink(env.get("VLLM_LOOKAHEAD_SAMPLE_SINK", DEFAULT_SINK).strip() or DEFAULT_SINK),
            redact_prompts=env_flag("VLLM_LOOKAHEAD_REDACT_PROMPTS", False, env),
            arm=arm,
            release=env.get("VLLM_LOOKAHEAD_RELEASE") or None,
            instance=env.get("VLLM_LOOKAHEAD_INSTANCE") or env.get("HOSTNAME") or None,
            queue_size=_env_int("VLLM_LOOKAHEAD_QUEUE_SIZE", 1024, 1, env),
            kafka_auth=KafkaAuth(
                security_protocol=proto,
                sasl_mechanism=env.get("VLLM_LOOKAHEAD_KAFKA_SASL_MECHANISM") or None,
                sasl_username=env.get("VLLM_LOOKAHEAD_KAFKA_SASL_USERNAME") or None,
                sasl_password=env.get("VLLM_LOOKAHEAD_KAFKA_SASL_PASSWORD") or None,
                ssl_cafile=env.get("VLLM_LOOKAHEAD_KAFKA_SSL_CAFILE") or None,
            ),
            kafka_compression=None if compression == "none" else compression,
            spec_metrics=spec_metrics,
        )
