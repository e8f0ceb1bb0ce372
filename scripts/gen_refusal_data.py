#!/usr/bin/env python3
"""Builds the labelled refusal dataset shipped as ``quality_sidecar/data/refusal_v1.jsonl`` (the refusal
classifier trains on it when it loads, quality_sidecar/classifiers/refusal.py).

How it is built (deterministic, seed 20261130): refusals are composed from opener x refusal verb x
topic x reason x optional alternative offer; non-refusals are code continuations, explanations and
answers, including *hard negatives* that use refusal vocabulary without refusing ("Sorry for the
confusion, here is the fixed loop", "the parser cannot handle tabs, so strip them first").  Every
row carries a ``family`` (the template family) and a ``split``: whole families of openers, topics
and answer templates are held out for the test split, so the reported precision/recall measure
generalisation to unseen phrasings, not memorisation.  It is synthetic: the numbers say how well the
model separates these phrasings, not how it does on a real model's traffic (see docs/sidecar.md).

    python scripts/gen_refusal_data.py          # rewrite the JSONL
    python scripts/gen_refusal_data.py --check  # exit 1 if it is not what this script builds
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

SEED = 20261130
DATA_FILE = Path(__file__).resolve().parents[1] / "quality_sidecar" / "data" / "refusal_v1.jsonl"

OPENERS = [
    "I'm sorry, but", "I apologize, but", "Sorry, but", "Unfortunately,", "I'm afraid", "As an AI language model,",
    "As an AI assistant,", "I understand your request, but", "Thanks for asking, but", "Regrettably,",
    "I'm really sorry, but", "My apologies, but", "With respect,", "I have to be honest:", "",
]
REFUSE = [
    "I can't help with", "I cannot assist with", "I won't be able to help with", "I am unable to provide",
    "I can't provide", "I must decline to help with", "I'm not able to assist with", "I cannot comply with",
    "I won't write", "I can't write", "I am not able to create", "I cannot generate", "I will not produce",
    "I can't do", "I'm unable to fulfil", "I can not help you with",
]
TOPICS = [
    "that request", "writing malware", "creating a phishing email", "bypassing authentication",
    "scraping personal data", "this task", "hacking into an account", "generating that content",
    "instructions for making weapons", "code that exploits this vulnerability", "cracking passwords",
    "a keylogger", "evading antivirus detection", "doxxing someone", "a script that spams users",
    "disabling the license check", "accessing someone else's email", "that kind of code",
]
REASONS = [
    "", " as it could be used to cause harm.", " because it violates my guidelines.",
    " since it may be illegal.", " because it goes against my usage policies.", " as it is unethical.",
    " because it could compromise security.", " due to safety concerns.", " for privacy reasons.",
    " because that would be irresponsible.",
]
OFFERS = [
    "", " Is there something else I can help you with?", " I'd be happy to help with a legitimate use case instead.",
    " If you have a different question, feel free to ask.", " I can explain how to defend against it, though.",
    " Let me know if I can help with anything else.", " Perhaps I can help you with a safer alternative.",
]
STANDALONE_REFUSALS = [
    "No, I won't do that.", "I refuse to answer that.", "That's not something I can help with.",
    "I'm not comfortable helping with this.", "This request is against my policy, so I have to decline.",
    "I cannot and will not provide that information.", "Sorry, I can't share that.",
    "I'd rather not help with that one.", "That falls outside what I'm allowed to do.",
    "I'm going to have to pass on this request.",
]

CODE_LINES = [
    "def {f}({a}):\n    return {a} * 2\n", "for {a} in range(10):\n    print({a})\n",
    "    if {a} is None:\n        raise ValueError('{a} cannot be None')\n",
    "import os\n\npath = os.path.join('data', '{f}.txt')\n", "class {F}:\n    def __init__(self, {a}):\n        self.{a} = {a}\n",
    "    result = [{a} for {a} in items if {a}]\n    return result\n", "try:\n    {f}()\nexcept OSError:\n    pass\n",
    "    # cannot use a set here because order matters\n    seen = []\n", "{a} = {{}}\nfor k, v in pairs:\n    {a}[k] = v\n",
    "    while {a} < n:\n        {a} += 1\n", "with open(fname) as fh:\n    {a} = fh.read()\n",
    "def test_{f}():\n    assert {f}(2) == 4\n", "    return sorted({a}, key=len)\n",
]
ANSWERS = [
    "The function {f} returns the doubled value of {a}.", "You can use a dictionary to count occurrences of {a}.",
    "Here is the implementation of {f}:", "Sure! Here's how to write {f} in Python.",
    "Sorry for the confusion earlier, here is the corrected version of {f}:",
    "I can't stress enough how useful list comprehensions are for {a}.",
    "The parser cannot handle tabs, so strip them from {a} first.",
    "If the file is unable to open, {f} raises an OSError.", "Unfortunately the API does not support {a}, so use a loop.",
    "I'm sorry to hear the build failed; try reinstalling the package that provides {f}.",
    "You cannot modify a tuple in place, but you can create a new one from {a}.",
    "Great question. {f} is O(n log n) because it sorts {a}.", "No problem, I will refactor {f} to avoid globals.",
    "As an example, {f}([3, 1, 2]) returns [1, 2, 3].", "I won't go into the details of {a}, but the key idea is caching.",
    "The error means {a} was never defined before {f} was called.", "To fix this, declare {a} before the loop.",
    "I declined the pull request because {f} lacked tests.", "This is unsafe for threads; protect {a} with a lock.",
    "Refusing connections usually means the server behind {f} is down.",
]
NAMES_F = ["parse", "load_config", "merge", "tokenize", "fetch", "normalize", "render", "compute_total", "split_words"]
NAMES_A = ["items", "value", "counter", "buffer", "node", "record", "line", "key", "payload"]

# Families held out for the test split (never seen in training).
TEST_OPENERS = {"Regrettably,", "With respect,", "My apologies, but"}
TEST_REFUSE = {"I'm unable to fulfil", "I can not help you with", "I will not produce"}
TEST_TOPICS = {"cracking passwords", "doxxing someone", "disabling the license check"}
TEST_ANSWER_IDX = {4, 9, 17, 19}
TEST_CODE_IDX = {3, 10}


def build(seed: int = SEED, n_refusals: int = 1400, n_plain: int = 1800) -> list[dict]:
    rng = random.Random(seed)
    rows: list[dict] = []
    for _ in range(n_refusals):
        if rng.random() < 0.12:
            i = rng.randrange(len(STANDALONE_REFUSALS))
            text = STANDALONE_REFUSALS[i]
            test = i >= 8
            family = f"standalone{i}"
        else:
            o, r, t = rng.choice(OPENERS), rng.choice(REFUSE), rng.choice(TOPICS)
            text = f"{o} {r} {t}".strip() + (rng.choice(REASONS) or ".") + rng.choice(OFFERS)
            test = o in TEST_OPENERS or r in TEST_REFUSE or t in TEST_TOPICS
            family = f"refusal:{o}|{r}"
        rows.append({"text": text, "label": 1, "family": family, "split": "test" if test else "train"})
    for _ in range(n_plain):
        f, a = rng.choice(NAMES_F), rng.choice(NAMES_A)
        kind = rng.random()
        if kind < 0.45:
            i = rng.randrange(len(CODE_LINES))
            body = "".join(rng.choice(CODE_LINES) for _ in range(rng.randint(0, 2)))
            text = CODE_LINES[i].format(f=f, a=a, F=f.title().replace("_", "")) + body.format(
                f=f, a=a, F=f.title().replace("_", ""))
            test, family = i in TEST_CODE_IDX, f"code{i}"
        else:
            i = rng.randrange(len(ANSWERS))
            text = ANSWERS[i].format(f=f, a=a)
            if rng.random() < 0.5:
                text += "\n" + rng.choice(CODE_LINES).format(f=f, a=a, F=f.title())
            test, family = i in TEST_ANSWER_IDX, f"answer{i}"
        rows.append({"text": text, "label": 0, "family": family, "split": "test" if test else "train"})
    rng.shuffle(rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=f"Build {DATA_FILE.name}.")
    ap.add_argument("--check", action="store_true", help=f"exit 1 if {DATA_FILE.name} is out of date")
    args = ap.parse_args(argv)
    text = "".join(json.dumps(row, sort_keys=True) + "\n" for row in build())
    if args.check:
        if not DATA_FILE.exists() or DATA_FILE.read_text() != text:
            print(f"{DATA_FILE} is out of date: run python scripts/gen_refusal_data.py", file=sys.stderr)
            return 1
        return 0
    DATA_FILE.write_text(text)
    print(f"wrote {text.count(chr(10))} rows to {DATA_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
