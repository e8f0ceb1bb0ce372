"""The sampler against a real Kafka broker: samples arrive, parse, validate, are keyed by request id;
a killed broker never reaches the request path and every sample is accounted for."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from telemetry_support import make_request

from quality_sidecar.schema import validate_sample
from vllm_lookahead.telemetry.config import TelemetryConfig
from vllm_lookahead.telemetry.sampler import Sampler

pytestmark = pytest.mark.kafka


def _sampler(bootstrap: str, topic: str, **env: str) -> Sampler:
    cfg = TelemetryConfig.from_env({"VLLM_LOOKAHEAD_SAMPLE_RATE": "1",
                                    "VLLM_LOOKAHEAD_SAMPLE_SINK": f"kafka://{bootstrap}/{topic}",
                                    "VLLM_LOOKAHEAD_ARM": "candidate", **env})
    return Sampler(cfg, register_atexit=False)


def _consume(bootstrap: str, topic: str, n: int, timeout_s: float = 30.0) -> list:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             group_id=f"t-{uuid.uuid4().hex[:8]}", consumer_timeout_ms=1000)
    records: list = []
    deadline = time.time() + timeout_s
    try:
        while len(records) < n and time.time() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(batch)
    finally:
        consumer.close()
    return records


def _wait(cond, timeout_s: float) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def test_samples_arrive_valid_and_keyed_by_request_id(kafka_broker):
    topic = f"samples-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic)
    sampler = _sampler(kafka_broker.bootstrap, topic, VLLM_LOOKAHEAD_REDACT_PROMPTS="1")
    ids = [f"cmpl-{uuid.uuid4().hex[:12]}" for _ in range(25)]
    for rid in ids:
        sampler.offer(make_request(rid))
    assert _wait(lambda: sampler.stats.sent == len(ids), 30), sampler.stats.snapshot()
    sampler.shutdown(5)
    records = _consume(kafka_broker.bootstrap, topic, len(ids))
    assert sorted(r.key.decode() for r in records) == sorted(ids)
    for r in records:
        sample = json.loads(r.value)
        validate_sample(sample)
        assert sample["request_id"] == r.key.decode()
        assert sample["deployment"]["arm"] == "candidate"
        assert sample["prompt"]["text"] is None and sample["prompt"]["redacted"] is True
    s = sampler.stats
    assert (s.sampled, s.sent, s.failed, sum(s.dropped.values())) == (25, 25, 0, 0)


def test_broker_killed_mid_run_never_reaches_the_request_path(fresh_kafka_broker):
    broker = fresh_kafka_broker
    topic = "samples-kill"
    broker.create_topic(topic)
    sampler = _sampler(broker.bootstrap, topic, VLLM_LOOKAHEAD_QUEUE_SIZE="64")
    for i in range(10):
        sampler.offer(make_request(f"before-{i}"))
    assert _wait(lambda: sampler.stats.sent == 10, 30), sampler.stats.snapshot()

    broker.kill()
    worst = 0.0
    for i in range(300):
        t0 = time.perf_counter()
        sampler.offer(make_request(f"after-{i}"))  # must neither raise nor wait for Kafka
        worst = max(worst, time.perf_counter() - t0)
    s = sampler.stats
    # Every sample ends up sent, failed (delivery timeout 15 s) or dropped (queue/backpressure).
    assert _wait(lambda: s.sent + s.failed + sum(s.dropped.values()) == s.sampled, 40), s.snapshot()
    assert s.sampled == 310 and s.sent == 10
    assert s.failed + s.dropped["queue_full"] + s.dropped["backpressure"] == 300
    assert worst < 0.05, f"an offer took {worst * 1e3:.1f} ms with the broker dead"
    sampler.shutdown(2)
