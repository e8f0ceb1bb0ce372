"""Two sidecar replicas in one consumer group on a real broker: SIGKILL one mid-stream, count once.

What "counted" means here: a sample is counted by a replica when its request id is in that
replica's state file (``pipeline.seen``, with a dedupe window larger than the stream) - the durable
record the replica resumes from.  The sidecar writes a checkpoint pending, commits its offsets with
the checkpoint's tag, then renames it into place, and checkpoints before giving up partitions in a
rebalance (Service.checkpoint / _on_revoke).  Exactly once = the replicas' id sets are disjoint and
together hold every sample, and the group committed the end of every partition.

Nothing is mocked: two ``quality-sidecar run`` processes, a real Kafka 4 broker, a steady producer,
a real SIGKILL and the group coordinator's real rebalances (10 s session timeout).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tests.support.process import free_port
from tests.support.synth import SampleStream

from .conftest import FAST_MONITOR, metric_sum, scrape

pytestmark = pytest.mark.kafka

PARTITIONS, RATE = 4, 100  # samples/s: a few thousand in all


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


class _Producer(threading.Thread):
    """Produces samples at a steady rate until told where to stop, so the kill and the rejoin both
    happen mid-stream however slow the machine is."""

    def __init__(self, bootstrap: str, topic: str, per_s: float):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.per_s = bootstrap, topic, per_s
        self.stream = SampleStream(seed=77, arm="candidate")
        self.ids: list[str] = []
        self.limit = 10**9
        self.error: BaseException | None = None

    @property
    def sent(self) -> int:
        return len(self.ids)

    def run(self) -> None:
        from kafka import KafkaProducer

        try:
            producer = KafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=20, acks="all")
            t0 = time.monotonic()
            while self.sent < self.limit:
                s = self.stream.take(1)[0]  # keyed by request id: spread over the partitions
                producer.send(self.topic, key=s["request_id"].encode(), value=json.dumps(s).encode())
                self.ids.append(s["request_id"])
                delay = t0 + self.sent / self.per_s - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            producer.flush(60)
            producer.close()
        except BaseException as e:  # noqa: BLE001 (reported by the test)
            self.error = e


def test_two_replicas_one_group_sigkill_one_every_sample_counted_once(kafka_broker, tmp_path: Path) -> None:
    """a and b share a 4-partition topic; a is SIGKILLed mid-stream (b takes its partitions after the
    session timeout), then restarted on its state file as Kubernetes restarts a container (the
    rebalance moves partitions from the live b back to a while b has processed, uncommitted work).
    """
    from kafka import KafkaConsumer
    from kafka.structs import TopicPartition

    topic, group = f"scale-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(topic, partitions=PARTITIONS)
    cfg = tmp_path / "sidecar.yaml"
    # A 2 s checkpoint interval leaves ~200 processed, uncommitted samples on a replica at any moment:
    # without the checkpoint before revocation, the rejoin would hand them to a replica that counts them again.
    cfg.write_text(yaml.safe_dump({"monitor": FAST_MONITOR, "commit_interval_s": 2.0, "max_poll_records": 50,
                                   "dedupe_window": 100_000, "kafka_cluster_name": "test"}))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    ports = {"a": free_port(), "b": free_port()}
    procs: dict[str, subprocess.Popen] = {}
    logs: list = []

    def start(name: str) -> subprocess.Popen:
        logs.append((tmp_path / f"{name}-{len(logs)}.log").open("w"))
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "quality_sidecar.cli", "run", "--source", f"kafka://{kafka_broker.bootstrap}/{topic}",
             "--group", group, "--http-port", str(ports[name]), "--config", str(cfg),
             "--state", str(tmp_path / f"{name}.json")],
            env=env, stdout=logs[-1], stderr=subprocess.STDOUT)
        return procs[name]

    def ready(name: str) -> bool:
        import urllib.request

        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{ports[name]}/readyz", timeout=2).status == 200
        except OSError:
            return False

    def lags() -> dict[str, dict[str, float]]:
        out = {}
        for name, port in ports.items():
            try:
                out[name] = _lag_series(scrape(port), "kafka_consumergroup_group_lag")
            except OSError:
                out[name] = {}
        return out

    producer = _Producer(kafka_broker.bootstrap, topic, per_s=RATE)
    try:
        a, b = start("a"), start("b")
        _wait(lambda: ready("a") and ready("b"), 240, "both replicas ready", [a, b])
        _wait(lambda: all(0 < len(v) < PARTITIONS for v in lags().values()), 30, "a 2+2 split", [a, b])
        producer.start()
        _wait(lambda: producer.sent >= 5 * RATE and _samples_total(ports["a"]) > 0, 60, "a consuming", [a, b])
        owned_by_a = set(lags()["a"])
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        killed_at = producer.sent
        # b takes a's partitions after the session timeout...
        _wait(lambda: len(lags()["b"]) == PARTITIONS, 60, "b owning every partition", [b])
        taken_over_at = producer.sent
        # ...and a comes back on its state file: partitions move from the live b to a again.
        a = start("a")
        _wait(lambda: ready("a") and 0 < len(lags()["a"]) < PARTITIONS, 240, "a rejoined with partitions", [a, b])
        rejoined_at = producer.sent
        producer.limit = producer.sent + 3 * RATE  # a little more stream after the second rebalance
        producer.join(120)
        assert producer.error is None, producer.error

        def caught_up() -> bool:
            now = lags()
            merged = {**now["a"], **now["b"]}
            return len(merged) == PARTITIONS and not any(merged.values()) and not set(now["a"]) & set(now["b"])

        _wait(caught_up, 120, "the group caught up with lag 0 on every partition", [a, b])
        text_a, text_b = scrape(ports["a"]), scrape(ports["b"])
        offsets = {**_lag_series(text_a, "kafka_consumergroup_group_offset"),
                   **_lag_series(text_b, "kafka_consumergroup_group_offset")}
        assert 'cluster_name="test"' in text_b and f'group="{group}"' in text_b
        assert set(_lag_series(text_b, "kafka_consumergroup_group_lag_seconds").values()) == {0.0}
        for p in (a, b):
            p.send_signal(signal.SIGTERM)  # graceful: final checkpoint + commit
        assert a.wait(30) == 0 and b.wait(30) == 0
    finally:
        producer.limit = 0  # stops the thread if the test failed mid-stream
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for fh in logs:
            fh.close()

    assert 0 < len(owned_by_a) < PARTITIONS, f"a owned {owned_by_a} before the kill: the group did not split"
    n = producer.sent
    assert killed_at < taken_over_at < rejoined_at < n, (killed_at, taken_over_at, rejoined_at, n)  # mid-stream
    ids_a, ids_b = _ids(tmp_path / "a.json"), _ids(tmp_path / "b.json")
    everything = set(producer.ids)
    assert len(everything) == n
    assert len(ids_a) == len(set(ids_a)) and len(ids_b) == len(set(ids_b))
    assert not set(ids_a) & set(ids_b), f"{len(set(ids_a) & set(ids_b))} samples counted by both replicas"
    assert set(ids_a) | set(ids_b) == everything, f"{len(everything - set(ids_a) - set(ids_b))} samples never counted"
    counts = [json.loads((tmp_path / f"{n}.json").read_text())["pipeline"]["counts"] for n in ("a", "b")]
    assert counts[0]["samples"] + counts[1]["samples"] == n
    # The group committed the end of every partition, and the offset gauges said so.
    c = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, group_id=group, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        ends = c.end_offsets(tps)
        committed = {tp.partition: c.committed(tp) for tp in tps}
    finally:
        c.close(autocommit=False)
    assert committed == {tp.partition: ends[tp] for tp in tps}
    assert sum(offsets.values()) == n


def test_pending_checkpoint_is_adopted_only_when_its_commit_went_through(kafka_broker, tmp_path: Path) -> None:
    """The crash window between the offset commit and the rename of the state file, on a real broker.

    A pending state whose tag is the group's committed metadata is adopted at start; one whose tag
    was never committed (the crash hit before the commit) is dropped, and the old state stays.
    """
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.structs import OffsetAndMetadata, TopicPartition

    from quality_sidecar.service import Service, ServiceConfig

    topic, group = f"pend-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(topic)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
    for s in SampleStream(seed=5).take(10):
        producer.send(topic, json.dumps(s).encode())
    producer.flush(30)
    producer.close()
    state = tmp_path / "state.json"
    cfg = ServiceConfig.from_dict({"source": f"kafka://{kafka_broker.bootstrap}/{topic}", "group": group,
                                   "state_path": str(state), "progress": False, "monitor": FAST_MONITOR,
                                   "max_samples": 10})
    Service(cfg).run()
    committed = json.loads(state.read_text())
    assert committed["pipeline"]["counts"]["samples"] == 10

    def with_pending(tag: str, commit_tag: str | None) -> int:
        pending = json.loads(json.dumps(committed))
        pending["tag"] = tag
        pending["pipeline"]["counts"]["samples"] = 11  # tells the two files apart
        Path(f"{state}.pending").write_text(json.dumps(pending))
        if commit_tag is not None:  # what the crashed process's commit left in the group
            c = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, group_id=group, enable_auto_commit=False)
            c.commit({TopicPartition(topic, 0): OffsetAndMetadata(10, commit_tag, -1)})
            c.close(autocommit=False)
        svc = Service(cfg)
        try:
            assert not Path(f"{state}.pending").exists()
            return svc.pipeline.counts["samples"]
        finally:
            svc.close()

    assert with_pending("quality-sidecar:x:1", commit_tag=None) == 10  # the commit never happened: dropped
    assert with_pending("quality-sidecar:x:2", commit_tag="quality-sidecar:x:2") == 11  # committed: adopted
    assert json.loads(state.read_text())["pipeline"]["counts"]["samples"] == 11
