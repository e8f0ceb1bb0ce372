"""Kafka URLs and auth shared by the source and the sinks (``QUALITY_SIDECAR_KAFKA_*`` env)."""

from __future__ import annotations

import os
from urllib.parse import urlparse


def parse_kafka_url(url: str) -> tuple[str, str]:
    """``kafka://HOST:PORT[,HOST:PORT]/TOPIC`` -> (bootstrap, topic); clear error otherwise."""
    u = urlparse(url)
    topic = u.path.lstrip("/")
    if u.scheme != "kafka" or not u.netloc or not topic:
        raise ValueError(f"bad Kafka URL {url!r}: expected kafka://HOST:PORT[,HOST:PORT]/TOPIC")
    return u.netloc, topic


def kafka_auth() -> dict:
    """kafka-python keyword arguments from the QUALITY_SIDECAR_KAFKA_* environment."""
    env = os.environ.get
    kw: dict = {"security_protocol": env("QUALITY_SIDECAR_KAFKA_SECURITY_PROTOCOL", "PLAINTEXT")}
    if env("QUALITY_SIDECAR_KAFKA_SASL_MECHANISM"):
        kw.update(sasl_mechanism=env("QUALITY_SIDECAR_KAFKA_SASL_MECHANISM"),
                  sasl_plain_username=env("QUALITY_SIDECAR_KAFKA_SASL_USERNAME"),
                  sasl_plain_password=env("QUALITY_SIDECAR_KAFKA_SASL_PASSWORD"))
    if env("QUALITY_SIDECAR_KAFKA_SSL_CAFILE"):
        kw["ssl_cafile"] = env("QUALITY_SIDECAR_KAFKA_SSL_CAFILE")
    return kw
