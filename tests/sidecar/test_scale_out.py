"""Two sidecar replicas in one consumer group on a real broker: SIGKILL one mid-stream, count once.

What "counted" means here: a sample is counted by a replica when its request id is in that
replica's state file (``pipeline.seen``, with a dedupe window larger than the stream) - the durable
record the replica resumes from and whose offsets the group has committed (the sidecar writes a
checkpoint pending, commits its offsets, then renames it into place; see Service.checkpoint).  The
killed replica's counts are what its state file held at the kill; the survivor's are its state
after a graceful stop.  Exactly once = the two id sets are disjoint and together hold every sample.

Nothing is mocked: two ``quality-sidecar run`` processes, a real Kafka 4 broker, a real SIGKILL and
the group coordinator's real rebalance (10 s session timeout).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from quality_sidecar.synth import SampleStream
from vllm_lookahead.devtools.kafka_broker import free_port

from .conftest import FAST_MONITOR, metric_sum, scrape

pytestmark = pytest.mark.kafka

PARTITIONS, N = 4, 4000


def _samples_total(port: int) -> float:
    try:
        return metric_sum(scrape(port), "quality_sidecar_samples_total")
    except OSError:
        return -1.0


def _wait(pred, timeout_s: float, what: str, procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"a sidecar exited with {p.returncode} while waiting for {what}")
        time.sleep(0.2)
    raise AssertionError(f"{what} not reached in {timeout_s:.0f} s")


def _lag_series(text: str, name: str) -> dict[str, float]:
    """partition -> value of a kafka-lag-exporter gauge in one /metrics page."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels = dict(kv.split("=", 1) for kv in line[len(name) + 1 : line.rindex("}")].split(","))
            out[labels["partition"].strip('"')] = float(line.rsplit(" ", 1)[1])
    return out


def _ids(state_path: Path) -> list[str]:
    return json.loads(state_path.read_text())["pipeline"]["seen"]


def test_two_replicas_one_group_sigkill_one_every_sample_counted_once(kafka_broker, tmp_path: Path) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.structs import TopicPartition

    topic, group = f"scale-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(topic, partitions=PARTITIONS)
    cfg = tmp_path / "sidecar.yaml"
    cfg.write_text(yaml.safe_dump({"monitor": FAST_MONITOR, "commit_interval_s": 0.3, "max_poll_records": 50,
                                   "dedupe_window": 10 * N, "kafka_cluster_name": "test"}))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    ports = {"a": free_port(), "b": free_port()}
    procs: dict[str, subprocess.Popen] = {}
    logs = {}
    for name, port in ports.items():
        logs[name] = (tmp_path / f"{name}.log").open("w")
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "quality_sidecar.cli", "run", "--source", f"kafka://{kafka_broker.bootstrap}/{topic}",
             "--group", group, "--http-port", str(port), "--config", str(cfg),
             "--state", str(tmp_path / f"{name}.json")],
            env=env, stdout=logs[name], stderr=subprocess.STDOUT)
    a, b = procs["a"], procs["b"]
    try:
        def both_ready() -> bool:
            import urllib.request

            try:
                return all(urllib.request.urlopen(f"http://127.0.0.1:{p}/readyz", timeout=2).status == 200
                           for p in ports.values())
            except OSError:
                return False

        _wait(both_ready, 90, "both replicas ready", list(procs.values()))
        time.sleep(2.0)  # let the group settle on a 2+2 split before the stream starts
        samples = SampleStream(seed=77, arm="candidate").take(N)
        producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, linger_ms=20, acks="all")
        for s in samples:  # keyed by request id: spread over the partitions, duplicates stay together
            producer.send(topic, key=s["request_id"].encode(), value=json.dumps(s).encode())
        producer.flush(60)
        producer.close()

        _wait(lambda: _samples_total(ports["a"]) >= 400 and _samples_total(ports["b"]) >= 400, 120,
              "both replicas consuming", list(procs.values()))
        owned_by_a = set(_lag_series(scrape(ports["a"]), "kafka_consumergroup_group_lag"))
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        total_before = _samples_total(ports["b"])
        assert 0 < len(owned_by_a) < PARTITIONS, f"replica a owned {owned_by_a}: the group did not split"

        # b takes a's partitions after the session timeout and drains the topic.
        def b_owns_all_and_caught_up() -> bool:
            text = scrape(ports["b"])
            lag = _lag_series(text, "kafka_consumergroup_group_lag")
            return len(lag) == PARTITIONS and not any(lag.values())

        _wait(b_owns_all_and_caught_up, 120, "b owning every partition with lag 0", [b])
        text = scrape(ports["b"])
        offsets = _lag_series(text, "kafka_consumergroup_group_offset")
        assert 'cluster_name="test"' in text and f'group="{group}"' in text
        assert set(_lag_series(text, "kafka_consumergroup_group_lag_seconds").values()) == {0.0}
        b.send_signal(signal.SIGTERM)  # graceful: final checkpoint + commit
        assert b.wait(30) == 0
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for fh in logs.values():
            fh.close()

    ids_a, ids_b = _ids(tmp_path / "a.json"), _ids(tmp_path / "b.json")
    everything = {s["request_id"] for s in samples}
    assert len(ids_a) == len(set(ids_a)) and len(ids_b) == len(set(ids_b))
    assert 0 < len(ids_a) < N, "the kill was not mid-stream"
    assert not set(ids_a) & set(ids_b), f"{len(set(ids_a) & set(ids_b))} samples counted by both replicas"
    assert set(ids_a) | set(ids_b) == everything, f"{len(everything - set(ids_a) - set(ids_b))} samples never counted"
    counts_a = json.loads((tmp_path / "a.json").read_text())["pipeline"]["counts"]["samples"]
    counts_b = json.loads((tmp_path / "b.json").read_text())["pipeline"]["counts"]["samples"]
    assert counts_a + counts_b == N
    assert total_before + len(ids_a) < N  # work was left on a's partitions when it died
    # The group committed the end of every partition, and b's offset gauge said so.
    c = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, group_id=group, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        ends = c.end_offsets(tps)
        committed = {tp.partition: c.committed(tp) for tp in tps}
    finally:
        c.close(autocommit=False)
    assert committed == {tp.partition: ends[tp] for tp in tps}
    assert sum(offsets.values()) == N
