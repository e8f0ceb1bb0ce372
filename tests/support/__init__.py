"""Helpers for tests and benchmarks: the checkout's paths and pinned tools, and real services (Kafka,
Jaeger, a vLLM server, a Kubernetes control plane) started from the cached builds of
``scripts/setup.sh``, and synthetic schema-v1 sample streams (``synth``).  Test-only: not part of the
installed package."""
