"""Every detector and chart of ``quality_sidecar.detectors`` implements the one contract (``base.Detector``).

Why: the T>0 charts once had ad-hoc state (a flat dict, per-arm ``add`` methods), so the service's
checkpoint and acknowledge code needed a case per chart, and nothing stopped a new chart from adding
another.  The classes are found by walking the package, not listed: a new class must either pass the
contract (and get an example here, or this test fails) or be declared a value type or an abstract base.
Also checked: an unversioned or older state is refused with the one error that says to delete the state file.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import typing
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import quality_sidecar.detectors as detectors
from quality_sidecar.detectors import (
    BernoulliCUSUM,
    GaussianCUSUM,
    PairedExactMatch,
)
from quality_sidecar.detectors.base import ArmControlChart, Detector, Result, StatefulDetector
from quality_sidecar.detectors.conformance_charts import ConformanceChart, ImpossibleTokenChart
from quality_sidecar.detectors.conformance_scoring import SequenceScore
from quality_sidecar.detectors.cusum import ExcessCusum, PitCusum
from quality_sidecar.detectors.repeats import RepeatChart

pytestmark = pytest.mark.unit

# Classes of the package that are not detectors.
VALUE_TYPES = {"Result", "TestResult", "SamplerParams", "SequenceScore", "ShiftResult", "HashedNgramEmbedder",
               "MiniLMEmbedder"}
ABSTRACT = {"Detector", "StatefulDetector", "ArmControlChart"}


def package_classes() -> dict[str, type]:
    """Every class defined in a module of ``quality_sidecar.detectors`` (walked, not listed)."""
    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(detectors.__path__, detectors.__name__ + "."):
        mod = importlib.import_module(info.name)
        for name, obj in vars(mod).items():
            if inspect.isclass(obj) and obj.__module__ == mod.__name__:
                found[name] = obj
    return found


def _scores(rng: np.random.Generator, n: int) -> tuple[list[SequenceScore], list[np.ndarray]]:
    """Scored samples of 40 tokens, a little sharper than specified, with draft positions."""
    scores = [SequenceScore(np.log(rng.random(40)), rng.random(40) ** 1.3, excess=rng.normal(0.2, 1.0, 40),
                            excess_var=np.ones(40), kept=np.arange(40)) for _ in range(n)]
    return scores, [rng.integers(0, 4, 40) for _ in range(n)]


def _impossible(c: ImpossibleTokenChart, rng: np.random.Generator) -> Result:
    for _ in range(10):
        c.update("baseline", 100, {"top_p": int(rng.poisson(0.05))})
        r = c.update("candidate", 100, {"top_p": int(rng.poisson(2.0)), "min_p": int(rng.poisson(0.5))})
    return r


def _repeats(c: RepeatChart, rng: np.random.Generator) -> Result:
    r = None
    for _ in range(300):
        arm = "candidate" if rng.random() < 0.5 else "baseline"
        r = c.update(arm, f"p{rng.integers(6)}", f"o{0 if arm == 'candidate' else rng.integers(3)}")
    assert r is not None
    return r


_NO_PREP: Callable[[Any], None] = lambda d: None  # noqa: E731

# name -> (a fresh instance (config only), prepare the first instance (fit), feed it a batch -> Result)
EXAMPLES: dict[str, tuple[Callable[[], Any], Callable[[Any], Any], Callable[[Any, np.random.Generator], Result]]] = {
    "BernoulliCUSUM": (lambda: BernoulliCUSUM("r", 1e5, delta=0.05),
                       lambda d: d.fit(np.random.default_rng(0).random(500) < 0.02),
                       lambda d, rng: d.update(rng.random(400) < 0.12)),
    "GaussianCUSUM": (lambda: GaussianCUSUM("len", 1e5, "up", 0.5),
                      lambda d: d.fit(np.random.default_rng(0).normal(0, 1, 500)),
                      lambda d, rng: d.update(rng.normal(0.4, 1, 150))),
    "PairedExactMatch": (lambda: PairedExactMatch(1e5, block=10),
                         lambda d: d.add_aa([False] * 397 + [True] * 3, "replay"),
                         lambda d, rng: d.update([([1, 2, 3], [1, 2, int(rng.integers(3, 5))])] * 5
                                                 + [([1], [1])] * 10, "replay")),
    "PitCusum": (lambda: PitCusum(ert_tokens=1e5, shift=0.2), _NO_PREP,
                 lambda d, rng: d.update([rng.random(40) ** 1.3 for _ in range(30)])),
    "ExcessCusum": (lambda: ExcessCusum(ert_tokens=1e5, shift=0.2), _NO_PREP,
                    lambda d, rng: d.update([(rng.normal(0.2, 1, 40), np.ones(40)) for _ in range(30)])),
    "ConformanceChart": (lambda: ConformanceChart(ert_tokens=1e5, shift=0.2), _NO_PREP,
                         lambda d, rng: d.update(*_scores(rng, 30))),
    "ImpossibleTokenChart": (lambda: ImpossibleTokenChart(alpha=1e-3, floor_per_token=1e-4), _NO_PREP, _impossible),
    "RepeatChart": (lambda: RepeatChart(alpha=1e-3), _NO_PREP, _repeats),
}


def _strict_json(obj: Any) -> Any:
    """What the state file holds: strict JSON (no NaN), read back."""
    return json.loads(json.dumps(obj, allow_nan=False))


def _result_json(r: Result) -> str:
    return json.dumps(r.to_dict(), sort_keys=True)


def test_the_walk_finds_every_detector_and_nothing_is_unclassified() -> None:
    classes = package_classes()
    assert {"BernoulliCUSUM", "GaussianCUSUM", "PairedExactMatch", "PitCusum", "ExcessCusum",
            "ConformanceChart", "ImpossibleTokenChart", "RepeatChart"} <= set(classes)  # the walk is not vacuous
    unclassified = set(classes) - VALUE_TYPES - ABSTRACT - set(EXAMPLES)
    assert not unclassified, f"new classes in quality_sidecar.detectors: add an example to EXAMPLES: {unclassified}"
    stale = (VALUE_TYPES | ABSTRACT | set(EXAMPLES)) - set(classes)
    assert not stale, f"listed here but gone from the package: {stale}"
    for name in VALUE_TYPES:
        assert not issubclass(classes[name], StatefulDetector), f"{name} is a detector, not a value type"


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_detector_implements_the_contract(name: str) -> None:
    cls = package_classes()[name]
    make, prepare, feed = EXAMPLES[name]
    assert issubclass(cls, StatefulDetector)
    assert cls.STATE and all(isinstance(k, str) for k in cls.STATE) and cls.STATE_VERSION >= 1
    assert typing.get_type_hints(cls.update)["return"] is Result, f"{name}.update must be annotated -> Result"
    det = make()
    prepare(det)
    r = feed(det, np.random.default_rng(1))
    assert isinstance(r, Result) and isinstance(det, Detector)
    assert all(hasattr(det, k) for k in cls.STATE)

    # get_state -> set_state on a fresh instance of the same config reproduces the state ...
    st = _strict_json(det.get_state())
    assert st["type"] == name and st["version"] == cls.STATE_VERSION and set(st["state"]) == set(cls.STATE)
    twin = make()
    twin.set_state(st)
    assert _strict_json(twin.get_state()) == st
    assert twin.alarm_ == det.alarm_
    # ... and both evolve alike afterwards
    for seed in (2, 3):
        ra, rb = feed(det, np.random.default_rng(seed)), feed(twin, np.random.default_rng(seed))
        assert _result_json(ra) == _result_json(rb)
    assert _strict_json(twin.get_state()) == _strict_json(det.get_state())

    # a newer state version is refused, and an unversioned or older one by StatefulDetector's one error
    # (no upgrade code is kept); acknowledge clears every latched alarm
    with pytest.raises(ValueError, match="newer"):
        make().set_state({**st, "version": cls.STATE_VERSION + 1})
    for old, found in ((st["state"], "none"), ({**st, "version": cls.STATE_VERSION - 1}, cls.STATE_VERSION - 1)):
        with pytest.raises(ValueError, match=rf"^{name}: state version {found}, expected {cls.STATE_VERSION};"
                                             r".*delete the state file \(state_path\) to start fresh"):
            make().set_state(old)
    det.acknowledge()
    assert not det.alarm_


def test_examples_exercise_alarms() -> None:
    """The round trips above carry latched alarms, not only zeros (for the charts that alarm per arm too)."""
    fired = set()
    for name, (make, prepare, feed) in EXAMPLES.items():
        det = make()
        prepare(det)
        for seed in (1, 2, 3):
            feed(det, np.random.default_rng(seed))
        if det.alarm_:
            fired.add(name)
    assert {"BernoulliCUSUM", "PitCusum", "ExcessCusum", "ConformanceChart", "ImpossibleTokenChart",
            "RepeatChart"} <= fired, fired


def test_arm_control_charts_share_the_base() -> None:
    for cls in (ImpossibleTokenChart, RepeatChart):
        assert issubclass(cls, ArmControlChart) and cls.CONTROL == "baseline"
    c = ImpossibleTokenChart(alpha=1e-3, floor_per_token=1e-4)
    for _ in range(5):
        _impossible(c, np.random.default_rng(0))
    assert c.control()["samples"] == 50 and c.arms["candidate"]["alarm"]
    c.reset("candidate")
    assert "candidate" not in c.arms and "baseline" in c.arms and not c.alarm_
