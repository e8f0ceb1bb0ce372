"""Constants and helpers of the real-model tier (imported by its conftest and tests)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = "smollm2-135m-instruct"
SUMS = ROOT / "models" / f"{NAME}.sha256"

# Chat-formatted prompts (the model's own template is applied by vLLM): questions, instructions, and
# requests that quote text or code to rework, where copying from the prompt pays off.
CHAT_PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that reverses a string.",
    "Give me three tips for staying focused while studying.",
    "Explain what a hash table is to a beginner.",
    "Translate to French: 'The weather is nice today and I want to go for a walk.'",
    "Rewrite this code with a for loop instead of a while loop:\n\ni = 0\nwhile i < 10:\n    print(i)\n    i += 1",
    "Summarize: The mitochondria is the powerhouse of the cell. It produces energy in the form of ATP "
    "through cellular respiration, and it has its own DNA, which is inherited from the mother.",
    "List the planets of the solar system in order from the Sun.",
    "Fix the bug in this function:\n\ndef add(a, b):\n    return a - b",
    "Write a haiku about the ocean.",
    "What are the benefits of regular exercise?",
    "Convert this list to JSON: name Alice, age 30, city Paris.",
]


def real_model_dir() -> Path:
    """Where scripts/setup_real_model.sh puts the converted model (same variables as the script)."""
    if os.environ.get("VLLM_LOOKAHEAD_REAL_MODEL"):
        return Path(os.environ["VLLM_LOOKAHEAD_REAL_MODEL"])
    cache = Path(os.environ.get("VLLM_LOOKAHEAD_CACHE", Path.home() / ".cache" / "vllm-lookahead"))
    return cache / "real-models" / NAME


def chat_messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]
