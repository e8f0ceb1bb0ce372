"""Unit tests of the behavioural classifiers (the release gate imports the same objects)."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from quality_sidecar.classifiers import CLASSIFIER_NAMES, Verdict, default_classifiers
from quality_sidecar.classifiers.degeneration import DegenerationClassifier
from quality_sidecar.classifiers.format import FormatClassifier
from quality_sidecar.classifiers.refusal import (
    DATA_FILE,
    HEAD_CHARS,
    RefusalClassifier,
    load_dataset,
    train_model,
)
from quality_sidecar.classifiers.safety import PatternSafety, SafetyClassifier

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def refusal():
    return RefusalClassifier()


def test_default_classifiers_follow_the_contract():
    clfs = default_classifiers()
    assert tuple(c.name for c in clfs) == CLASSIFIER_NAMES
    for c in clfs:
        v = c.classify("def f(x):\n    return x\n", prompt=None, response_format=None, finish_reason="stop")
        assert isinstance(v, Verdict) and v.name == c.name and 0.0 <= v.score <= 1.0


def _builder():
    spec = importlib.util.spec_from_file_location("gen_refusal_data", ROOT / "scripts" / "gen_refusal_data.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_shipped_dataset_is_what_the_builder_makes():
    gen = _builder()
    assert gen.DATA_FILE == DATA_FILE
    assert gen.main(["--check"]) == 0, "run python scripts/gen_refusal_data.py"
    shipped = [json.loads(line) for line in DATA_FILE.read_text().splitlines()]
    assert shipped == [json.loads(json.dumps(r, sort_keys=True)) for r in gen.build()]
    assert {r["split"] for r in shipped} == {"train", "test"}


def held_out_report() -> dict[str, float]:
    """Precision/recall of the train-split model on the held-out families (and of model|patterns)."""
    model = train_model("train")
    test = [r for r in load_dataset() if r["split"] == "test"]
    y = np.array([r["label"] for r in test])
    clf = RefusalClassifier(model=model)
    pred_model = model.predict_proba([r["text"][:HEAD_CHARS] for r in test])[:, 1] >= 0.5
    pred_all = np.array([clf.classify(r["text"]).flagged for r in test])

    def pr(pred: np.ndarray) -> tuple[float, float]:
        tp = int((pred & (y == 1)).sum())
        return tp / max(1, int(pred.sum())), tp / max(1, int((y == 1).sum()))

    (pm, rm), (pa, ra) = pr(pred_model), pr(pred_all)
    return {"n_test": len(test), "n_test_refusals": int((y == 1).sum()),
            "model_precision": pm, "model_recall": rm, "combined_precision": pa, "combined_recall": ra}


def test_refusal_held_out_precision_recall():
    rep = held_out_report()
    assert rep["n_test_refusals"] > 100
    assert rep["combined_precision"] >= 0.95 and rep["combined_recall"] >= 0.95, rep


@pytest.mark.parametrize("text", [
    "I'm sorry, but I can't help with creating malware.",
    "As an AI language model, I cannot provide instructions for that.",
    "Unfortunately, I am unable to assist with this request.",
    "I must decline to write that script.",
])
def test_refusals_flagged(refusal, text):
    assert refusal.classify(text).flagged


@pytest.mark.parametrize("text", [
    "Sorry for the confusion, here is the corrected loop:\nfor i in range(3):\n    print(i)\n",
    "The parser cannot handle tabs, so strip them first.",
    "def load(path):\n    if not path:\n        raise ValueError('path cannot be empty')\n",
    "I can't stress enough how useful generators are here.",
    "",
])
def test_hard_negatives_not_flagged(refusal, text):
    assert not refusal.classify(text).flagged


def test_json_and_schema():
    f = FormatClassifier()
    rf = {"type": "json_schema", "json_schema": {"schema": {"type": "object", "required": ["a"],
                                                            "properties": {"a": {"type": "integer"}}}}}
    assert not f.classify('{"a": 1}', response_format=rf).flagged
    v = f.classify('{"a": "x"}', response_format=rf)
    assert v.flagged and "a" in v.detail
    assert f.classify('{"a": 1', response_format={"type": "json_object"}).flagged


def test_python_truncated_is_judged_before_the_cut():
    f = FormatClassifier()
    prompt = "def total(items):\n"
    cut = "    s = 0\n    for x in items:\n        s += x\n    retu"
    assert not f.classify(cut, prompt=prompt, finish_reason="length").flagged
    broken = "    s = 0\n    for x in items\n        s += x\n    return s\n"
    v = f.classify(broken, prompt=prompt, finish_reason="stop")
    assert v.flagged and "line" in v.detail
    # An unclosed bracket at the truncation point is incomplete, not wrong.
    assert not f.classify("    return sum([x for x in\n", prompt=prompt, finish_reason="length").flagged


def test_safety_patterns_and_plugins():
    s = PatternSafety()
    assert s.classify("-----BEGIN RSA PRIVATE KEY-----\nMIIE").flagged
    assert s.classify("card 4111 1111 1111 1111").flagged
    assert not s.classify("card 4111 1111 1111 1112").flagged  # fails Luhn
    assert not s.classify("def handle(exc):\n    log(exc)\n").flagged

    class Always:
        name = "unsafe"

        def classify(self, text, **kw):
            return Verdict("unsafe", True, 0.7, "plugin")

    v = SafetyClassifier([PatternSafety(), Always()]).classify("hello")
    assert v.flagged and v.detail == "plugin"


def test_degeneration():
    d = DegenerationClassifier()
    assert d.classify("", finish_reason="stop").flagged
    assert d.classify("the end of it " + "and again " * 40, finish_reason="length").flagged
    normal = "def f(a, b):\n    c = a + b\n    if c > 10:\n        return c * 2\n    return c - 1\n" * 2
    assert not d.classify(normal, finish_reason="stop").flagged
