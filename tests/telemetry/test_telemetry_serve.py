"""End to end through `vllm serve` (CPU, demo model, ngram speculation, separate EngineCore process):
a request carrying `traceparent` yields a span in a real Jaeger (OTLP gRPC) with GenAI + lookahead
attributes in the caller's trace, and a sample in a real Kafka topic keyed by the request id; then the
broker is killed and requests keep completing while every sample is counted as failed or dropped."""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections.abc import Iterator

import pytest
import requests
from telemetry_support import check_draft_mask, sampler_counts

from quality_sidecar.schema import validate_sample
from tests.support.jaeger import span_tags
from tests.support.kafka_broker import KafkaBroker
from tests.support.vllm_server import VllmServer

pytestmark = [pytest.mark.vllm, pytest.mark.kafka, pytest.mark.otlp, pytest.mark.slow]

TOPIC = "llm-samples"
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def stack(otlp_receiver, demo_model, tmp_path_factory) -> Iterator[tuple[VllmServer, KafkaBroker]]:
    """A broker of its own (the test kills it) and a telemetry-enabled vllm serve."""
    broker = KafkaBroker().start()
    broker.create_topic(TOPIC)
    server = VllmServer(
        str(demo_model),
        env={"VLLM_LOOKAHEAD_TELEMETRY": "1", "VLLM_LOOKAHEAD_SAMPLE_RATE": "1",
             "VLLM_LOOKAHEAD_SAMPLE_SINK": f"kafka://{broker.bootstrap}/{TOPIC}",
             "VLLM_LOOKAHEAD_ARM": "candidate", "VLLM_LOOKAHEAD_RELEASE": "test-release",
             "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": otlp_receiver.otlp_grpc_endpoint,
             "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc", "OTEL_METRICS_EXPORTER": "none",
             "OTEL_SERVICE_NAME": "vllm-telemetry-test", "OTEL_BSP_SCHEDULE_DELAY": "100"},
        args=["--served-model-name", "demo", "--max-model-len", "512", "--enforce-eager",
              "--seed", "0", "--speculative-config", json.dumps(SPEC)],
        workdir=str(tmp_path_factory.mktemp("serve")),
    )
    try:
        server.start()
        yield server, broker
    finally:
        server.stop()
        broker.close()


