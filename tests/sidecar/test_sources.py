"""Sources behind the ``Source`` protocol (quality_sidecar/sources/base.py): the service calls only
the protocol's members, so every implementation must have all of them, and ``open_source`` is the one
place that maps a URL to an implementation."""

from __future__ import annotations

import inspect
import json

import pytest

from quality_sidecar.sources import OPENERS, open_source
from quality_sidecar.sources.base import Source
from quality_sidecar.sources.file import FileSource
from quality_sidecar.sources.kafka import KafkaSource

pytestmark = pytest.mark.unit

ATTRIBUTES = set(Source.__annotations__)  # eof, rebalances, on_revoke: set in __init__
METHODS = {n for n, v in vars(Source).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))}


def test_the_protocol_is_what_the_service_uses() -> None:
    assert {"poll", "commit", "commit_async", "close", "lag", "lag_report", "pause", "resume", "rewind",
            "restore", "owns", "committed_metadata", "member", "progress", "ready"} == METHODS
    assert {"eof", "rebalances", "on_revoke"} == ATTRIBUTES


@pytest.mark.parametrize("cls", [FileSource, KafkaSource])
def test_every_source_implements_the_whole_protocol(cls: type) -> None:
    missing = sorted(n for n in METHODS if not hasattr(cls, n))
    init = inspect.getsource(cls.__init__)
    missing += sorted(n for n in ATTRIBUTES if f"self.{n} " not in init and f"self.{n}:" not in init)
    assert not missing, f"{cls.__name__} lacks {missing}"


def test_open_source_maps_schemes_and_rejects_others(tmp_path) -> None:
    assert set(OPENERS) == {"file", "kafka"}
    p = tmp_path / "s.jsonl"
    p.write_text("")
    src = open_source(f"file://{p}", max_poll_records=7)
    assert isinstance(src, FileSource) and src.batch == 7
    src.close()
    for bad in ("http://x/y", "samples.jsonl", "kafka:/x"):
        with pytest.raises(ValueError, match="bad --source"):
            open_source(bad)


def test_file_source_pause_restore_and_rewind(tmp_path) -> None:
    p = tmp_path / "s.jsonl"
    p.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(6)))
    src = FileSource(str(p))
    first = src.poll(0.0, 3)
    assert [r.offset for r in first] == [0, 1, 2] and src.owns((str(p), 0))
    src.pause()
    assert src.poll(0.0, 3) == []  # paused: reads nothing
    src.resume()
    src.rewind(first[1:])  # read again from line 1
    assert [r.offset for r in src.poll(0.0, 2)] == [1, 2]
    assert src.progress() == (src.fh.tell(), p.stat().st_size)
    src.close()
    again = FileSource(str(p))
    again.restore({(str(p), 0): 4})  # a checkpoint's next offset
    assert [json.loads(r.value)["i"] for r in again.poll(0.0, 10)] == [4, 5] and again.eof
    assert again.member() is None and again.lag_report() == [] and again.committed_metadata([(str(p), 0)]) == {}
    again.close()


def test_the_service_reads_a_file_through_the_protocol(tmp_path) -> None:
    from quality_sidecar.service import Service, ServiceConfig
    from tests.support.synth import SampleStream

    samples = SampleStream(seed=5, arm="baseline").take(30) + SampleStream(seed=6, arm="candidate").take(30)
    p = tmp_path / "s.jsonl"
    p.write_text("".join(json.dumps(s) + "\n" for s in samples) + "not json\n")
    svc = Service(ServiceConfig(source=f"file://{p}", state_path=str(tmp_path / "state.json"), progress=False))
    assert svc.run() == 0
    counts = svc.pipeline.counts
    assert counts == {"samples": 60, "duplicates": 0, "dlq": 1}
    assert {k: s.samples for k, s in svc.pipeline.charts.streams.items()} == {
        (samples[0]["model"], "baseline"): 30, (samples[0]["model"], "candidate"): 30}
    # a restart resumes after the checkpointed line: nothing is read or counted twice
    again = Service(ServiceConfig(source=f"file://{p}", state_path=str(tmp_path / "state.json"), progress=False))
    assert again.run() == 0 and again.pipeline.counts == counts
