"""The sidecar against a real Kafka broker: crash safety, DLQ under fuzzing, alarms to the alerts topic.

kill -9 is real (SIGKILL of the sidecar subprocess); nothing here is mocked.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

import pytest
import yaml

from quality_sidecar.service import Service, ServiceConfig
from tests.support.process import free_port
from tests.support.synth import SampleStream, fuzz_messages

from .conftest import FAST_MONITOR, metric_sum, scrape

pytestmark = pytest.mark.kafka


def _produce(bootstrap: str, topic: str, values: list[bytes], keys: list[bytes | None] | None = None) -> None:
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=100, batch_size=1024 * 1024, acks="all",
                      max_request_size=8 * 1024 * 1024)
    for i, v in enumerate(values):
        p.send(topic, key=keys[i] if keys else None, value=v)
    p.flush(60)
    p.close()


def _drain(bootstrap: str, topic: str, expect: int, timeout_s: float = 60) -> list:
    from kafka import KafkaConsumer

    c = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False,
                      group_id=None, consumer_timeout_ms=3000)
    out, deadline = [], time.time() + timeout_s
    while len(out) < expect and time.time() < deadline:
        for m in c:
            out.append(m)
            if len(out) >= expect:
                break
    # read a little longer to catch unexpected extra records
    c.config["consumer_timeout_ms"] = 1500
    out += list(c)
    c.close()
    return out


def _committed(bootstrap: str, group: str, topic: str) -> int:
    from kafka import KafkaConsumer
    from kafka.structs import TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return c.committed(TopicPartition(topic, 0)) or 0
    finally:
        c.close(autocommit=False)


def _wait_metric(port: int, name: str, target: float, timeout_s: float, proc=None) -> float:
    deadline, value = time.time() + timeout_s, -1.0
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"sidecar exited with {proc.returncode}")
        try:
            value = metric_sum(scrape(port), name)
        except OSError:
            value = -1.0
        if value >= target:
            return value
        time.sleep(0.3)
    return value


def test_kill9_mid_stream_then_restart_loses_nothing_and_counts_once(fresh_kafka_broker, tmp_path):
    broker = fresh_kafka_broker
    topic, dlq, group = "samples", "samples-dlq", f"g-{uuid.uuid4().hex[:6]}"
    broker.create_topic(topic)
    samples = SampleStream(seed=21, arm="candidate").take(5000)
    values = [json.dumps(s).encode() for s in samples]
    values += [json.dumps(s).encode() for s in samples[100:400]]  # producer retries: duplicate request ids
    values += [b"{broken" for _ in range(100)]
    _produce(broker.bootstrap, topic, values)
    cfg = tmp_path / "sidecar.yaml"
    cfg.write_text(yaml.safe_dump({"monitor": FAST_MONITOR, "commit_interval_s": 0.3, "max_poll_records": 200}))
    port = free_port()
    cmd = [sys.executable, "-m", "quality_sidecar.cli", "run", "--source", f"kafka://{broker.bootstrap}/{topic}",
           "--group", group, "--dlq", f"kafka://{broker.bootstrap}/{dlq}", "--http-port", str(port),
           "--config", str(cfg), "--state", str(tmp_path / "state.json")]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p1 = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        seen = _wait_metric(port, "quality_sidecar_samples_total", 1500, 120, p1)
        assert seen >= 1500, "sidecar made no progress"
        p1.send_signal(signal.SIGKILL)
        p1.wait(10)
    finally:
        if p1.poll() is None:
            p1.kill()
    assert seen < 5000, "the stream finished before the kill: the test proves nothing"
    p2 = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        done = _wait_metric(port, "quality_sidecar_samples_total", 5000, 180, p2)
        time.sleep(1.5)  # anything double-counted would show up now
        text = scrape(port)
        assert metric_sum(text, "quality_sidecar_samples_total") == 5000 == done
        assert metric_sum(text, "quality_sidecar_dlq_total") == 100
        urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5)
        p2.send_signal(signal.SIGTERM)  # graceful: commits what it processed
        assert p2.wait(30) == 0
    finally:
        if p2.poll() is None:
            p2.kill()
    assert _committed(broker.bootstrap, group, topic) == len(values)
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["pipeline"]["counts"]["samples"] == 5000
    assert state["pipeline"]["counts"]["duplicates"] == 300
    dlq_rows = _drain(broker.bootstrap, dlq, 100)
    # The DLQ topic is at-least-once: a record may repeat after the crash, but every bad input is there.
    offsets = {json.loads(m.value)["source"]["offset"] for m in dlq_rows}
    assert offsets == set(range(5300, 5400))


def _serve(svc: Service, stop: threading.Event) -> threading.Thread:
    def loop():
        last = time.monotonic()
        while not stop.is_set():
            svc.step(0.2)
            if time.monotonic() - last > 0.3:
                svc.checkpoint()
                last = time.monotonic()
        svc.checkpoint()
        svc.close()

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    return th


def test_10k_fuzzed_messages_all_reach_the_dlq_and_the_consumer_lives(kafka_broker):
    topic, dlq = f"fz-{uuid.uuid4().hex[:6]}", f"fz-dlq-{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(topic)
    _produce(kafka_broker.bootstrap, topic, fuzz_messages(10_000, seed=7))
    cfg = ServiceConfig.from_dict({"source": f"kafka://{kafka_broker.bootstrap}/{topic}", "group": "fz",
                                   "dlq": f"kafka://{kafka_broker.bootstrap}/{dlq}", "progress": False,
                                   "monitor": FAST_MONITOR})
    port = free_port()
    svc = Service(cfg, http_port=port)
    stop = threading.Event()
    th = _serve(svc, stop)
    try:
        assert _wait_metric(port, "quality_sidecar_dlq_total", 10_000, 120) == 10_000
        good = SampleStream(seed=8).take(20)
        _produce(kafka_broker.bootstrap, topic, [json.dumps(s).encode() for s in good])
        assert _wait_metric(port, "quality_sidecar_samples_total", 20, 60) == 20  # still consuming
        text = scrape(port)
        assert metric_sum(text, "quality_sidecar_dlq_total", reason="invalid_json") > 0
        assert metric_sum(text, "quality_sidecar_dlq_total", reason="schema") > 0
    finally:
        stop.set()
        th.join(30)
    rows = _drain(kafka_broker.bootstrap, dlq, 10_000)
    assert len(rows) == 10_000
    assert all(json.loads(m.value)["reason"] for m in rows)


def test_injected_regression_alarms_on_the_alerts_topic_clean_arm_stays_quiet(kafka_broker):
    topic, alerts = f"rg-{uuid.uuid4().hex[:6]}", f"alerts-{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(topic)
    base, cand = SampleStream(seed=31, arm="baseline"), SampleStream(seed=32, arm="candidate")
    msgs = [s for pair in zip(base.take(800), cand.take(800)) for s in pair]
    cand.regression = "truncation"
    msgs += [s for pair in zip(base.take(1500), cand.take(1500)) for s in pair]
    _produce(kafka_broker.bootstrap, topic, [json.dumps(s).encode() for s in msgs])
    cfg = ServiceConfig.from_dict({"source": f"kafka://{kafka_broker.bootstrap}/{topic}", "group": "rg",
                                   "alerts": f"kafka://{kafka_broker.bootstrap}/{alerts}", "progress": False,
                                   "monitor": FAST_MONITOR})
    port = free_port()
    svc = Service(cfg, http_port=port)
    stop = threading.Event()
    th = _serve(svc, stop)
    try:
        assert _wait_metric(port, "quality_sidecar_samples_total", len(msgs), 240) == len(msgs)
        time.sleep(1.0)
        text = scrape(port)
    finally:
        stop.set()
        th.join(30)
    events = [json.loads(m.value) for m in _drain(kafka_broker.bootstrap, alerts, 1, timeout_s=20)]
    fired = {(e["detector"], e["arm"]) for e in events}
    assert ("truncated", "candidate") in fired
    assert not any(arm == "baseline" for _, arm in fired), fired
    ev = next(e for e in events if e["detector"] == "truncated")
    assert ev["example_trace_ids"] and ev["action"]
    assert metric_sum(text, "quality_sidecar_alarm", detector="truncated", arm="candidate") == 1
    assert metric_sum(text, "quality_sidecar_alarm", detector="truncated", arm="baseline") == 0


def test_a_lagging_topic_is_scored_whole_under_backpressure(kafka_broker, tmp_path):
    """1,000 T>0 samples of lag on a real topic, a slow baseline server (the toy model of
    ``toy_baseline.py``: slowness on cue is the injected fault) and a 16-sample scorer queue: the
    consumer pauses its partition instead of dropping, every selected sample is scored, the committed
    offset reaches the end only once the last one is, and the impossible-token chart alarms on the
    candidate that ignores top-p at every other position while the exact baseline arm stays silent."""
    import numpy as np

    from quality_sidecar.detectors.conformance_scoring import SamplerParams

    from .toy_baseline import ToyServer, V, sample

    topic, group = f"lag-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(topic)
    rng = np.random.default_rng(11)
    nucleus = SamplerParams(1.0, top_p=0.9)
    samples = [sample(rng, nucleus, arm="baseline" if i % 2 == 0 else "candidate",
                      ignore_truncation_every=2 if i % 2 else 0) for i in range(1000)]
    _produce(kafka_broker.bootstrap, topic, [json.dumps(s).encode() for s in samples])
    toy = ToyServer()
    toy.delay_s = 0.003
    cfg = ServiceConfig.from_dict({
        "source": f"kafka://{kafka_broker.bootstrap}/{topic}", "group": group, "progress": False,
        "baseline_url": toy.url, "replay_fraction": 0.0, "max_poll_records": 200, "commit_interval_s": 0.3,
        "state_path": str(tmp_path / "state.json"),
        "conformance": {"fraction": 0.5, "max_queue": 16, "vocab_size": V}})
    svc = Service(cfg, http_port=0)
    port, stop = svc.http.port, threading.Event()
    paused = []
    orig = svc._backpressure

    def watch() -> bool:
        b = orig()
        paused.append(b)
        return b

    svc._backpressure = watch
    th = _serve(svc, stop)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and _committed(kafka_broker.bootstrap, group, topic) < 1000:
            time.sleep(0.5)
        text = scrape(port)
    finally:
        stop.set()
        th.join(60)
        toy.close()
    assert _committed(kafka_broker.bootstrap, group, topic) == 1000
    assert any(paused), "the scorer never fell behind: the test proves nothing"
    for arm in ("baseline", "candidate"):
        sel = metric_sum(text, "quality_sidecar_conformance_selected_samples_total", arm=arm)
        assert 200 < sel < 300  # Binomial(500, 0.5)
        assert metric_sum(text, "quality_sidecar_conformance_scored_samples_total", arm=arm) == sel
    assert metric_sum(text, "quality_sidecar_impossible_tokens_total", arm="baseline") == 0
    assert metric_sum(text, "quality_sidecar_alarm", detector="impossible_tokens", arm="candidate") == 1
    assert metric_sum(text, "quality_sidecar_alarm", detector="impossible_tokens", arm="baseline") == 0
