"""``benchmarks/real_model_prompts.py``: what the real-model speed files rest on.

Every prompt must be distinct: ``bench`` gives each method a fresh engine, but within a run a repeated
prompt would let lookahead's output memory draft the earlier answer, a speed-up no user sees.  And
``--n-open 12 --n-copy 20`` must still write the 32 messages of ``real_model_speed_r4/r5.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import real_model_prompts  # noqa: E402


def test_default_set_is_64_distinct_messages_half_open() -> None:
    n = len(real_model_prompts.OPEN)
    msgs = real_model_prompts.messages(n, n)
    assert len(msgs) == 64 and len(set(msgs)) == 64
    assert msgs[:n] == real_model_prompts.OPEN


def test_the_32_message_set_of_earlier_runs_is_a_prefix_pair() -> None:
    old = real_model_prompts.messages(12, 20)
    new = real_model_prompts.messages(len(real_model_prompts.OPEN), len(real_model_prompts.OPEN))
    assert len(set(old)) == 32
    assert old[:12] == new[:12] and old[12:] == new[32:52]  # same open and copy messages, same order


def test_more_messages_than_exist_is_an_error_not_a_repeat() -> None:
    with pytest.raises(ValueError, match="--n-open takes 0..32"):
        real_model_prompts.messages(33, 0)
    with pytest.raises(ValueError, match="--n-copy"):
        real_model_prompts.messages(0, 10_000)
