"""Pure-Python parts of the telemetry: configuration, sampling decision, sample record, bounded queue."""

from __future__ import annotations

import json
import threading
import time

import pytest
from telemetry_support import Spec, make_request

from quality_sidecar.schema import validate_sample, validation_errors
from vllm_lookahead.telemetry.config import TelemetryConfig, parse_sink
from vllm_lookahead.telemetry.frontend import install_if_configured
from vllm_lookahead.telemetry.record import Decoder, build_sample, prompt_sha256, spec_summary
from vllm_lookahead.telemetry.sampler import Sampler, sample_fraction, should_sample
from vllm_lookahead.telemetry.sinks import FileSink, Sink
from vllm_lookahead.vllm.processes import is_frontend_process, is_worker_process

pytestmark = pytest.mark.unit


def test_config_defaults_and_errors():
    cfg = TelemetryConfig.from_env({})
    assert not cfg.enabled and cfg.sample_rate == 0.01 and cfg.sink.kind == "file"
    assert cfg.sink.path == "./lookahead-samples.jsonl"
    on = TelemetryConfig.from_env({"VLLM_LOOKAHEAD_TELEMETRY": "1", "VLLM_LOOKAHEAD_SAMPLE_RATE": "0.5",
                                   "VLLM_LOOKAHEAD_ARM": "candidate",
                                   "VLLM_LOOKAHEAD_KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
                                   "VLLM_LOOKAHEAD_KAFKA_SASL_MECHANISM": "PLAIN",
                                   "VLLM_LOOKAHEAD_KAFKA_SASL_USERNAME": "u",
                                   "VLLM_LOOKAHEAD_KAFKA_SASL_PASSWORD": "s3cr3t-pw"})
    assert on.enabled and on.sample_rate == 0.5 and on.arm == "candidate"
    kw = on.kafka_auth.producer_kwargs()
    assert kw == {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
                  "sasl_plain_username": "u", "sasl_plain_password": "s3cr3t-pw"}
    assert "s3cr3t-pw" not in repr(on.kafka_auth)  # the password never lands in logs
    for env, var in (({"VLLM_LOOKAHEAD_SAMPLE_RATE": "2"}, "SAMPLE_RATE"),
                     ({"VLLM_LOOKAHEAD_SAMPLE_RATE": "lots"}, "SAMPLE_RATE"),
                     ({"VLLM_LOOKAHEAD_ARM": "blue"}, "ARM"),
                     ({"VLLM_LOOKAHEAD_TELEMETRY": "maybe"}, "TELEMETRY"),
                     ({"VLLM_LOOKAHEAD_KAFKA_SECURITY_PROTOCOL": "TLS"}, "SECURITY_PROTOCOL"),
                     ({"VLLM_LOOKAHEAD_SAMPLE_SINK": "redis://x/y"}, "SAMPLE_SINK")):
        with pytest.raises(ValueError, match=var):
            TelemetryConfig.from_env(env)


def test_parse_sink():
    k = parse_sink("kafka://a:9092,b:9093/llm-samples")
    assert (k.kind, k.bootstrap, k.topic) == ("kafka", ("a:9092", "b:9093"), "llm-samples")
    assert parse_sink("file:///var/log/s.jsonl").path == "/var/log/s.jsonl"
    for bad in ("kafka://a:9092", "kafka://a/topic", "kafka:///topic", "file://", "file:///dir/"):
        with pytest.raises(ValueError, match="VLLM_LOOKAHEAD_SAMPLE_SINK"):
            parse_sink(bad)


def test_sampling_decision_is_deterministic_and_close_to_rate():
    ids = [f"cmpl-{i}" for i in range(20000)]
    first = [should_sample(r, 0.1) for r in ids]
    assert first == [should_sample(r, 0.1) for r in ids]  # same id, same answer
    frac = sum(first) / len(ids)
    assert 0.09 < frac < 0.11, frac  # binomial sd is 0.002: a 5-sd band
    assert not any(should_sample(r, 0.0) for r in ids[:100])
    assert all(should_sample(r, 1.0) for r in ids[:100])
    # lower rates sample subsets of higher rates (one threshold on one hash)
    assert all(should_sample(r, 0.2) for r, s in zip(ids, first) if s)
    assert should_sample("x", 0.0, is_error=True)
    assert not should_sample("x", 0.0, is_error=True, sample_errors=False)
    assert 0.0 <= sample_fraction("anything") < 1.0


