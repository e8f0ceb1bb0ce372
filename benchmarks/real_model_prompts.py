"""Chat-formatted prompts for benchmarking the real model (models/smollm2-135m-instruct.md) with ``bench``.

``vllm-lookahead bench`` takes raw prompt text (a JSONL with a ``prompt`` field); a chat model must see
its own template, so this script applies the model's chat template (``add_generation_prompt=True``) to
each user message and writes the JSONL.  The template's text already starts with the model's BOS
(``<|im_start|>``), and the tokenizer adds no second one, so the engine sees what the chat API sends.

Messages: general instructions and questions (no copying to exploit) plus requests that quote code or
text from the held-out stdlib eval set to explain or rework (copy-heavy), 32 of each by default: 64
prompts, so that ``bench --interleave chunks`` at batch 32 (chunks of 64 requests) refills the batch
from a queue as requests finish, as at batch 1 and 8::

    python benchmarks/real_model_prompts.py --model DIR --out .bench-work/real/real_chat64.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

OPEN = [
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that reverses a string.",
    "Give me three tips for staying focused while studying.",
    "Explain what a hash table is to a beginner.",
    "Translate to French: 'The weather is nice today and I want to go for a walk.'",
    "List the planets of the solar system in order from the Sun.",
    "Write a haiku about the ocean.",
    "What are the benefits of regular exercise?",
    "Write a short email inviting a colleague to lunch on Friday.",
    "How do I make a cup of green tea?",
    "What is the difference between a list and a tuple in Python?",
    "Give me a recipe for a simple tomato pasta.",
    "Why is the sky blue? Keep it short.",
    "Write a limerick about a cat who loves coffee.",
    "What should I pack for a three-day hiking trip?",
    "Explain recursion with a simple example.",
    "Summarize the plot of Romeo and Juliet in a few sentences.",
    "What is photosynthesis?",
    "Write a SQL query that counts the orders per customer.",
    "How can I improve my sleep?",
    "Describe a sunset over the mountains.",
    "What are the main causes of climate change?",
    "Write a thank-you note to a teacher.",
    "Explain the difference between weather and climate.",
    "Give me five ideas for a rainy weekend.",
    "How does a bicycle stay upright?",
    "Write a JavaScript function that checks whether a number is prime.",
    "What is machine learning, in simple terms?",
    "Suggest a name for a small bakery and explain why.",
    "What are good habits for saving money?",
    "Explain how a refrigerator keeps food cold.",
    "Write a short story about a robot that learns to paint.",
]
COPY_TASKS = [
    "Explain what this code does:\n\n{code}",
    "Add comments to this code:\n\n{code}",
    "Rewrite this code with clearer variable names:\n\n{code}",
]


def messages(n_open: int, n_copy: int) -> list[str]:
    """The first ``n_open`` open messages, then ``n_copy`` copy-heavy ones built from the bundled eval set's
    references."""
    items = [json.loads(x) for x in (ROOT / "vllm_lookahead/data/eval/stdlib_heldout.jsonl").read_text().splitlines()
             if x.strip()]
    codes = [(it["prompt"] + it.get("reference", "")).strip() for it in items]
    codes = [c for c in codes if 120 <= len(c) <= 700]
    if not 0 <= n_open <= len(OPEN) or not 0 <= n_copy <= len(codes):  # more would repeat a message
        raise ValueError(f"--n-open takes 0..{len(OPEN)} and --n-copy 0..{len(codes)} (got {n_open}, {n_copy})")
    out = OPEN[:n_open]
    for i in range(n_copy):
        out.append(COPY_TASKS[i % len(COPY_TASKS)].format(code=codes[(7 * i) % len(codes)]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="the converted model directory (its chat template)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n-open", type=int, default=len(OPEN), help=f"open messages (0..{len(OPEN)})")
    ap.add_argument("--n-copy", type=int, default=len(OPEN), help="copy-heavy messages")
    args = ap.parse_args()
    try:
        msgs = messages(args.n_open, args.n_copy)
    except ValueError as e:
        ap.error(str(e))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        for m in msgs:
            text = tok.apply_chat_template([{"role": "user", "content": m}], tokenize=False, add_generation_prompt=True)
            f.write(json.dumps({"prompt": text}) + "\n")
    print(args.out)


if __name__ == "__main__":
    main()