def _complete(server: VllmServer, prompt: str, traceparent: str | None = None) -> dict:
    headers = {"traceparent": traceparent} if traceparent else {}
    r = requests.post(server.url + "/v1/completions", headers=headers, timeout=120,
                      json={"model": "demo", "prompt": prompt, "max_tokens": 16, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def _samples(bootstrap: str, want: int, timeout_s: float = 30.0) -> list:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(TOPIC, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             group_id=f"t-{uuid.uuid4().hex[:8]}")
    out: list = []
    deadline = time.time() + timeout_s
    try:
        while len(out) < want and time.time() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                out.extend(batch)
    finally:
        consumer.close()
    return out


def test_traceparent_span_in_otlp_backend_and_sample_in_kafka(stack, otlp_receiver):
    server, broker = stack
    trace_id, parent_span = secrets.token_hex(16), secrets.token_hex(8)
    prompt = "def fibonacci(n):\n    "
    resp = _complete(server, prompt, f"00-{trace_id}-{parent_span}-01")

    trace = otlp_receiver.wait_for_trace(trace_id, predicate=lambda t: any(
        s["operationName"] == "text_completion demo" for s in t["spans"]))
    span = next(s for s in trace["spans"] if s["operationName"] == "text_completion demo")
    assert span["traceID"] == trace_id
    assert {"refType": "CHILD_OF", "traceID": trace_id, "spanID": parent_span} in [
        {k: r[k] for k in ("refType", "traceID", "spanID")} for r in span["references"]]
    tags = span_tags(span)
    usage = resp["usage"]
    assert tags["gen_ai.operation.name"] == "text_completion"
    assert tags["gen_ai.provider.name"] == "vllm"
    assert tags["gen_ai.request.model"] == "demo"
    assert tags["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert tags["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert json.loads(tags["gen_ai.response.finish_reasons"]) == [resp["choices"][0]["finish_reason"]]
    assert tags["gen_ai.request.max_tokens"] == 16 and tags["gen_ai.request.temperature"] == 0
    assert tags["gen_ai.latency.time_to_first_token"] > 0
    assert tags["gen_ai.latency.e2e"] >= tags["gen_ai.latency.time_to_first_token"]
    assert tags["vllm_lookahead.decoder.method"] == "ngram" and tags["vllm_lookahead.decoder.k"] == 3
    # vLLM's per-request spec-decode counters were switched on by the plugin in the EngineCore process
    spec = resp["metrics"]["speculative_decoding"]
    assert tags["vllm_lookahead.spec.draft_tokens"] == spec["num_draft_tokens"]
    assert tags["vllm_lookahead.spec.accepted_tokens"] == spec["num_accepted_draft_tokens"]
    assert "fibonacci" not in json.dumps(span)  # no prompt text in spans by default

    samples = [r for r in _samples(broker.bootstrap, 1) if json.loads(r.value)["trace_id"] == trace_id]
    assert len(samples) == 1
    sample = json.loads(samples[0].value)
    validate_sample(sample)
    assert samples[0].key.decode() == sample["request_id"] == tags["gen_ai.response.id"]
    assert sample["request_id"].startswith(resp["id"])
    assert sample["span_id"] == span["spanID"]
    assert sample["prompt"]["text"] == prompt and sample["output"]["text"] == resp["choices"][0]["text"]
    assert sample["deployment"]["arm"] == "candidate"
    assert sample["deployment"]["release"] == "test-release"
    assert sample["spec"]["num_draft_tokens"] == spec["num_draft_tokens"]
    check_draft_mask(sample["spec"]["draft_mask"], sample["output"]["num_tokens"], spec)  # EngineCore patched
    assert sample["decoder"] == {"method": "ngram", "params": {"k": 3, "prompt_lookup_min": 1,
                                                               "prompt_lookup_max": 3},
                                 "plugin_version": sample["decoder"]["plugin_version"],
                                 "vllm_version": "0.32.0", "dtype": "float32",  # vllm-lookahead serve's default
                                 "seeded_exact": False}  # ngram verifies by rejection sampling: a seed does not reproduce


def _wait_counts(server: VllmServer, cond, timeout_s: float) -> dict[str, float]:
    deadline = time.time() + timeout_s
    counts = sampler_counts(server.metrics())
    while not cond(counts) and time.time() < deadline:
        time.sleep(0.5)
        counts = sampler_counts(server.metrics())
    return counts


def test_broker_killed_requests_complete_samples_counted(stack, otlp_receiver):
    server, broker = stack
    # every earlier sample delivered first, so the deltas below belong to this test
    before = _wait_counts(server, lambda c: c["sent"] == c["sampled"], 30)
    assert before["sent"] == before["sampled"], before

    broker.kill()
    n = 12
    trace_id = secrets.token_hex(16)
    for i in range(n):
        _complete(server, f"# request {i} while Kafka is down\nimport ")
    after = _wait_counts(server, lambda c: c["sent"] + c["failed"] + c["dropped"] == c["sampled"], 45)
    assert after["sampled"] - before["sampled"] == n
    assert after["sent"] == before["sent"]
    lost = (after["failed"] - before["failed"]) + (after["dropped"] - before["dropped"])
    assert lost == n, (before, after)
    # spans do not depend on Kafka: a request's span still reaches Jaeger
    _complete(server, "import os\n", f"00-{trace_id}-{secrets.token_hex(8)}-01")
    assert otlp_receiver.wait_for_trace(trace_id)["spans"]
    assert server.proc is not None and server.proc.poll() is None  # the server is still up
