"""Request-path telemetry, the plugin's frontend half (docs/telemetry.md).

On every finished request: an OpenTelemetry span + metrics (GenAI semantic conventions and
``vllm_lookahead.*`` decoder/acceptance attributes), and for a deterministic fraction of requests a
schema-v1 output sample on Kafka or a JSONL file.  The request path only snapshots and enqueues;
everything else runs on background threads that drop and count under pressure.  Entry point:
``frontend.install_if_configured()`` (off unless ``VLLM_LOOKAHEAD_TELEMETRY=1``).
"""
