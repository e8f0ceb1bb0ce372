"""The exact checks of ``allowed_token_ids`` and ``bad_words``: an output token the request's masks forbid
is an impossible token at any temperature (``detectors.exact_checks``), counted on the impossible-token
chart under the option's name; a sample whose record cannot support a check is counted per (model, arm,
check, reason).  ``bad_word_hits`` is checked against vLLM 0.32's own masking function
(``vllm.v1.sample.ops.bad_words``) on random outputs; the injected violations are fault injection (a real
server masks them: ``test_conformance_serve.py`` checks a real server's outputs pass)."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import numpy as np
import pytest

from quality_sidecar.config import ServiceConfig
from quality_sidecar.detectors.exact_checks import (
    allowed_token_ids_check,
    bad_word_hits,
    bad_words_check,
    exact_checks,
)
from quality_sidecar.pipeline import Pipeline
from tests.support.synth import SampleStream

from .conftest import metric_sum

pytestmark = pytest.mark.unit


def _sample(out: list[int], version: str = "1.6", **sampling) -> dict:
    return {"schema_version": version, "sampling": {"temperature": 0.8, **sampling},
            "output": {"token_ids": out, "num_tokens": len(out), "finish_reason": "length"}}


def test_a_bad_word_counts_only_when_the_output_holds_all_of_it() -> None:
    words = [[7, 8, 9], [5]]
    assert bad_word_hits([1, 7, 8, 2, 7, 8], words) == 0  # the prefix without its last token: vLLM allows it
    assert bad_word_hits([8, 9, 1], words) == 0  # the word may have started in the prompt: vLLM looks at the output only
    assert bad_word_hits([1, 7, 8, 9, 2], words) == 1  # the whole word: its last token was masked
    assert bad_word_hits([5, 1, 5], words) == 2  # a one-token word is masked everywhere
    assert bad_word_hits([7, 8, 7, 8, 9], words) == 1
    assert bad_words_check(_sample([1, 7, 8, 2], bad_words_token_ids=words)) == (4, 0)
    assert bad_words_check(_sample([1, 7, 8, 9], bad_words_token_ids=words)) == (4, 1)
    assert bad_words_check(_sample([1, 2])) is None  # no bad words: nothing to check
    assert bad_words_check(_sample([1, 2], bad_words=["foo"])) == "not_tokenized"  # strings only: never guessed


def _vllm_bad_words():
    """vLLM's ``v1/sample/ops/bad_words.py`` loaded from the installed wheel by path: it needs torch only,
    and importing it through the ``vllm`` package would start vLLM's whole import (tens of seconds)."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / "v1" / "sample" / "ops" / "bad_words.py"
    mod_spec = importlib.util.spec_from_file_location("vllm_bad_words_under_test", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


def test_bad_word_hits_mirror_vllm_masking() -> None:
    """At every output position, vLLM's ``_apply_bad_words_single_batch`` (the past: the output so far) sets
    the logit of the position's token to -inf exactly where ``bad_word_hits`` counts a hit."""
    import torch

    _apply_bad_words_single_batch = _vllm_bad_words()._apply_bad_words_single_batch
    rng = random.Random(0)
    vocab = 6
    flagged = clean = 0
    for _ in range(400):
        words = [[rng.randrange(vocab) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 3))]
        out = [rng.randrange(vocab) for _ in range(rng.randint(1, 12))]
        masked = 0
        for j, tok in enumerate(out):
            logits = torch.zeros(vocab)
            _apply_bad_words_single_batch(logits, words, out[:j])
            masked += int(logits[tok].item() == float("-inf"))
        assert bad_word_hits(out, words) == masked, (out, words)
        flagged += masked > 0
        clean += masked == 0
    assert flagged > 50 and clean > 50  # both verdicts exercised


def test_a_token_outside_allowed_token_ids_is_impossible() -> None:
    assert allowed_token_ids_check(_sample([3, 4, 3], allowed_token_ids=[3, 4])) == (3, 0)  # allowed ids pass
    assert allowed_token_ids_check(_sample([3, 5, 6], allowed_token_ids=[3, 4])) == (3, 2)
    assert allowed_token_ids_check(_sample([3], allowed_token_ids_count=5000,
                                           allowed_token_ids_sha256="0" * 64)) == "too_many_ids"
    no_ids = _sample([], allowed_token_ids=[3])
    no_ids["output"].update(token_ids=None, num_tokens=4)
    assert allowed_token_ids_check(no_ids) == "no_token_ids"
    # schema < 1.6: a logit modifier may have been either option, unrecorded
    assert exact_checks(_sample([3], version="1.5", logits_modified=True)) == (
        {}, {"allowed_token_ids": "not_recorded", "bad_words": "not_recorded"})
    assert exact_checks(_sample([3], version="1.5")) == ({}, {})
    assert exact_checks(_sample([3, 9], allowed_token_ids=[3], bad_words_token_ids=[[9]])) == (
        {"allowed_token_ids": (2, 1), "bad_words": (2, 1)}, {})


