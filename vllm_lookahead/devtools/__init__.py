"""Helpers for tests and benchmarks: start real services (Kafka, Jaeger) from the cached builds
that ``scripts/setup.sh`` makes.  Not used on the serving path."""