def test_sample_validates_and_carries_what_the_sidecar_needs():
    req = make_request()
    sample = build_sample(req, arm="candidate", release="r7", instance="pod-1", redact_prompts=False)
    validate_sample(sample)
    assert sample["request_id"] == "cmpl-1"
    assert sample["trace_id"] == f"{0x1234:032x}" and sample["span_id"] == f"{0x99:016x}"
    assert sample["deployment"] == {"arm": "candidate", "release": "r7", "instance": "pod-1"}
    assert sample["decoder"]["params"] == {"k": 4, "window": 5, "ngram": 3, "pool_size": 8}
    assert sample["decoder"]["dtype"] is None  # unknown here; 1.4 fills it from the engine's model config
    bf16 = build_sample(make_request(decoder=Decoder("lookahead", {"k": 4}, dtype="bfloat16")), arm="candidate",
                        release=None, instance=None, redact_prompts=False)
    validate_sample(bf16)
    assert bf16["decoder"]["dtype"] == "bfloat16"
    assert sample["prompt"]["text"] == "def add(a, b):" and sample["prompt_token_ids"] == [1, 2, 3]
    assert sample["output"]["token_ids"] == [4, 5, 6, 7] and sample["output"]["finish_reason"] == "stop"
    t = sample["time"]
    assert t["ttft_s"] == pytest.approx(0.25) and t["e2e_s"] == pytest.approx(1.5)
    assert t["tpot_s"] == pytest.approx((1.5 - 0.25) / 3)


def test_schema_1_1_fields_and_1_0_samples_stay_valid():
    """stop_reason (string or token id), the choice index and vLLM's own id are optional 1.1 fields:
    a 1.0 sample without them validates, and the decision hashes vLLM's id, not the prefixed one."""
    from tests.support.synth import SampleStream

    old = SampleStream(seed=3).take(1)[0]
    assert old["schema_version"] == "1.0" and "stop_reason" not in old["output"]
    validate_sample(old)
    req = make_request("llm-00ff-3#1", stop_reason="\n", engine_request_id="3#1", choice_index=1)
    s = build_sample(req, arm="baseline", release=None, instance=None, redact_prompts=False)
    validate_sample(s)
    assert s["schema_version"] == "1.6" and s["vllm_request_id"] == "3#1"
    assert s["output"]["stop_reason"] == "\n" and s["output"]["index"] == 1
    assert req.decision_id == "3#1"
    s = build_sample(make_request(stop_reason=2), arm="baseline", release=None, instance=None,
                     redact_prompts=False)
    validate_sample(s)
    assert s["output"]["stop_reason"] == 2 and "index" not in s["output"] and "vllm_request_id" not in s
    assert build_sample(make_request(), arm="baseline", release=None, instance=None,
                        redact_prompts=False)["output"]["stop_reason"] is None


def test_schema_1_6_records_the_masks_the_sidecar_checks_exactly():
    """allowed_token_ids (sorted, distinct; above 4,096 ids only their count and hash) and vLLM's bad-word
    token-id sequences, copied off the request path from the hook's references; wrong types are rejected."""
    import hashlib

    from quality_sidecar.validate import sample_errors
    from vllm_lookahead.telemetry.record import MAX_ALLOWED_TOKEN_IDS

    allowed, bad = [9, 3, 5, 3], [[7, 8], [12, 8]]  # vLLM's objects: the sample must not alias them
    sampling = {"temperature": 0.7, "logits_modified": True, "allowed_token_ids": allowed, "bad_words_token_ids": bad}
    s = build_sample(make_request(sampling=sampling), arm="candidate", release=None, instance=None,
                     redact_prompts=False)
    validate_sample(s)
    assert sample_errors(s) == []
    sp = s["sampling"]
    assert sp["allowed_token_ids"] == [3, 5, 9] and sp["allowed_token_ids_count"] == 3
    assert sp["allowed_token_ids_sha256"] == hashlib.sha256(b"[3,5,9]").hexdigest()
    assert sp["bad_words_token_ids"] == bad and sp["bad_words_token_ids"] is not bad
    assert sp["logits_modified"] is True  # what a sidecar older than 1.6 keys on
    many = list(range(MAX_ALLOWED_TOKEN_IDS + 1))
    s = build_sample(make_request(sampling={"temperature": 0.7, "allowed_token_ids": many, "bad_words": ["foo"]}),
                     arm="candidate", release=None, instance=None, redact_prompts=False)
    validate_sample(s)
    assert "allowed_token_ids" not in s["sampling"] and s["sampling"]["allowed_token_ids_count"] == len(many)
    assert s["sampling"]["bad_words"] == ["foo"]
    for field, bad_value in (("allowed_token_ids", ["3"]), ("allowed_token_ids", [-1]), ("allowed_token_ids", []),
                             ("allowed_token_ids", many), ("allowed_token_ids_count", 0),
                             ("allowed_token_ids_sha256", "xyz"), ("bad_words_token_ids", [7, 8]),
                             ("bad_words_token_ids", [[]]), ("bad_words_token_ids", [[1.5]]), ("bad_words", [3])):
        wrong = {**s, "sampling": {**s["sampling"], field: bad_value}}
        assert any(e.startswith(f"sampling/{field}") for e in validation_errors(wrong)), (field, bad_value)
        assert sample_errors(wrong), (field, bad_value)


