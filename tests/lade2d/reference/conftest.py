"""Fixtures for the reference-decoder tests: a tiny random-weight Llama built in-process (float32).

A random model is the right tool for property tests: it is fast, and its outputs are arbitrary, so
any mask/position/KV mistake shows up as a changed argmax.  The trained demo model (``demo_model``
from tests/conftest.py) is used for the held-out-prompt exactness tests.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build_tiny_llama(seed: int = 0, vocab: int = 48, init_range: float = 0.3) -> LlamaForCausalLM:
    """2 layers, hidden 32, 4 query heads over 2 KV heads (exercises GQA), float32, eval mode.

    ``init_range`` is larger than usual so logits are well separated (no near-ties that float noise
    could flip) and the small vocabulary makes the output repetitive enough for candidates to hit.
    """
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        initializer_range=init_range,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.eval()
    return model


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """Run these tests on one intra-op thread, then restore the setting.

    Module scope (autouse fixtures come first within their scope) so that the module-scoped model
    and greedy-output fixtures run on one thread too.

    Why: on the shared 2-core CI machine, torch's default thread pool oversubscribes the cores and
    makes the many tiny matmuls of a decoder 20-80x slower; one thread keeps this suite in budget.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_llama() -> LlamaForCausalLM:
    return build_tiny_llama()
