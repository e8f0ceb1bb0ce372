import json
import uuid

import pytest

pytestmark = pytest.mark.kafka


def test_broker_round_trip(kafka_broker):
    """The broker accepts a produce and serves it back to a consumer group."""
    from kafka import KafkaConsumer, KafkaProducer

    topic = f"t-{uuid.uuid4().hex[:8]}"
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
    for i in range(5):
        producer.send(topic, key=str(i).encode(), value=json.dumps({"i": i}).encode())
    producer.flush(10)
    producer.close()
    consumer = KafkaConsumer(topic, bootstrap_servers=kafka_broker.bootstrap, group_id="g",
                             auto_offset_reset="earliest", consumer_timeout_ms=10000)
    got = [json.loads(m.value)["i"] for m in consumer]
    consumer.close()
    assert got == [0, 1, 2, 3, 4]