def test_redaction_keeps_hash_drops_text():
    req = make_request()
    s = build_sample(req, arm="unknown", release=None, instance=None, redact_prompts=True)
    validate_sample(s)
    assert s["prompt"]["text"] is None and s["prompt"]["redacted"] is True
    assert s["prompt_token_ids"] is None
    assert s["prompt"]["sha256"] == prompt_sha256("def add(a, b):", None)
    assert "def add" not in str(s)


def test_spec_summary_matches_vllm_definitions():
    # histogram[j] = steps that accepted j drafts: 1x0 + 0x1 + 2x2 + 1x3 = 7 accepted in 4 steps
    s = spec_summary(Spec([1, 0, 2, 1], 12))
    assert s["num_accepted_tokens"] == 7 and s["steps"] == 4 and s["num_draft_tokens"] == 12
    assert s["acceptance_rate"] == pytest.approx(7 / 12)
    assert s["mean_accepted_length"] == pytest.approx(1 + 7 / 4)
    assert spec_summary(None) is None
    assert spec_summary(Spec([0, 0], 0))["acceptance_rate"] is None


def test_draft_mask_lays_the_step_lists_over_the_output_tokens():
    """Steps (drafted, accepted): the prefill (0, 0) -> '.', a step accepting 2 of 3 -> 'AAR', a step
    accepting all 2 -> 'AAB', a step without a draft -> '.'; a stop inside the last step cuts the mask.
    Without the steps that had no draft (patch absent, or level summary) there is no mask, not a wrong one."""
    from types import SimpleNamespace

    from vllm_lookahead.telemetry.record import draft_mask

    spec = SimpleNamespace(histogram=[0, 0, 2], num_draft_tokens=5, per_step_drafted=[0, 3, 2, 0],
                           per_step_accepted=[0, 2, 2, 0])
    assert draft_mask(spec, 8) == ".AARAAB."
    assert draft_mask(spec, 6) == ".AARAA"
    assert draft_mask(spec, 9) is None  # more tokens than the steps committed: a step is missing
    assert draft_mask(SimpleNamespace(per_step_drafted=[3, 2], per_step_accepted=[2, 2]), 6) is None
    assert draft_mask(SimpleNamespace(histogram=[1]), 3) is None
    s = spec_summary(spec, 8)
    assert s["draft_mask"] == ".AARAAB." and s["num_drafts"] == 2
    sample = build_sample(make_request(), arm="candidate", release=None, instance=None, redact_prompts=False)
    sample["spec"] = s
    validate_sample(sample)


def test_steps_without_drafts_are_recorded_in_step_order():
    """The engine patch's logic on vLLM-shaped objects (duck-typed: a real scheduler cannot be driven
    step by step outside an engine; tests/telemetry/test_telemetry_vllm.py checks it in a real one)."""
    from types import SimpleNamespace

    from vllm_lookahead.vllm.spec_steps import record_steps_without_drafts

    def req(finished=False, stale=0):
        m = SimpleNamespace(per_step_drafted=[], per_step_accepted=[])
        return SimpleNamespace(spec_decode_metrics=m, is_finished=lambda: finished, num_stale_output_tokens=stale)

    reqs = {"plain": req(), "drafted": req(), "chunk": req(), "done": req(finished=True), "stale": req(stale=1),
            "no_metrics": SimpleNamespace(spec_decode_metrics=None)}
    sched = SimpleNamespace(requests=reqs, spec_decode_metrics_level="detailed")
    so = SimpleNamespace(num_scheduled_tokens={k: 1 for k in [*reqs, "gone"]},
                         scheduled_spec_decode_tokens={"drafted": [5, 6]})
    out = SimpleNamespace(req_id_to_index={k: i for i, k in enumerate([*reqs, "gone"])},
                          sampled_token_ids=[[1], [1, 2], [], [1], [1], [1], [1]])
    assert record_steps_without_drafts(sched, so, out) == 1
    assert reqs["plain"].spec_decode_metrics.per_step_drafted == [0]
    assert all(not reqs[k].spec_decode_metrics.per_step_drafted for k in ("drafted", "chunk", "done", "stale"))
    out.sampled_token_ids = []
    assert record_steps_without_drafts(sched, so, out) == 0


def test_invalid_sample_is_dropped_and_counted(tmp_path):
    cfg = TelemetryConfig.from_env({"VLLM_LOOKAHEAD_SAMPLE_RATE": "1"})
    sink = FileSink(str(tmp_path / "s.jsonl"), None)
    sampler = Sampler(cfg, sink=sink, register_atexit=False)
    sink.stats = sampler.stats
    bad = make_request("bad", sampling={"temperature": -1.0})  # negative temperature: schema says no
    assert validation_errors(build_sample(bad, arm="unknown", release=None, instance=None,
                                          redact_prompts=False))
    sampler.offer(bad)
    sampler.offer(make_request("good"))
    sampler.shutdown(5)
    lines = (tmp_path / "s.jsonl").read_text().splitlines()
    assert len(lines) == 1 and '"request_id":"good"' in lines[0]
    assert sampler.stats.dropped["invalid"] == 1 and sampler.stats.sent == 1


