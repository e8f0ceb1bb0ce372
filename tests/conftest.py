"""Shared fixtures: real services started once per test session.

Tiers (pytest markers, see pyproject.toml): unit, vllm, kafka, otlp, helm, helm_cluster, slow.  CI runs them all;
`pytest -m unit` is the fast loop.  Services come from the cached builds of scripts/setup.sh; a missing
tool is an error with the fix in the message, never a silent skip.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.paths import with_checkout_on_path
from vllm_lookahead.decoders import DEMO_MODEL

# Every process a test starts (a CLI, `vllm-lookahead serve` and its engine core) imports this checkout,
# the test-only fault proposers (tests.faults) included.
os.environ.update(with_checkout_on_path(dict(os.environ)))
# Keep vLLM quiet, small and in one process unless a test asks otherwise.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator:
    """A real single-node Kafka 4.x broker (KRaft) on a free loopback port, for the whole session."""
    from tests.support.kafka_broker import KafkaBroker

    broker = KafkaBroker().start()
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture
def fresh_kafka_broker() -> Iterator:
    """A broker of its own, for tests that kill, pause or restart it."""
    from tests.support.kafka_broker import KafkaBroker

    broker = KafkaBroker().start()
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture(scope="session")
def demo_model() -> Path:
    """The trained demo model shipped in models/demo-code-4l (see its model card)."""
    path = DEMO_MODEL
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} missing: it is committed; run models/train_demo_model.py to rebuild it")
    return path


@pytest.fixture(scope="session")
def engine_factory(demo_model):
    """Build an in-process engine for a decoder spec string; the caller deletes it."""
    from vllm_lookahead.decoders import parse_spec
    from vllm_lookahead.engine import make_llm

    def make(spec: str, **kw):
        kw.setdefault("max_model_len", 1024)
        kw.setdefault("max_num_seqs", 32)
        return make_llm(str(demo_model), parse_spec(spec), **kw)

    yield make
    gc.collect()
