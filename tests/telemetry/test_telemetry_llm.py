"""vllm.LLM (offline, in-process engine) with telemetry on: the plugin entry point installs the hooks,
samples land in the JSONL file sink, spans go to a real Jaeger over OTLP/HTTP as children of the
caller's own span."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from telemetry_support import check_draft_mask

from quality_sidecar.schema import validate_sample
from tests.support.jaeger import span_tags

pytestmark = [pytest.mark.vllm, pytest.mark.otlp]

APP = Path(__file__).with_name("llm_offline_app.py")


def test_llm_offline_samples_and_spans(otlp_receiver, demo_model, tmp_path):
    samples_path = tmp_path / "samples.jsonl"
    out = tmp_path / "out.json"
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_LOOKAHEAD_TELEMETRY": "1", "VLLM_LOOKAHEAD_SAMPLE_RATE": "1",
           "VLLM_LOOKAHEAD_SAMPLE_SINK": f"file://{samples_path}",
           "VLLM_LOOKAHEAD_REDACT_PROMPTS": "1", "VLLM_LOOKAHEAD_CAPTURE_CONTENT": "1",
           "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.otlp_http_endpoint,
           "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_METRICS_EXPORTER": "none",
           "OTEL_SERVICE_NAME": "vllm-offline-test"}
    proc = subprocess.run([sys.executable, str(APP), str(demo_model), str(out)], env=env,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    outputs = {o["sample_id"]: o for o in result["outputs"]}
    assert len(outputs) == 4  # 3 requests, the last with n=2

    lines = samples_path.read_text().splitlines()
    assert len(lines) == len(outputs)
    for line in lines:
        sample = json.loads(line)
        validate_sample(sample)
        o = outputs[sample["request_id"]]  # vllm.LLM's "0", "1", ... made unique per process
        assert sample["request_id"].startswith(result["id_prefix"])
        assert sample["vllm_request_id"] == o["vllm_request_id"]
        assert sample["output"]["text"] == o["text"]
        assert sample["output"]["num_tokens"] == o["num_tokens"]
        assert sample["output"]["finish_reason"] == o["finish_reason"]
        assert sample["output"]["stop_reason"] == o["stop_reason"]
        assert sample["sampling"]["n"] == o["n"]
        assert sample["output"].get("index") == (o["index"] if o["n"] > 1 else None)
        assert sample["prompt"]["text"] is None and sample["prompt"]["redacted"]  # redaction on
        assert sample["decoder"]["method"] == "ngram"
        assert sample["decoder"]["dtype"] == result["dtype"]  # the engine's model config, "torch." dropped
        assert sample["decoder"]["seeded_exact"] is False  # ngram: vLLM's rejection sampler draws differently
        # vLLM has no spec counters for a request that stopped before any verification step
        assert (sample["spec"] or {}).get("num_draft_tokens") == (o["spec"] or {}).get("num_draft_tokens"), o
        if sample["spec"]:  # which tokens were drafted: one character per output token, steps in order
            check_draft_mask(sample["spec"]["draft_mask"], sample["output"]["num_tokens"], o["spec"])
        assert sample["trace_id"] == result["trace_id"]
        assert sample["time"]["ttft_s"] is not None  # first-token time tracked without vLLM stats
    assert result["stats"]["sent"] == len(outputs) and result["stats"]["sampled"] == len(outputs)
    # the stop string request stopped on it, and the sample says so
    assert [o["stop_reason"] for o in outputs.values() if o["vllm_request_id"] == "0"] == ["\n"]
    # both choices of the n=2 request, each with its own output
    assert sorted(o["index"] for o in outputs.values() if o["n"] == 2) == [0, 1]

    trace = otlp_receiver.wait_for_trace(result["trace_id"], min_spans=len(outputs))
    ours = [s for s in trace["spans"] if s["operationName"].startswith("text_completion")]
    assert len(ours) == len(outputs)
    for span in ours:
        assert [r["spanID"] for r in span["references"]] == [result["span_id"]]
        tags = span_tags(span)
        assert tags["span.kind"] == "internal"  # child of a local span, not a server entry point
        o = outputs[tags["gen_ai.response.id"]]
        # semconv: choice count present when n != 1
        assert tags.get("gen_ai.request.choice.count") == (2 if o["n"] == 2 else None)
        # content capture is opt-in and on here: the output text is in the span
        messages = json.loads(tags["gen_ai.output.messages"])
        assert messages[0]["parts"][0]["content"] == o["text"]


@pytest.mark.kafka
def test_two_offline_jobs_on_one_topic_are_both_counted_by_the_sidecar(kafka_broker, demo_model,
                                                                     tmp_path):
    """Two vllm.LLM processes (arms baseline and candidate) write to one Kafka topic: vLLM numbers
    both jobs' requests "0", "1", ...; the per-process id prefix keeps every sample distinct, so the
    real sidecar counts all of them and drops none as a duplicate."""
    import time
    import uuid

    from quality_sidecar.service import Service, ServiceConfig

    topic = f"offline-{uuid.uuid4().hex[:8]}"  # auto-created by the first send
    procs = []
    for arm in ("baseline", "candidate"):
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
               "VLLM_LOOKAHEAD_TELEMETRY": "1", "VLLM_LOOKAHEAD_SAMPLE_RATE": "1",
               "VLLM_LOOKAHEAD_OTEL": "0", "VLLM_LOOKAHEAD_ARM": arm,
               "VLLM_LOOKAHEAD_SAMPLE_SINK": f"kafka://{kafka_broker.bootstrap}/{topic}"}
        procs.append(subprocess.Popen([sys.executable, str(APP), str(demo_model), str(tmp_path / f"{arm}.json")],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=500)
        assert p.returncode == 0, err[-4000:]
    results = [json.loads((tmp_path / f"{arm}.json").read_text()) for arm in ("baseline", "candidate")]
    assert results[0]["id_prefix"] != results[1]["id_prefix"]
    for r in results:
        assert (r["stats"]["sent"], r["stats"]["failed"]) == (4, 0), r["stats"]
    expected = {o["sample_id"] for r in results for o in r["outputs"]}
    # the same vLLM ids in both jobs: without the prefix these would collide
    assert {o["vllm_request_id"] for o in results[0]["outputs"]} == \
        {o["vllm_request_id"] for o in results[1]["outputs"]}

    cfg = ServiceConfig.from_dict({"source": f"kafka://{kafka_broker.bootstrap}/{topic}",
                                   "group": f"g-{topic}", "progress": False})
    svc = Service(cfg)
    try:
        deadline = time.monotonic() + 60
        counts = svc.pipeline.counts
        while counts["samples"] + counts["duplicates"] < len(expected) and time.monotonic() < deadline:
            svc.step(0.5)
        svc.step(1.0)  # anything beyond the expected samples would show up here
    finally:
        svc.close()
    assert (counts["samples"], counts["duplicates"], counts["dlq"]) == (8, 0, 0), counts
    assert svc.pipeline.seen.keys() == expected
    arms = {arm for (_model, arm) in svc.pipeline.charts.streams}
    assert arms == {"baseline", "candidate"}