class _BlockedSink(Sink):
    """Fault injection: a sink that hangs (what a stuck network write looks like to the thread)."""

    def __init__(self):
        self.release = threading.Event()
        self.sent = 0

    def send(self, key, value):
        self.release.wait(30)
        self.sent += 1

    def close(self, timeout_s):
        pass


def test_full_queue_drops_and_counts_without_waiting():
    cfg = TelemetryConfig.from_env({"VLLM_LOOKAHEAD_SAMPLE_RATE": "1", "VLLM_LOOKAHEAD_QUEUE_SIZE": "8"})
    sink = _BlockedSink()
    sampler = Sampler(cfg, sink=sink, register_atexit=False)
    start = time.perf_counter()
    for i in range(200):
        assert sampler.offer(make_request(f"r{i}")) is True
    elapsed = time.perf_counter() - start
    s = sampler.stats
    assert s.sampled == 200
    # at most the queue plus the one item the blocked thread holds got through
    assert s.dropped["queue_full"] >= 200 - 9
    assert elapsed < 1.0  # generous: 200 offers into a hung sink must not wait for it
    sink.release.set()
    sampler.shutdown(5)
    assert sink.sent + s.dropped["queue_full"] + s.dropped["shutdown"] == 200


def test_frontend_only_in_frontend_processes(monkeypatch):
    assert is_frontend_process("MainProcess") and is_frontend_process("ApiServer_0")
    for name in ("EngineCore", "EngineCore_DP1", "VllmWorker-0"):
        assert not is_frontend_process(name)
    assert is_worker_process("VllmWorker-0") and not is_worker_process("EngineCore")
    monkeypatch.delenv("VLLM_LOOKAHEAD_TELEMETRY", raising=False)
    assert install_if_configured() is None  # off by default: installing the package changes nothing
    assert install_if_configured({"VLLM_LOOKAHEAD_TELEMETRY": "0"}) is None


def test_fast_check_agrees_with_the_schema_on_token_arrays():
    from vllm_lookahead.telemetry.sampler import sample_errors

    good = build_sample(make_request(), arm="unknown", release=None, instance=None, redact_prompts=False)
    assert sample_errors(good) == [] == validation_errors(good)
    for field in ("prompt", "output"):
        bad = build_sample(make_request(), arm="unknown", release=None, instance=None,
                           redact_prompts=False)
        if field == "prompt":
            bad["prompt_token_ids"][1] = -5
        else:
            bad["output"]["token_ids"][0] = "7"
        assert validation_errors(bad) and sample_errors(bad)  # both reject it


def test_sampler_thread_is_recreated_after_fork(tmp_path):
    import os

    path = tmp_path / "s.jsonl"
    cfg = TelemetryConfig.from_env({"VLLM_LOOKAHEAD_SAMPLE_RATE": "1",
                                    "VLLM_LOOKAHEAD_SAMPLE_SINK": f"file://{path}"})
    sampler = Sampler(cfg, register_atexit=False)
    sampler.offer(make_request("parent-1"))  # starts the thread in the parent
    deadline = time.time() + 10
    while sampler.stats.sent < 1 and time.time() < deadline:
        time.sleep(0.05)
    pid = os.fork()
    if pid == 0:  # child: threads did not survive the fork; the first offer must start a new one
        code = 1
        try:
            sampler.offer(make_request("child-1"))
            sampler.shutdown(5)
            code = 0 if sampler.stats.sent == 2 else 3  # parent's count (1) was inherited
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    sampler.shutdown(5)
    ids = sorted(json.loads(line)["request_id"] for line in path.read_text().splitlines())
    assert ids == ["child-1", "parent-1"]


def test_seeded_exact_is_claimed_only_where_a_seeded_output_reproduces_without_speculation():
    """Schema 1.5 ``decoder.seeded_exact``: lookahead's coupled verification on CPU with float32 logits
    (this machine) keeps vLLM's seed promise; in bf16 and for vLLM's own methods the rejection sampler
    draws differently, so the sidecar must not replay their seeded outputs token for token."""
    from vllm_lookahead.vllm.frontend_patch import seeded_exact

    assert seeded_exact("lookahead", "float32")
    assert not seeded_exact("lookahead", "bfloat16") and not seeded_exact("lookahead", None)
    assert not any(seeded_exact(m, "float32") for m in ("ngram", "suffix", "eagle", "unknown"))
