"""The chart's sidecar command, environment and probes work against the real sidecar and a real broker.

The chart is rendered with the test broker as `kafka.bootstrapServers`. The real `quality-sidecar`
is then started with exactly the rendered command, args and env; only the config and state paths
are moved to a temp dir, because /etc and /var/lib are not writable here. The test checks that:
- the rendered readiness and liveness probe paths answer 200;
- samples produced to the rendered topic are counted;
- every quality_sidecar_* metric the PrometheusRule and dashboard query is exported.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from helm_chart_support import component, container_env

from tests.support.process import free_port

pytestmark = [pytest.mark.helm, pytest.mark.kafka]



def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError:
        return 0, ""


def _wait(pred, timeout: float, what: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        if proc.poll() is not None:
            break
        time.sleep(0.25)
    raise AssertionError(
        f"{what} not reached in {timeout:.0f} s (rc={proc.poll()}):\n{log.read_text()[-3000:]}"
    )


def _quality_metrics_queried(render_docs) -> set[str]:
    text = json.dumps([d for d in render_docs if d["kind"] in ("PrometheusRule", "ConfigMap")])
    return set(re.findall(r"\b(quality_sidecar_[a-z_]+?)(?:_bucket)?\b", text))


def test_rendered_sidecar_runs_and_answers_probes(render, kafka_broker, tmp_path: Path) -> None:
    from kafka import KafkaProducer

    from tests.support.synth import SampleStream

    port, topic = free_port(), f"helm-live-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic)
    docs = render(
        None,
        "--set", f"kafka.bootstrapServers[0]={kafka_broker.bootstrap}",
        "--set", f"kafka.topics.samples={topic}",
        "--set", f"kafka.topics.dlq={topic}-dlq",
        "--set", f"kafka.topics.alerts={topic}-alerts",
        "--set", f"sidecar.httpPort={port}",
        "--set", "telemetry.otel.enabled=false",
        "--set", "monitoring.skipCRDCheck=true",
    )  # fmt: skip
    c = component(docs, "Deployment", "quality-sidecar")["spec"]["template"]["spec"]["containers"][
        0
    ]
    config = tmp_path / "sidecar.yaml"
    config.write_text(component(docs, "ConfigMap", "quality-sidecar")["data"]["sidecar.yaml"])
    args = [
        a.replace("/etc/quality-sidecar/sidecar.yaml", str(config)).replace(
            "/var/lib/quality-sidecar", str(tmp_path)
        )
        for a in c["args"]
    ]
    env = dict(os.environ)
    env.update({k: e["value"] for k, e in container_env(c).items() if "value" in e})
    exe = Path(sys.executable).parent / c["command"][0]
    assert exe.exists(), f"{exe} missing: install the package (pip install -e .[sidecar])"
    log = tmp_path / "sidecar.log"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    base = f"http://127.0.0.1:{ports[c['readinessProbe']['httpGet']['port']]}"
    with log.open("w") as out:
        proc = subprocess.Popen([str(exe), *args], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        ready = base + c["readinessProbe"]["httpGet"]["path"]
        _wait(lambda: _get(ready)[0] == 200, 90, f"readiness {ready}", proc, log)
        live = base + c["livenessProbe"]["httpGet"]["path"]
        assert _get(live)[0] == 200, live

        producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
        for sample in SampleStream(seed=7).take(25):
            producer.send(topic, json.dumps(sample).encode())
        producer.flush(30)
        producer.close()

        def counted() -> bool:
            status, body = _get(base + "/metrics")
            total = sum(
                float(line.rsplit(" ", 1)[1])
                for line in body.splitlines()
                if line.startswith("quality_sidecar_samples_total{")
            )
            return status == 200 and total >= 25

        _wait(counted, 60, "25 samples counted on /metrics", proc, log)
        body = _get(base + "/metrics")[1]
        exported = set(re.findall(r"^# TYPE (quality_sidecar_[a-z_]+) ", body, re.M))
        exported |= {f"{n}_total" for n in exported}
        queried = _quality_metrics_queried(render(None, "--set", "monitoring.skipCRDCheck=true"))
        assert queried, "the rule/dashboard should query sidecar metrics"
        assert queried <= exported, f"queried but not exported: {sorted(queried - exported)}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
