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


def test_first_samples_to_a_new_auto_created_topic_all_arrive(kafka_broker):
    """The session broker auto-creates topics: the first send meets UNKNOWN_TOPIC_OR_PARTITION /
    LEADER_NOT_AVAILABLE while the topic is created; nothing may be lost or counted failed."""
    topic = f"fresh-{uuid.uuid4().hex[:8]}"  # not created beforehand
    sampler = _sampler(kafka_broker.bootstrap, topic)
    for i in range(5):
        sampler.offer(make_request(f"first-{i}"))
    assert _wait(lambda: sampler.stats.sent == 5, 30), sampler.stats.snapshot()
    sampler.shutdown(5)
    assert sampler.stats.failed == 0
    assert sorted(r.key.decode() for r in _consume(kafka_broker.bootstrap, topic, 5)) == \
        [f"first-{i}" for i in range(5)]


@pytest.fixture
def broker_without_auto_create():
    """A broker where topics exist only once created (most production clusters)."""
    from tests.support.kafka_broker import KafkaBroker

    broker = KafkaBroker(auto_create_topics=False).start()
    try:
        yield broker
    finally:
        broker.close()


def test_sample_to_a_topic_not_ready_yet_is_logged_kept_and_delivered_once_it_exists(
        broker_without_auto_create, caplog):
    """Metadata not ready (the topic appears 3 s after start-up): the first samples are logged and
    retried on the sampler thread -- not counted failed -- and arrive once the topic exists; the
    request path never waits.  With a topic that never appears they fail after the delivery
    timeout, logged."""
    from vllm_lookahead.telemetry.sinks import KafkaSink

    broker = broker_without_auto_create
    topic = "created-late"
    caplog.set_level("WARNING", logger="vllm_lookahead.telemetry")
    sampler = _sampler(broker.bootstrap, topic)
    worst = 0.0
    for i in range(3):
        t0 = time.perf_counter()
        sampler.offer(make_request(f"early-{i}"))
        worst = max(worst, time.perf_counter() - t0)
    assert _wait(lambda: "not ready" in caplog.text, 15), caplog.text
    time.sleep(1.0)
    s = sampler.stats
    assert (s.sent, s.failed) == (0, 0), s.snapshot()
    broker.create_topic(topic)
    sampler.offer(make_request("after-create"))
    assert _wait(lambda: s.sent == 4, 20), s.snapshot()
    assert s.failed == 0 and sum(s.dropped.values()) == 0
    assert worst < 0.05, f"an offer took {worst * 1e3:.1f} ms while the topic was missing"
    sampler.shutdown(5)
    keys = sorted(r.key.decode() for r in _consume(broker.bootstrap, topic, 4))
    assert keys == ["after-create", "early-0", "early-1", "early-2"]

    # a topic that never appears: retried until the (here 3 s) delivery timeout, then failed + logged
    cfg = TelemetryConfig.from_env({"VLLM_LOOKAHEAD_SAMPLE_RATE": "1",
                                    "VLLM_LOOKAHEAD_SAMPLE_SINK": f"kafka://{broker.bootstrap}/never"})
    stats = Sampler(cfg, register_atexit=False).stats
    sink = KafkaSink(cfg.sink, cfg.kafka_auth, stats, delivery_timeout_s=3.0)
    doomed = Sampler(cfg, stats, sink=sink, register_atexit=False)
    caplog.clear()
    doomed.offer(make_request("doomed"))
    assert _wait(lambda: stats.failed == 1, 20), stats.snapshot()
    assert "not ready" in caplog.text and "failed" in caplog.text
    assert stats.sent == 0 and sink.pending == 0
    doomed.shutdown(2)
