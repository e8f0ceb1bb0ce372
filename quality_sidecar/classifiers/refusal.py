"""Refusal detection: explicit patterns OR a scikit-learn text classifier.

The model (word 1-2 gram TF-IDF + logistic regression, liblinear, so training is deterministic) is
trained at load time from the shipped dataset ``data/refusal_v1.jsonl`` (~3k rows, < 1 s; built by
scripts/gen_refusal_data.py), so the repository ships data and code, never a pickle that could drift
from them.  Only the first 400
characters are scored: refusals are stated up front, and it keeps the hot path cheap.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from .base import Verdict

DATA_FILE = Path(__file__).resolve().parent.parent / "data" / "refusal_v1.jsonl"

HEAD_CHARS = 400
PATTERN = re.compile(
    r"^\W*(?:(?:i'?m|i am)\s+(?:really\s+)?sorry|i apologi[sz]e|sorry|unfortunately|regrettably|"
    r"as an ai(?: language model| assistant)?|my apologies|i'?m afraid)\b[^.\n]{0,40}?\b"
    r"(?:can(?:'|no)?t|cannot|unable|won'?t|will not|not able|must decline|refuse)\b"
    r"(?![^.\n]{0,30}\b(?:stress|wait|believe)\b)",
    re.I,
)
STANDALONE = re.compile(r"^\W*(?:i (?:refuse|must decline|cannot and will not)|no, i won'?t)\b", re.I)


def load_dataset() -> list[dict]:
    with DATA_FILE.open() as fh:
        return [json.loads(line) for line in fh if line.strip()]


@lru_cache(maxsize=1)
def train_model(split: str = "train"):
    """Fit the TF-IDF + logistic-regression pipeline on the given split (``all`` = every row)."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    rows = [r for r in load_dataset() if split == "all" or r["split"] == split]
    texts = [r["text"][:HEAD_CHARS] for r in rows]
    labels = [r["label"] for r in rows]
    model = make_pipeline(
        TfidfVectorizer(ngram_range=(1, 2), lowercase=True, sublinear_tf=True, min_df=2),
        LogisticRegression(C=4.0, solver="liblinear", class_weight="balanced"),
    )
    model.fit(texts, labels)
    return model


class RefusalClassifier:
    """Flags refusals; ``score`` is the model probability (1.0 on an explicit-pattern hit)."""

    name = "refusal"

    def __init__(self, model: Any = None, threshold: float = 0.5):
        self.model = model if model is not None else train_model("all")
        self.threshold = threshold

    def classify(self, text: str | None, *, prompt: str | None = None,
                 response_format: dict[str, Any] | None = None,
                 finish_reason: str | None = None) -> Verdict:
        return self.classify_batch([text], [prompt], [response_format], [finish_reason])[0]

    def classify_batch(self, texts: Sequence[str | None], prompts: Sequence[str | None] = (),
                       response_formats: Sequence[Any] = (), finish_reasons: Sequence[Any] = ()) -> list[Verdict]:
        heads = [(t or "")[:HEAD_CHARS] for t in texts]
        probs = self.model.predict_proba(heads)[:, 1] if heads else []
        out = []
        for head, p in zip(heads, probs):
            if not head.strip():
                out.append(Verdict(self.name, False, 0.0, "empty"))
            elif PATTERN.search(head) or STANDALONE.search(head):
                out.append(Verdict(self.name, True, 1.0, f"pattern; model p={p:.2f}"))
            else:
                out.append(Verdict(self.name, bool(p >= self.threshold), float(p), f"model p={p:.2f}"))
        return out