def _stream(arm: str, fault_every: int, n: int, seed: int, greedy: float) -> list[dict]:
    """Samples whose requests set allowed_token_ids and bad words; every ``fault_every``-th output breaks both."""
    out = SampleStream(seed=seed, model="m", arm=arm, greedy_fraction=greedy).take(n)
    for i, s in enumerate(out):
        s["schema_version"] = "1.6"
        ids = [1 + t % 50 for t in (s["output"]["token_ids"] or [1] * 20)]
        ids = [t if t not in (7, 8) else 9 for t in ids]  # 7 8 never completes: only its prefix 7 may occur
        ids[len(ids) // 2] = 7
        if fault_every and i % fault_every == 0:
            ids += [7, 8, 999]
        s["sampling"].update(allowed_token_ids=list(range(1, 51)), bad_words_token_ids=[[7, 8]])
        s["output"].update(token_ids=ids, num_tokens=len(ids))
    return out


def test_a_candidate_that_ignores_the_masks_alarms_and_an_exact_one_does_not() -> None:
    exact = Pipeline(ServiceConfig.from_dict({"monitor": {"text_test": False}}))
    for k in range(2):
        assert not [a for a in exact.process(_stream("baseline", 0, 200, k, 0.5) +
                                             _stream("candidate", 0, 200, 10 + k, 0.5))
                    if a.detector == "impossible_tokens"]
    assert exact.charts.conformance["m"].impossible.arms["candidate"]["impossible"] == 0
    faulty = Pipeline(ServiceConfig.from_dict({"monitor": {"text_test": False}}))
    faulty.process(_stream("baseline", 0, 200, 1, 0.5))
    alarms = [a for a in faulty.process(_stream("candidate", 10, 200, 2, 0.5)) if a.detector == "impossible_tokens"]
    assert [a.arm for a in alarms] == ["candidate"]
    st = faulty.charts.conformance["m"].impossible.arms["candidate"]
    assert st["reasons"] == {"allowed_token_ids": 20, "bad_words": 20} and st["alarm"]
    assert metric_sum(_render(faulty.metrics), "quality_sidecar_impossible_tokens_total", arm="candidate", reason="bad_words") == 20


def _render(metrics) -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.registry).decode()


def test_checks_that_cannot_run_are_counted_per_model_arm_check_and_reason() -> None:
    p = Pipeline(ServiceConfig.from_dict({"monitor": {"text_test": False}}))
    ss = SampleStream(seed=4, model="m", arm="candidate", greedy_fraction=0.5).take(6)
    ss[0]["sampling"]["logits_modified"] = True  # schema 1.0: unrecorded
    for s in ss[1:]:
        s["schema_version"] = "1.6"
    ss[1]["sampling"].update(allowed_token_ids_count=5000, allowed_token_ids_sha256="a" * 64)
    ss[2]["sampling"]["bad_words"] = ["secret"]
    p.process(ss)
    text = _render(p.metrics)
    name = "quality_sidecar_exact_check_skipped_samples_total"
    assert metric_sum(text, name, model="m", arm="candidate", check="allowed_token_ids", reason="not_recorded") == 1
    assert metric_sum(text, name, model="m", arm="candidate", check="bad_words", reason="not_recorded") == 1
    assert metric_sum(text, name, check="allowed_token_ids", reason="too_many_ids") == 1
    assert metric_sum(text, name, check="bad_words", reason="not_tokenized") == 1
    assert metric_sum(text, name) == 4


def test_the_scorer_exports_what_it_cannot_score_per_model_arm_and_reason(tmp_path) -> None:
    """``quality_sidecar_conformance_skipped_samples`` carries (model, arm, reason), as the replay's skips do:
    a decoder whose T>0 traffic hides from the scorer shows on its own arm.  The samples the scorer judges go
    to a toy baseline server (``toy_baseline``); the masked ones are also checked exactly (0 impossible)."""
    from quality_sidecar.detectors.conformance_scoring import SamplerParams
    from quality_sidecar.service import Service

    from .conftest import run_and_scrape, write_jsonl
    from .toy_baseline import ToyServer, sample

    rng = np.random.default_rng(3)
    params = SamplerParams(1.0, top_p=0.9)
    samples = []
    for model, arm, change in [
            ("a", "candidate", {"allowed_token_ids": list(range(64))}), ("a", "candidate", {"bad_words_token_ids": [[99]]}),
            ("a", "baseline", {"min_tokens": 4}), ("b", "candidate", {"logits_modified": True}),
            ("b", "candidate", {}), ("a", "baseline", {})]:
        s = sample(rng, params, n_tokens=12, arm=arm, model=model)
        s["schema_version"] = "1.6"
        s["sampling"].update(change)
        samples.append(s)
    toy = ToyServer()
    try:
        cfg = ServiceConfig.from_dict({
            "source": f"file://{write_jsonl(tmp_path / 's.jsonl', samples)}", "progress": False,
            "baseline_url": toy.url + "/v1", "replay_fraction": 0.0, "monitor": {"text_test": False},
            "conformance": {"fraction": 1.0, "vocab_size": 64}})
        text = run_and_scrape(Service(cfg, http_port=0))
    finally:
        toy.close()
    name = "quality_sidecar_conformance_skipped_samples_total"
    for model, arm, reason in (("a", "candidate", "allowed_token_ids"), ("a", "candidate", "bad_words"),
                               ("a", "baseline", "min_tokens"), ("b", "candidate", "logits_modified")):
        assert metric_sum(text, name, model=model, arm=arm, reason=reason) == 1, (model, arm, reason)
    assert metric_sum(text, name) == 4
    assert metric_sum(text, "quality_sidecar_conformance_scored_samples_total") == 2
    assert metric_sum(text, "quality_sidecar_impossible_tokens_total") == 0
