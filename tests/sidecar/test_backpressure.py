"""The T>0 evidence survives backlog, a slow or failing baseline server and a crash.

The baseline server is the toy model of ``toy_baseline.py`` (slow, 503-on-first-try and down on cue:
faults a real vLLM server cannot produce on demand; an outage is a real one: its socket is closed, so
connections are refused, and reopened on the same port); the consumer loop, the scorer, the charts and
the checkpoint are the real ones, reading a real JSONL file.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from quality_sidecar.baseline_scoring import scorable
from quality_sidecar.detectors.conformance_charts import ImpossibleTokenChart
from quality_sidecar.detectors.conformance_scoring import SamplerParams
from quality_sidecar.service import Service, ServiceConfig
from quality_sidecar.workers import RetryPolicy

from .conftest import metric_sum, run_and_scrape, scrape, write_jsonl
from .toy_baseline import ToyServer, V, sample

pytestmark = pytest.mark.unit
NUCLEUS = SamplerParams(1.0, top_p=0.9)


@pytest.fixture
def toy():
    srv = ToyServer()
    yield srv
    srv.close()


def _stream(n: int, seed: int, fault_every: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        arm = "baseline" if i % 2 == 0 else "candidate"
        out.append(sample(rng, NUCLEUS, arm=arm, ignore_truncation_every=fault_every if arm == "candidate" else 0))
    return out


def _service(src: Path, url: str, tmp_path: Path, poll: int = 50, **conf) -> Service:
    cfg = ServiceConfig.from_dict({
        "source": f"file://{src}", "alerts": f"file://{tmp_path / 'alerts.jsonl'}", "progress": False,
        "baseline_url": url + "/v1", "replay_fraction": 0.0, "state_path": str(tmp_path / "state.json"),
        "max_poll_records": poll,
        "conformance": {"fraction": 1.0, "max_queue": 8, "vocab_size": V, **conf}})
    return Service(cfg, http_port=0)


def _alerts(tmp_path: Path) -> list[dict]:
    p = tmp_path / "alerts.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def test_a_backlog_read_at_full_speed_is_scored_whole(toy: ToyServer, tmp_path: Path) -> None:
    """200 samples read as fast as the file allows against a slow server that answers 503 to every
    first try: the source pauses instead of dropping, every selected sample is scored."""
    toy.delay_s, toy.fail_first = 0.002, True
    samples = _stream(200, seed=1)
    src = write_jsonl(tmp_path / "s.jsonl", samples)
    svc = _service(src, toy.url, tmp_path)
    svc.scorer.retry = RetryPolicy(backoff_s=0.001)
    m = run_and_scrape(svc)
    for arm in ("baseline", "candidate"):
        sel = metric_sum(m, "quality_sidecar_conformance_selected_samples_total", arm=arm)
        assert sel == 100 and metric_sum(m, "quality_sidecar_conformance_scored_samples_total", arm=arm) == sel
    assert metric_sum(m, "quality_sidecar_baseline_failed_samples_total") == 0
    assert metric_sum(m, "quality_sidecar_impossible_tokens_total") == 0  # exact decoders: none, over 6k tokens
    assert not _alerts(tmp_path)
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["offsets"][0][2] == 200 and state["pipeline"]["pending"] == {}
    assert svc.scorer.counts["retries"] == 200  # every sample failed once and was retried, none lost


def test_paced_and_full_speed_reads_alarm_at_the_same_sample(toy: ToyServer, tmp_path: Path) -> None:
    """A decoder that ignores top-p at every other position: the impossible-token chart alarms within
    a few candidate samples, at the same sample whether the file is read at once or the server is slow."""
    samples = _stream(200, seed=2, fault_every=2)
    src = write_jsonl(tmp_path / "s.jsonl", samples)
    firsts = []
    for delay in (0.0, 0.01):
        toy.delay_s = delay
        d = tmp_path / f"run{delay}"
        d.mkdir()
        svc = _service(src, toy.url, d, max_queue=4)
        assert svc.run() == 0
        ev = [e for e in _alerts(d) if e["detector"] == "impossible_tokens"]
        assert [e["arm"] for e in ev] == ["candidate"], ev
        assert "top_p" in ev[0]["detail"]["reasons"] and ev[0]["example_trace_ids"]
        firsts.append(ev[0]["samples_since_fit"])
    assert firsts[0] == firsts[1] and firsts[0] <= 40, firsts


def test_a_crash_loses_no_scoring_and_counts_nothing_twice(toy: ToyServer, tmp_path: Path) -> None:
    """Checkpoint while the server is down: offsets stop at the oldest unscored sample and the state
    lists what is unscored; a new process resumes, scores exactly those, and classifies nothing twice."""
    samples = _stream(40, seed=3)
    src = write_jsonl(tmp_path / "s.jsonl", samples)
    toy.down = True
    svc = _service(src, toy.url, tmp_path, max_queue=1000)
    svc.scorer.retry = RetryPolicy(backoff_s=0.01, max_backoff_s=0.01, down_after=3)
    for _ in range(3):
        svc.step()
    svc.checkpoint()
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["offsets"][0][2] == 0  # the first sample is still unscored: nothing committed past it
    assert len(state["pipeline"]["pending"]) == 40 and state["pipeline"]["counts"]["samples"] == 40
    svc.close()  # the "crash": the worker's queue is lost with the process

    toy.down = False
    svc2 = _service(src, toy.url, tmp_path)
    assert svc2.run() == 0
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["pipeline"]["counts"]["samples"] == 40 and state["pipeline"]["counts"]["duplicates"] == 40
    conf = state["pipeline"]["conformance"]["toy"]["stats"]
    assert conf["baseline"]["samples"] + conf["candidate"]["samples"] == 40
    assert state["pipeline"]["pending"] == {} and state["offsets"][0][2] == 40


def _readyz(port: int) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _wait_for(cond, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def test_an_outage_delays_scoring_and_drops_nothing(toy: ToyServer, tmp_path: Path) -> None:
    """The baseline server refuses connections for ~5 s (its socket closed: far past the old 6-attempt
    limit at this test's backoff), then listens again on the same port.  Meanwhile the sidecar holds
    the head sample, turns readiness red, pauses its source and commits nothing past the first unscored
    sample; afterwards every selected sample is scored, none given up."""
    samples = _stream(60, seed=4)
    src = write_jsonl(tmp_path / "s.jsonl", samples)
    toy.stop()
    svc = _service(src, toy.url, tmp_path, poll=4)  # max_queue 8: the source pauses after ~8 samples
    svc.scorer.retry = RetryPolicy(backoff_s=0.01, max_backoff_s=0.2, down_after=3)  # 0.5 s .. 30 s, scaled down
    out: dict[str, str] = {}
    t = threading.Thread(target=lambda: out.update(metrics=run_and_scrape(svc)))
    t.start()
    try:
        _wait_for(lambda: svc.scorer.counts["retries"] >= 20 and (tmp_path / "state.json").exists())
        time.sleep(2 * svc.cfg.commit_interval_s)  # checkpoints run while the server is down
        code, body = _readyz(svc.http.port)
        assert code == 503 and b"baseline server (conformance)" in body
        m = scrape(svc.http.port)
        assert metric_sum(m, "quality_sidecar_baseline_up", worker="conformance") == 0
        assert metric_sum(m, "quality_sidecar_backpressure", worker="conformance") == 1
        assert svc.pipeline.counts["samples"] < 20  # paused, not reading on
        state = json.loads((tmp_path / "state.json").read_text())
        assert state["offsets"][0][2] == 0 and len(state["pipeline"]["pending"]) >= 8  # 0 committed unscored
        time.sleep(3)
        assert svc.scorer.counts["failed"] == 0 and svc.scorer.pending >= 8
    finally:
        toy.start()
        t.join(60)
    assert not t.is_alive()
    m = out["metrics"]
    for arm in ("baseline", "candidate"):
        sel = metric_sum(m, "quality_sidecar_conformance_selected_samples_total", arm=arm)
        assert sel == 30 and metric_sum(m, "quality_sidecar_conformance_scored_samples_total", arm=arm) == sel
    assert metric_sum(m, "quality_sidecar_baseline_failed_samples_total") == 0
    assert metric_sum(m, "quality_sidecar_baseline_up", worker="conformance") == 1
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["offsets"][0][2] == 60 and state["pipeline"]["pending"] == {}


def test_stop_during_an_outage_is_prompt_and_leaves_the_unscored_pending(toy: ToyServer, tmp_path: Path) -> None:
    """SIGTERM while the scorer backs off (the production 0.5 s .. 30 s steps) and the loop waits at the
    end of the file for it (``drain(None, stopping)``): run() returns within seconds, the unscored
    samples stay uncommitted and listed as pending, and the restarted sidecar scores them."""
    samples = _stream(20, seed=9)
    src = write_jsonl(tmp_path / "s.jsonl", samples)
    toy.stop()
    svc = _service(src, toy.url, tmp_path, max_queue=100)  # no backpressure: the loop reaches the drain
    t = threading.Thread(target=svc.run)
    t.start()
    _wait_for(lambda: svc.scorer.counts["retries"] >= 3)  # now in its 4 s backoff
    t0 = time.monotonic()
    svc.request_stop()
    t.join(30)
    assert not t.is_alive() and time.monotonic() - t0 < 3
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["offsets"][0][2] == 0 and len(state["pipeline"]["pending"]) == 20
    assert svc.scorer.counts["failed"] == 0 and state["pipeline"]["counts"]["samples"] == 20

    toy.start()
    svc2 = _service(src, toy.url, tmp_path)
    assert svc2.run() == 0
    state = json.loads((tmp_path / "state.json").read_text())
    conf = state["pipeline"]["conformance"]["toy"]["stats"]
    assert conf["baseline"]["samples"] + conf["candidate"]["samples"] == 20
    assert state["pipeline"]["pending"] == {} and state["offsets"][0][2] == 20


def test_out_of_vocabulary_tokens_are_impossible(toy: ToyServer, tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    bad = [sample(rng, NUCLEUS, arm="candidate") for _ in range(3)]
    for s in bad:
        s["output"]["token_ids"][3] = V + 7
    src = write_jsonl(tmp_path / "s.jsonl", bad)
    svc = _service(src, toy.url, tmp_path, impossible_floor_per_token=0.0)
    assert svc.run() == 0
    ev = [e for e in _alerts(tmp_path) if e["detector"] == "impossible_tokens"]
    assert ev and ev[0]["detail"]["reasons"] == "vocab 1"
    assert toy.requests == 0  # judged without asking the server (it would refuse the ids)


def test_a_sample_the_server_refuses_is_counted_and_released(toy: ToyServer, tmp_path: Path) -> None:
    """Without ``vocab_size`` the server is asked and refuses the ids (400): the sample is given up,
    counted per arm and reason, counted as an impossible ``vocab`` token, and no longer pending, so the
    offsets reach the end of the file.  A 404 (unknown model name) is given up the same way."""
    rng = np.random.default_rng(7)
    bad = [sample(rng, NUCLEUS, arm="candidate") for _ in range(3)]
    bad[0]["output"]["token_ids"][2] = V + 3
    bad[1]["model"] = "not-served"
    toy.unknown_models = {"not-served"}
    src = write_jsonl(tmp_path / "s.jsonl", bad)
    svc = _service(src, toy.url, tmp_path, impossible_floor_per_token=0.0, vocab_size=None)
    m = run_and_scrape(svc)
    assert metric_sum(m, "quality_sidecar_baseline_failed_samples_total", reason="rejected_token_ids") == 1
    assert metric_sum(m, "quality_sidecar_baseline_failed_samples_total", reason="rejected") == 1
    assert metric_sum(m, "quality_sidecar_conformance_scored_samples_total") == 1
    assert metric_sum(m, "quality_sidecar_impossible_tokens_total", reason="vocab") == 1
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["offsets"][0][2] == 3 and state["pipeline"]["pending"] == {}


def test_minus_9999_is_read_as_an_impossible_token(toy: ToyServer) -> None:
    """vLLM sends a -inf log-prob as -9999.0 (the toy sends it as vLLM 0.32's ``clamp_prompt_logprobs``
    does; what a real server sends is checked in test_conformance_serve.py): the token is impossible,
    and the sample's mean log-prob stays that of its other tokens instead of falling by 9999/n."""
    from quality_sidecar.baseline_scoring import ConformanceConfig, LogprobClient, score_sample

    rng = np.random.default_rng(11)
    s = sample(rng, NUCLEUS)
    client, cfg = LogprobClient(toy.url, top_logprobs=20), ConformanceConfig(vocab_size=V)
    clean = score_sample(client, s, NUCLEUS, cfg, rng)
    toy.zero_prob = {s["output"]["token_ids"][7]}
    n_zero = s["output"]["token_ids"].count(s["output"]["token_ids"][7])
    sc = score_sample(client, s, NUCLEUS, cfg, rng)
    assert clean.out_of_support == 0 and sc.oos_reasons == {"vocab": n_zero}
    assert np.isneginf(sc.logprob).sum() == n_zero
    assert -10 < sc.mean_logprob < 0 and abs(sc.mean_logprob - clean.mean_logprob) < 2


def test_samples_that_cannot_be_judged_are_left_out_and_counted() -> None:
    rng = np.random.default_rng(6)
    s = sample(rng, NUCLEUS)
    assert scorable(s) == NUCLEUS
    aborted = json.loads(json.dumps(s))
    aborted["output"]["finish_reason"] = "abort"
    assert scorable(aborted) == "aborted"
    masked = json.loads(json.dumps(s))
    masked["sampling"]["min_tokens"] = 8
    assert scorable(masked) == "min_tokens"
    greedy = json.loads(json.dumps(s))
    greedy["sampling"]["temperature"] = 0.0
    assert scorable(greedy) is None


def test_impossible_token_chart_floor_and_control_arm() -> None:
    # exact null with zero impossible tokens: never alarms
    c = ImpossibleTokenChart(alpha=1e-6, floor_per_token=1e-5)
    for _ in range(1000):
        assert not c.update("candidate", 100, {}).alarm
    # a numeric disagreement shared by both arms (the scorer vs a bf16 engine): no alarm
    c = ImpossibleTokenChart(alpha=1e-6, floor_per_token=1e-5)
    rng = np.random.default_rng(0)
    for _ in range(2000):
        for arm in ("baseline", "candidate"):
            r = c.update(arm, 100, {"top_p": int(rng.poisson(0.05))})
            assert not (arm == "candidate" and r.alarm), r
    # the candidate alone: alarms within a few samples, says which parameter
    c = ImpossibleTokenChart(alpha=1e-6, floor_per_token=1e-5)
    first = None
    for i in range(50):
        c.update("baseline", 100, {})
        r = c.update("candidate", 100, {"top_p": 3})
        if r.alarm_new and first is None:
            first = i
    assert first is not None and first < 10 and "top_p" in r.extra["reasons"]


def test_score_cli_reports_impossible_tokens_per_arm(toy: ToyServer, tmp_path: Path) -> None:
    from quality_sidecar.offline import conformance_report

    samples = _stream(60, seed=7, fault_every=2)
    rep = conformance_report(samples, toy.url + "/v1", {"conformance": {"vocab_size": V}}, progress=False)
    base, cand = rep["arms"]["baseline"], rep["arms"]["candidate"]
    assert rep["counts"]["scored"] == 60
    assert base["impossible_tokens"] == 0 and not base["impossible_alarm"]
    assert cand["impossible_alarm"] and cand["impossible_reasons"].get("top_p", 0) >= 20
    assert cand["impossible_examples"]


def _same_prompt_stream(n: int, seed: int, n_tokens: int, temperature: float, reuse: bool) -> list[dict]:
    """Baseline and candidate samples of 10 prompts; ``reuse``: the candidate draws every sample of a
    prompt from one identically seeded stream (the reused-randomness fault)."""
    rng = np.random.default_rng(seed)
    prompts = [[int(x) for x in rng.integers(0, V, 5)] for _ in range(10)]
    out = []
    for i in range(n):
        p = i % 10
        arm = "baseline" if (i // 10) % 2 == 0 else "candidate"
        r = np.random.default_rng([seed, p]) if reuse and arm == "candidate" else rng
        out.append(sample(r, SamplerParams(temperature), n_tokens=n_tokens, arm=arm, prompt=prompts[p]))
    return out


@pytest.mark.parametrize("reuse, n_tokens, temperature", [(True, 30, 1.0), (False, 2, 0.3)])
def test_repeated_samples_alarm_on_a_reused_stream_only(reuse: bool, n_tokens: int, temperature: float) -> None:
    """A reused random stream: every sample exact, samples of one prompt identical -> alarm.  Exact
    decoders with many natural repeats (2 tokens at T=0.3) -> silent."""
    from quality_sidecar.pipeline import Pipeline

    pipe = Pipeline(ServiceConfig.from_dict({"monitor": {"text_test": False}}))
    samples = _same_prompt_stream(400, seed=8, n_tokens=n_tokens, temperature=temperature, reuse=reuse)
    for i in range(0, len(samples), 20):
        pipe.process(samples[i:i + 20])
    ev = [a for a in pipe.alarm_log if a["detector"] == "repeated_samples"]
    arms = pipe.charts.repeats["toy"].arms
    if reuse:
        assert [e["arm"] for e in ev] == ["candidate"] and ev[0]["samples_since_fit"] <= 30, ev
    else:
        assert arms["baseline"]["repeats"] > 20 and arms["candidate"]["repeats"] > 20  # natural repeats
        assert not ev, ev


@pytest.mark.parametrize("server_max", [64, 20])
def test_a_top_k_above_k_is_checked_as_far_as_the_server_allows(toy: ToyServer, server_max: int) -> None:
    """Traffic with top-k 40 and the default K = 20: the scorer asks for K = 40 so a token ranked 21-40
    (allowed) and one ranked past 40 (impossible) can be told apart.  A server whose --max-logprobs is
    lower refuses (vLLM's 400); the scorer then asks for its maximum, remembers it, and top-k faults
    past it stay unprovable (as documented), while exact samples still score."""
    from quality_sidecar.baseline_scoring import ConformanceConfig, LogprobClient, score_sample

    toy.max_logprobs = server_max
    params = SamplerParams(1.0, top_k=40)
    rng = np.random.default_rng(4)
    client, cfg = LogprobClient(toy.url, top_logprobs=20), ConformanceConfig(vocab_size=V)
    found = {"exact": 0, "faulty": 0}
    for i in range(120):
        arm = "faulty" if i % 2 else "exact"
        s = sample(rng, params, arm=arm, ignore_truncation_every=2 if arm == "faulty" else 0)
        sc = score_sample(client, s, params, cfg, rng)
        found[arm] += sc.oos_reasons.get("top_k", 0)
    assert found["exact"] == 0
    if server_max >= 40:
        assert found["faulty"] > 0 and set(toy.asked_k) == {40}
    else:
        assert found["faulty"] == 0 and toy.asked_k[:3] == [40, 20, 20] and client.server_max == 20
