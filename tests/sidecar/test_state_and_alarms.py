"""Detector state across restarts, the learned A/A rate, and the acknowledge / clear / re-baseline path.

Why: a restart must neither forget an alarm or its evidence, nor latch an acknowledged alarm
forever. So the tests compare the full state of a restored pipeline with the original, check that
both then evolve identically, and drive ack / clear / re-baseline through a real ``Service``
(file source, its HTTP server on a free port) and through the CLI that talks to it.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import numpy as np
import pytest

from quality_sidecar.cli import main
from quality_sidecar.detectors import (
    BernoulliCUSUM,
    GaussianCUSUM,
    PairedExactMatch,
)
from quality_sidecar.pipeline import Pipeline
from quality_sidecar.service import Service, ServiceConfig
from tests.support.synth import SampleStream

from .conftest import FAST_MONITOR, write_jsonl

pytestmark = pytest.mark.unit

MON = {**FAST_MONITOR, "exact_match_block": 50, "pair_state_entries": 100_000}


def _strict_json(obj):
    """What the state file holds: strict JSON (no NaN), read back."""
    return json.loads(json.dumps(obj, allow_nan=False))


def test_every_detector_round_trips_its_declared_state():
    rng = np.random.default_rng(0)
    b = BernoulliCUSUM("r", 1e5, delta=0.05).fit(rng.random(500) < 0.02)
    b.update(rng.random(3000) < 0.2)  # fires
    g = GaussianCUSUM("len", 1e5, "up", 0.5).fit(rng.normal(0, 1, 500))
    g.update(rng.normal(0.3, 1, 200))
    pe = PairedExactMatch(1e5, block=10)
    pe.add_aa([False] * 397 + [True] * 3, "replay")
    pe.update([([1, 2, 3], [1, 2, 4])] * 5 + [([1], [1])] * 10, "replay")
    fresh = [BernoulliCUSUM("r", 1e5, delta=0.05), GaussianCUSUM("len", 1e5, "up", 0.5),
             PairedExactMatch(1e5, block=10)]
    for det, new in zip([b, g, pe], fresh):
        st = _strict_json(det.get_state())
        assert st["type"] == type(det).__name__ and st["version"] == type(det).STATE_VERSION
        new.set_state(st)
        assert _strict_json(new.get_state()) == st
    assert b.alarm_ and fresh[0].alarm_ and fresh[0].threshold_ == b.threshold_
    assert fresh[2].sources_["replay"]["aa_pairs"] == 400 and fresh[2].alarm_ == pe.alarm_ is True
    with pytest.raises(ValueError, match="newer"):
        fresh[0].set_state({**b.get_state(), "version": 99})


def _streams():
    # 300 prompts, half greedy: the baseline arm repeats prompts (A/A pairs) and both arms share them.
    base = SampleStream(seed=1, arm="baseline", n_prompts=300, greedy_fraction=0.5)
    cand = SampleStream(seed=2, arm="candidate", n_prompts=300, greedy_fraction=0.5)
    return base, cand


def _broken(samples):
    """A broken decoder: the first token of every greedy output differs from the baseline, and every
    third request is aborted (a truncation rate far above the reference)."""
    for i, s in enumerate(samples):
        if s["sampling"]["temperature"] == 0:
            s["output"]["token_ids"] = [s["output"]["token_ids"][0] + 1, *s["output"]["token_ids"][1:]]
        if i % 3 == 0:
            s["output"]["finish_reason"] = "abort"
    return samples


def test_restart_keeps_every_detector_and_ack_is_neither_forgotten_nor_latched():
    cfg = ServiceConfig.from_dict({"monitor": MON})
    pipe = Pipeline(cfg)
    base, cand = _streams()
    for _ in range(4):
        pipe.process(base.take(200))
        pipe.process(cand.take(200))
    for _ in range(2):
        pipe.process(base.take(200))
        pipe.process(_broken(cand.take(200)))
    active = {(a["detector"], a["arm"]) for a in pipe.active_alarms()}
    # one of each kind: a stream chart, a two-sample test and the T=0 chart
    assert {("truncated", "candidate"), ("twosample_truncated", "candidate"), ("exact_match", "candidate")} <= active
    pt = pipe.charts.pairs["demo-code-4l"]
    assert pt.detector.sources_["arm"]["aa_pairs"] >= 50
    em = next(e for e in pipe.alarm_log if e["detector"] == "exact_match")
    assert "measured" in em["detail"]["aa_rate_source"] and em["detail"]["aa_pairs"] >= 50

    st = _strict_json(pipe.get_state())
    assert set(st) >= {"streams", "compare", "pairs", "conformance", "control"}
    restored = Pipeline(cfg)
    restored.set_state(st)
    assert _strict_json(restored.get_state()) == st  # nothing forgotten
    assert restored.active_alarms() == pipe.active_alarms()
    # ... and the restored pipeline continues exactly as the original would have
    more_b, more_c = base.take(400), _broken(cand.take(400))
    for p in (pipe, restored):
        p.process([dict(x) for x in more_b])
        p.process([json.loads(json.dumps(x)) for x in more_c])
    assert _strict_json(restored.get_state()) == _strict_json(pipe.get_state())

    # acknowledge: the alarm goes, the event is logged, and a restart keeps it acknowledged
    done = restored.acknowledge("truncated", model="demo-code-4l", arm="candidate", by="test")
    assert done == [{"detector": "truncated", "model": "demo-code-4l", "arm": "candidate"}]
    assert restored.control_log[-1]["type"] == "quality_sidecar.ack"
    assert restored.charts.streams[("demo-code-4l", "candidate")].charts["truncated"].s_ == 0.0
    again = Pipeline(cfg)
    again.set_state(_strict_json(restored.get_state()))
    assert "truncated" not in {a["detector"] for a in again.active_alarms()}
    assert "exact_match" in {a["detector"] for a in again.active_alarms()}  # the others stay latched
    # not latched forever: the regression is still there, so the restarted chart fires again
    fired = []
    for _ in range(3):
        fired += [a.detector for a in again.process(_broken(cand.take(200)))]
    assert "truncated" in fired
    # the persisted waiting table is capped at pair_state_entries
    small = Pipeline(ServiceConfig.from_dict({"monitor": {**MON, "pair_state_entries": 7}}))
    small.process(base.take(300))
    assert len(small.get_state()["pairs"]["demo-code-4l"]["state"]["table"]) == 7


def test_replayed_baseline_pairs_are_the_measured_reference_and_rebaseline_forgets_them():
    pipe = Pipeline(ServiceConfig.from_dict({"monitor": MON}))
    s = SampleStream(seed=5, arm="baseline", greedy_fraction=1.0).take(100)
    for i, x in enumerate(s):  # replay answers of the baseline server: 5 of 100 differ (batch non-invariance)
        ids = x["output"]["token_ids"]
        pipe.add_replay_pair(x, {"token_ids": ids if i % 20 else [ids[0] + 1, *ids[1:]]})
    pt = pipe.charts.pairs["demo-code-4l"]
    replay = pt.detector.sources_["replay"]
    assert (replay["aa_pairs"], replay["aa_mismatches"], replay["pairs"]) == (100, 5, 0)
    assert pt.detector.sources_["arm"]["aa_pairs"] == 0  # the two references are kept apart
    assert pipe.rebaseline(by="test") == ["exact_match demo-code-4l"]
    assert pt.detector.sources_["replay"]["aa_pairs"] == 0


def _post(url: str, headers: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, method="POST", data=b"", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _drain(svc: Service) -> None:
    while not svc.source.eof:
        svc.step(0.0)
    svc.checkpoint()


def test_ack_clear_and_rebaseline_over_http_and_cli_on_a_running_service(tmp_path, capsys, monkeypatch,
                                                                          clean_and_regressed):
    ref, bad = clean_and_regressed("acceptance")
    src = write_jsonl(tmp_path / "s.jsonl", ref + bad)
    state, alerts = tmp_path / "state.json", tmp_path / "alerts.jsonl"
    conf = {"source": f"file://{src}", "state_path": str(state), "alerts": f"file://{alerts}", "progress": False,
            "monitor": FAST_MONITOR}
    svc = Service(ServiceConfig.from_dict(conf), http_port=0)
    url = f"http://127.0.0.1:{svc.http.port}"
    try:
        _drain(svc)
        with urllib.request.urlopen(url + "/alarms", timeout=10) as r:
            listed = json.loads(r.read())["alarms"]
        assert [(a["detector"], a["arm"]) for a in listed] == [("acceptance_down", "candidate")]
        assert main(["alarms", "list", "--url", url]) == 0
        assert capsys.readouterr().out.startswith("acceptance_down\tdemo-code-4l\tcandidate")

        monkeypatch.setenv("QUALITY_SIDECAR_CONTROL_TOKEN", "s3cret")
        assert _post(url + "/alarms/acceptance_down/ack")[0] == 401  # control needs the token when set
        assert main(["alarms", "ack", "acceptance_down", "--url", url, "--model", "demo-code-4l",
                     "--by", "oncall"]) == 0
        assert json.loads(capsys.readouterr().out)["acknowledged"] == [
            {"detector": "acceptance_down", "model": "demo-code-4l", "arm": "candidate"}]
        assert main(["alarms", "ack", "acceptance_down", "--url", url]) == 1  # nothing left to ack: 404
        assert "no latched alarm" in capsys.readouterr().err
        assert _post(url + "/alarms/clear", {"Authorization": "Bearer s3cret"}) == (200, {"acknowledged": []})
        svc.checkpoint()  # no new records, but the ack must still reach the state file
    finally:
        svc.close()
    saved = json.loads(state.read_text())["pipeline"]
    assert saved["control"][0]["by"] == "oncall"
    events = [json.loads(x) for x in alerts.read_text().splitlines()]
    assert [e.get("type") for e in events] == ["quality_sidecar.alert", "quality_sidecar.ack"]

    # restart from the state file: the ack holds (no alarm comes back by itself) ...
    svc = Service(ServiceConfig.from_dict(conf), http_port=0)
    url = f"http://127.0.0.1:{svc.http.port}"
    try:
        assert svc.pipeline.active_alarms() == []
        assert svc.pipeline.charts.streams[("demo-code-4l", "candidate")].fitted
        # ... and re-baselining drops the references: the next samples become the new ones
        assert main(["alarms", "rebaseline", "--url", url, "--model", "demo-code-4l"]) == 0
        assert "stream demo-code-4l/candidate" in json.loads(capsys.readouterr().out)["rebaselined"]
        assert not svc.pipeline.charts.streams[("demo-code-4l", "candidate")].fitted
        svc.checkpoint()
    finally:
        svc.close()
    assert not json.loads(state.read_text())["pipeline"]["streams"]["demo-code-4l\x1fcandidate"]["state"]["charts"]


def test_a_state_file_of_an_older_layout_stops_with_a_clear_error(tmp_path, clean_and_regressed):
    ref, _ = clean_and_regressed("acceptance")
    state = tmp_path / "state.json"
    conf = {"source": f"file://{write_jsonl(tmp_path / 's.jsonl', ref[:50])}", "state_path": str(state),
            "progress": False, "monitor": FAST_MONITOR}
    svc = Service(ServiceConfig.from_dict(conf), http_port=0)
    try:
        _drain(svc)
    finally:
        svc.close()
    st = json.loads(state.read_text())
    del st["pipeline"]["control"]  # a key a newer sidecar writes and an older one did not
    state.write_text(json.dumps(st))
    with socket.socket() as probe:  # a free port for the refused service's HTTP server
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ValueError, match=r"lacks 'control'.*delete the state file \(state_path\)"):
        Service(ServiceConfig.from_dict(conf), http_port=port)
    with socket.socket() as again:  # the refusal closed what it had opened: the port is free again
        again.bind(("127.0.0.1", port))
        again.listen()
