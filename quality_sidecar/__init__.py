"""Quality sidecar: consumes output samples (schema v1), classifies behaviour, detects drift, alarms.

Never imports vLLM or vllm_lookahead (dependencies point one way).  Entry points:
``quality_sidecar.cli:main`` (console script ``quality-sidecar``), ``quality_sidecar.classifiers``
and ``quality_sidecar.detectors`` (also used by the release gate).  User docs: docs/sidecar.md.
"""

__version__ = "0.1.0"
