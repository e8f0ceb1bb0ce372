"""The sidecar survives the outputs it exists to catch: no record stops the stream.

Every record read is processed, a duplicate, or in the DLQ with its reason -- whatever its bytes,
its JSON, or its (schema-valid) adversarial fields -- and offsets only pass records in one of those
three states.  The fuzz test drives the real record path (``Service.step`` over a real JSONL file
source, the real classifiers and charts, the real DLQ writer) with hypothesis-generated records.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quality_sidecar.service import Service, ServiceConfig
from quality_sidecar.sources.file import FileSource
from tests.support.synth import SampleStream

pytestmark = pytest.mark.unit

# The record that crashed `quality-sidecar run` (RecursionError in the format classifier's json.loads):
# a JSON request answered by a looping decoder.
NESTED = "[" * 5000 + "]" * 5000


def _bases() -> list[dict[str, Any]]:
    greedy = SampleStream(seed=1, model="m", arm="baseline").take(3)
    sampled = SampleStream(seed=2, model="m", arm="candidate", speculative=True, greedy_fraction=0.0).take(3)
    return greedy + sampled


BASES = _bases()

# Every field the sidecar reads (and a few it does not), to be overwritten with anything at all.
PATHS = ["sampling.temperature", "sampling.top_p", "sampling.top_k", "sampling.min_p", "sampling.seed",
         "sampling.max_tokens", "sampling.min_tokens", "sampling.n", "sampling.response_format",
         "sampling.repetition_penalty", "sampling.logits_modified", "output.text", "output.token_ids",
         "output.num_tokens", "output.finish_reason", "output.stop_reason", "output", "spec",
         "spec.acceptance_rate", "spec.num_draft_tokens", "spec.num_accepted_tokens", "spec.draft_mask",
         "prompt.text", "prompt.sha256", "prompt.num_tokens", "prompt_token_ids", "deployment.arm",
         "deployment", "decoder.params", "decoder.method", "model", "trace_id", "request_id", "error",
         "time.finish_unix_s", "time.ttft_s", "schema_version"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30))
values = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                        st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                      max_leaves=12)
deep = st.integers(1, 20_000).flatmap(lambda n: st.sampled_from(
    ["[" * n + "]" * n, '{"a":' * n + "1" + "}" * n, "(" * n + ")" * n, "```python\n" + "[" * n,
     "def f():\n" + "    if x:\n" * min(n, 200) + "        pass\n"]))
texts = st.one_of(
    st.text(max_size=300),  # any unicode
    st.text(st.characters(codec=None, categories=["Cs", "Co", "Cc", "Zl"]), max_size=40),  # lone surrogates & co
    deep,
    st.integers(1_000, 300_000).map(lambda n: "ab " * (n // 3)),  # huge strings
    st.sampled_from(["", "null", "NaN", "{", "[1,", '{"a": NaN}', "1e999", "\x00" * 10, "I cannot help with that."]),
)
mutations = st.one_of(
    st.tuples(st.just("text"), texts),
    st.tuples(st.just("field"), st.sampled_from(PATHS), values),
    st.tuples(st.just("ids"), st.sampled_from(["output.token_ids", "prompt_token_ids"]),
              st.lists(st.integers(-5, 2**40), max_size=50)),
    st.tuples(st.just("rformat"), st.one_of(st.just({"type": "json_object"}), values.map(
        lambda v: {"type": "json_schema", "json_schema": {"schema": v}}), values)),
    st.tuples(st.just("extra"), st.text(max_size=10), values),
)
records = st.one_of(
    st.binary(max_size=64),                                             # not JSON at all
    values.map(lambda v: json.dumps(v).encode()),                      # JSON, not a sample
    st.tuples(st.sampled_from(range(len(BASES))), st.lists(mutations, max_size=3), st.integers(0, 40),
              st.booleans()),                                          # a sample with adversarial fields
)


def _set(obj: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for p in parents:
        if not isinstance(obj.get(p), dict):
            obj[p] = {}
        obj = obj[p]
    obj[leaf] = value


def _render(spec: Any, example: int) -> bytes:
    if isinstance(spec, bytes):
        return spec
    base, muts, rid, ascii_only = spec
    s = copy.deepcopy(BASES[base])
    s["request_id"] = f"ex{example}-{rid}"  # repeats within an example are duplicates
    for kind, *args in muts:
        if kind == "text":
            _set(s, "output.text", args[0])
        elif kind in ("field", "ids"):
            _set(s, *args)
        elif kind == "rformat":
            _set(s, "sampling.response_format", args[0])
        else:
            s[args[0]] = args[1]
    # Lone surrogates survive as \\ud800 escapes (ascii) or as bytes that are not UTF-8.
    return json.dumps(s, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    d = tmp_path_factory.mktemp("poison")
    empty = d / "empty.jsonl"
    empty.write_bytes(b"")
    svc = Service(ServiceConfig(source=f"file://{empty}", dlq=f"file://{d / 'dlq.jsonl'}", progress=False))
    yield svc, d
    svc.close()


EXAMPLES = {"n": 0, "records": 0}


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    """Any JSON-ish value (NaN, infinities and huge ints included), nested a little."""
    kinds = [lambda: None, lambda: rng.random() < 0.5, lambda: rng.randrange(-2**70, 2**70),
             lambda: rng.choice([math.nan, math.inf, -math.inf, 1e308]), lambda: rng.uniform(-1e6, 1e6),
             lambda: "".join(chr(rng.randrange(0x110000)) for _ in range(rng.randrange(12))),
             lambda: rng.choice(PATHS),
             lambda: [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))],
             lambda: {str(rng.randrange(99)): _random_value(rng, depth + 1) for _ in range(rng.randrange(4))}]
    return rng.choice(kinds if depth < 3 else kinds[:7])()


def _random_text(rng: random.Random) -> str:
    n = rng.randrange(1, 20_000)
    return rng.choice([
        lambda: "".join(chr(rng.randrange(0x110000)) for _ in range(rng.randrange(300))),  # surrogates too
        lambda: "[" * n + "]" * n, lambda: '{"a":' * n + "1" + "}" * n, lambda: "(" * n + ")" * n,
        lambda: "```python\n" + "[" * n, lambda: "def f():\n" + "    if x:\n" * min(n, 200),
        lambda: "ab " * rng.randrange(1, 30_000), lambda: rng.choice(["", "null", "NaN", "{", "[1,", "1e999"]),
    ])()


def _random_spec(rng: random.Random) -> Any:
    """The same catalogue as ``records``, drawn from a seeded ``random.Random`` (bulk volume)."""
    r = rng.random()
    if r < 0.05:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
    if r < 0.1:
        return json.dumps(_random_value(rng)).encode()
    muts = []
    for _ in range(rng.randrange(4)):
        k = rng.choice((0, 0, 0, 1, 2, 3, 3, 4))  # mostly schema-valid: they reach the classifiers and charts
        if k == 0:
            muts.append(("text", _random_text(rng)))
        elif k == 1:
            muts.append(("field", rng.choice(PATHS), _random_value(rng)))
        elif k == 2:
            muts.append(("ids", rng.choice(["output.token_ids", "prompt_token_ids"]),
                         [rng.randrange(-5, 2**40) for _ in range(rng.randrange(50))]))
        elif k == 3:
            muts.append(("rformat", rng.choice([{"type": "json_object"}, _random_value(rng),
                                                {"type": "json_schema", "json_schema": {"schema": _random_value(rng)}}])))
        else:
            muts.append(("extra", str(rng.randrange(99)), _random_value(rng)))
    return rng.randrange(len(BASES)), muts, rng.randrange(300), rng.random() < 0.5


def _run_batch(svc: Service, d: Path, specs: list[Any]) -> int:
    """Write the records to a fresh file, read it to the end through ``Service.step``; check that every
    record was processed, a duplicate or dead-lettered, and that offsets cover exactly the file."""
    EXAMPLES["n"] += 1
    lines = [r for r in (_render(spec, EXAMPLES["n"]).replace(b"\n", b" ").replace(b"\r", b" ") for spec in specs)
             if r.strip()]
    path = d / f"batch{EXAMPLES['n']}.jsonl"
    path.write_bytes(b"".join(r + b"\n" for r in lines))
    svc.source.close()
    svc.source = FileSource(str(path))
    before = dict(svc.pipeline.counts)
    while not svc.source.eof:
        svc.step(0.0)
    after = svc.pipeline.counts
    handled = sum(after[k] - before[k] for k in ("samples", "duplicates", "dlq"))
    assert handled == len(lines), (before, after, len(lines))
    assert svc.consumed.get((str(path), 0), 0) == len(lines)
    path.unlink()
    EXAMPLES["records"] += len(lines)
    return len(lines)


@settings(max_examples=150, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(batch=st.lists(records, min_size=1, max_size=12))
def test_fuzzed_records_never_crash_and_all_are_accounted_for(service, batch):
    """Hypothesis explores (and shrinks) the record catalogue: no crash, every record accounted for."""
    _run_batch(*service, batch)


@settings(max_examples=int(os.environ.get("FUZZ_VOLUME_EXAMPLES", 210)), deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**63))
def test_fuzzed_record_volume(service, seed):
    """Volume: 500 records per example drawn from the same catalogue by a ``random.Random`` with a
    hypothesis-chosen seed (hypothesis' own ``randoms()`` costs a draw per call: minutes here)."""
    rng = random.Random(seed)
    _run_batch(*service, [_random_spec(rng) for _ in range(500)])


def test_fuzz_volume():
    """Runs after the fuzz tests (file order): the property held over >= 100,000 generated records."""
    assert EXAMPLES["records"] >= 100_000, EXAMPLES


def test_nested_json_output_is_classified_and_the_cli_keeps_running(tmp_path):
    """The reported record through the real CLI: exit 0, both records processed, none dead-lettered;
    and the format classifier flags it (a degenerate answer to a JSON request)."""
    from quality_sidecar.classifiers.format import FormatClassifier

    s = copy.deepcopy(BASES[3])
    s["sampling"]["response_format"] = {"type": "json_object"}
    s["output"]["text"] = NESTED
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(s) + "\n" + json.dumps(BASES[4]) + "\n")
    cli = Path(sys.executable).parent / "quality-sidecar"
    r = subprocess.run([str(cli), "run", "--source", f"file://{src}", "--dlq", f"file://{tmp_path / 'dlq.jsonl'}",
                        "--http-port", "-1", "--no-progress"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "processed 2 samples, 0 to the DLQ" in r.stderr, r.stderr[-2000:]
    v = FormatClassifier().classify(NESTED, response_format={"type": "json_object"}, finish_reason="stop")
    assert v.flagged and "nested" in v.detail, v


class _Explodes:
    """Fault injection (a mock, on purpose): a classifier that raises on one marked output.  No real
    classifier is known to raise any more, which is the point of the test."""

    name = "explodes"

    def classify(self, text, *, prompt=None, response_format=None, finish_reason=None):
        from quality_sidecar.classifiers.base import Verdict

        if text and "BOOM" in text:
            raise ValueError("classifier bug")
        return Verdict(self.name, False, 0.0, "fine")


def test_a_raising_classifier_or_chart_dead_letters_only_its_record(tmp_path):
    src = tmp_path / "in.jsonl"
    samples = SampleStream(seed=5, model="m", arm="candidate").take(10)
    samples[3]["output"]["text"] = "BOOM"
    src.write_text("".join(json.dumps(s) + "\n" for s in samples))
    dlq = tmp_path / "dlq.jsonl"
    svc = Service(ServiceConfig(source=f"file://{src}", dlq=f"file://{dlq}", progress=False))
    svc.pipeline.classifiers.append(_Explodes())

    chart = svc.pipeline._add_repeat

    def broken_chart(smp):  # fault injection: a chart bug on one record
        if smp["request_id"] == samples[7]["request_id"]:
            raise ZeroDivisionError("chart bug")
        return chart(smp)

    svc.pipeline._add_repeat = broken_chart
    svc.run()
    assert svc.pipeline.counts == {"samples": 8, "duplicates": 0, "dlq": 2}, svc.pipeline.counts
    assert svc.pipeline.dlq_reasons == {"classifier_error": 1, "detector_error": 1}
    dead = [json.loads(line) for line in dlq.read_text().splitlines()]
    assert [json.loads(d["value"])["request_id"] for d in dead] == [samples[3]["request_id"],
                                                                  samples[7]["request_id"]]
    assert "classifier bug" in dead[0]["reason"] and "chart bug" in dead[1]["reason"]
    assert svc.consumed[(str(src), 0)] == 10
