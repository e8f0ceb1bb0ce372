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

from quality_sidecar.schema import validate_sample
from vllm_lookahead.devtools.jaeger import span_tags

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
    outputs = {o["request_id"]: o for o in result["outputs"]}

    lines = samples_path.read_text().splitlines()
    assert len(lines) == len(outputs)
    for line in lines:
        sample = json.loads(line)
        validate_sample(sample)
        o = outputs[sample["request_id"]]
        assert sample["output"]["text"] == o["text"]
        assert sample["output"]["num_tokens"] == o["num_tokens"]
        assert sample["prompt"]["text"] is None and sample["prompt"]["redacted"]  # redaction on
        assert sample["decoder"]["method"] == "ngram"
        assert sample["spec"]["num_draft_tokens"] == o["spec"]["num_draft_tokens"]
        assert sample["trace_id"] == result["trace_id"]
        assert sample["time"]["ttft_s"] is not None  # first-token time tracked without vLLM stats
    assert result["stats"]["sent"] == len(outputs) and result["stats"]["sampled"] == len(outputs)

    trace = otlp_receiver.wait_for_trace(result["trace_id"], min_spans=len(outputs))
    ours = [s for s in trace["spans"] if s["operationName"].startswith("text_completion")]
    assert len(ours) == len(outputs)
    for span in ours:
        assert [r["spanID"] for r in span["references"]] == [result["span_id"]]
        tags = span_tags(span)
        assert tags["span.kind"] == "internal"  # child of a local span, not a server entry point
        # content capture is opt-in and on here: the output text is in the span
        messages = json.loads(tags["gen_ai.output.messages"])
        assert messages[0]["parts"][0]["content"] == outputs[tags["gen_ai.response.id"]]["text"]
