"""Shared result type, the detector contract and its state protocol.

**The contract (``Detector``).** Every detector and chart of ``quality_sidecar.detectors`` subclasses
``StatefulDetector`` and so is a ``Detector``: declared, versioned state, ``update(...) -> Result``
(the arguments are the detector's own: a batch, or an arm and its sample for the per-arm charts),
``reset()`` and ``acknowledge()``.  tests/sidecar/test_detector_contract.py walks the package and
checks every class in it, so a new detector cannot skip the contract.  Charts that judge the
candidate arm against the control (baseline) arm share ``ArmControlChart``.

**State protocol (``StatefulDetector``).** Why: a restart must neither forget an alarm nor its
evidence (a CUSUM sum, a two-sample window, an A/A count), and an acknowledged alarm must stay
acknowledged; the service persists every detector in one state file.  A detector:

* sets ``STATE = ("attr", ...)``: the attributes that, with the constructor arguments (the
  config), restore it exactly;
* may set ``STATE_VERSION`` (bump it when the meaning of ``STATE`` changes): ``set_state`` reads only
  that version; an older or unversioned state is refused with the one error that says to delete the
  state file (no upgrade code is kept), a newer one with an error that says to upgrade the sidecar;
* may override ``_encode_state`` / ``_decode_state`` for values plain JSON cannot carry (tuples,
  int dict keys, deques, nested detectors: only the parent knows a child's constructor arguments);
* may override ``_after_set_state()`` to rebuild derived values (thresholds, increments).

``get_state()`` returns JSON-safe ``{"type": class name, "version": STATE_VERSION, "state": {...}}``;
``set_state(get_state())`` on a fresh instance of the same config gives back the same statistics
and alarm status.  ``alarm_`` latches until ``acknowledge()``, which restarts the statistic so the
detector can fire again (default: ``reset()``).

Every alarm threshold is derived from an *expected run time* (ERT, a.k.a. ARL0): the mean number of
samples between false alarms on a stream without drift.  A budget split over d detectors gives each
ERT_d = d * ERT_total (union bound: the alarm rates add up).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable


@dataclass
class Result:
    """What ``update`` returns: the current statistic, its alarm threshold and whether it fired.

    ``pvalue`` is set by tests that have one (two-sample tests), ``alarm_new`` is True only on the
    update that crossed the threshold, ``n`` counts the samples seen since ``fit``.
    """

    detector: str
    statistic: float
    threshold: float
    alarm: bool
    alarm_new: bool = False
    pvalue: float | None = None
    n: int = 0
    alarm_index: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (for the state file); ``extra`` keeps only JSON-safe values."""
        extra = {}
        for k, v in self.extra.items():
            try:
                extra[str(k)] = to_jsonable(v)
            except TypeError:  # a diagnostic that JSON cannot carry is dropped, not the state
                continue
        return to_jsonable({**{f: getattr(self, f) for f in self.__dataclass_fields__ if f != "extra"},
                            "extra": extra})

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Result:
        return cls(**{**d, "extra": dict(d.get("extra") or {})})


def to_jsonable(value: Any) -> Any:
    """Plain JSON types for numpy scalars and arrays, tuples, deques, Counters and nested detectors."""
    import numpy as np

    if isinstance(value, StatefulDetector):
        return value.get_state()
    if isinstance(value, Result):
        return value.to_dict()
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (Counter, dict)):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, deque)):
        return [to_jsonable(v) for v in value]
    raise TypeError(f"not JSON-safe state: {type(value).__name__}")


class StatefulDetector:
    """Mixin: declared, versioned, JSON-safe state (see the module docstring for the protocol)."""

    STATE: ClassVar[tuple[str, ...]] = ()
    STATE_VERSION: ClassVar[int] = 1

    def get_state(self) -> dict[str, Any]:
        return {"type": type(self).__name__, "version": self.STATE_VERSION,
                "state": {k: to_jsonable(self._encode_state(k, getattr(self, k))) for k in self.STATE}}

    def set_state(self, st: Mapping[str, Any]) -> None:
        if "version" not in st or int(st["version"]) < self.STATE_VERSION:
            raise ValueError(f"{type(self).__name__}: state version {st.get('version', 'none')}, expected "
                             f"{self.STATE_VERSION}; {OLD_STATE_ADVICE}")
        if int(st["version"]) > self.STATE_VERSION:
            raise ValueError(f"{type(self).__name__}: state version {st['version']} is newer than this code "
                             f"({self.STATE_VERSION}); upgrade the sidecar")
        values = st["state"]
        missing = [k for k in self.STATE if k not in values]
        if missing:
            raise ValueError(f"{type(self).__name__}: state lacks {missing}")
        for k in self.STATE:
            setattr(self, k, self._decode_state(k, values[k]))
        self._after_set_state()

    def acknowledge(self) -> None:
        """Clear a latched alarm and restart the statistic, so the detector can fire again."""
        self.reset()  # type: ignore[attr-defined]

    # --- hooks -------------------------------------------------------------------------------------
    def _encode_state(self, name: str, value: Any) -> Any:
        return value

    def _decode_state(self, name: str, value: Any) -> Any:
        return value

    def _after_set_state(self) -> None:
        pass


OLD_STATE_ADVICE = "older states are not upgraded: delete the state file (state_path) to start fresh"


@runtime_checkable
class Detector(Protocol):
    """The one detector contract (see the module docstring); ``StatefulDetector`` implements its state
    half, each detector its ``update`` (annotated ``-> Result``) and ``reset``.  ``alarm_`` is true
    while any alarm of the detector is latched (a detector that needs ``fit`` has it once fitted)."""

    STATE: ClassVar[tuple[str, ...]]
    STATE_VERSION: ClassVar[int]
    alarm_: bool

    def get_state(self) -> dict[str, Any]: ...

    def set_state(self, st: Mapping[str, Any]) -> None: ...

    def update(self, *args: Any, **kwargs: Any) -> Result: ...

    def reset(self) -> None: ...

    def acknowledge(self) -> None: ...


class ArmControlChart(StatefulDetector):
    """Base of the charts that keep counts per arm of one model and judge an arm against the control arm.

    ``arms`` maps an arm name to a dict of JSON counts made by ``_fresh_arm`` plus the alarm fields
    ``alarm`` (latched until ``reset``/``acknowledge`` unless ``restart_after_alarm``),
    ``alarm_index`` and ``alarms``.  A subclass supplies ``_fresh_arm``, ``pvalue(arm)`` and
    ``update(arm, ...) -> Result``; ``_judge`` applies ``alpha`` to the arm's p-value the same way for
    every such chart.  ``CONTROL`` is the arm the others are compared with (``control()``).
    State: ``arms``.
    """

    STATE: ClassVar[tuple[str, ...]] = ("arms",)
    CONTROL: ClassVar[str] = "baseline"
    CANDIDATE: ClassVar[str] = "candidate"

    def __init__(self, alpha: float, restart_after_alarm: bool = False):
        self.alpha, self.restart_after_alarm = alpha, restart_after_alarm
        self.arms: dict[str, dict[str, Any]] = {}

    def _fresh_arm(self) -> dict[str, Any]:
        raise NotImplementedError

    def _arm(self, arm: str) -> dict[str, Any]:
        st = self.arms.get(arm)
        if st is None:
            st = self.arms[arm] = {**self._fresh_arm(), "alarm": False, "alarm_index": None, "alarms": 0}
        return st

    def control(self) -> dict[str, Any]:
        """The control arm's counts ({} before its first sample)."""
        return self.arms.get(self.CONTROL) or {}

    def pvalue(self, arm: str) -> float:
        raise NotImplementedError

    @property
    def alarm_(self) -> bool:
        """Any arm in alarm."""
        return any(st["alarm"] for st in self.arms.values())

    def _judge(self, st: dict[str, Any], p: float, index: int) -> bool:
        """Alarm an arm whose p-value is below ``alpha``; True on the update that fired (``index``: its
        count of samples, recorded as ``alarm_index`` on the first alarm)."""
        new = p < self.alpha and not st["alarm"]
        if new:
            st["alarms"] += 1
            if st["alarm_index"] is None:
                st["alarm_index"] = index
            st["alarm"] = not self.restart_after_alarm
        return new

    def reset(self, arm: str | None = None) -> None:
        """Acknowledge one arm (or all): its counts restart, so a fault that persists alarms again."""
        for a in list(self.arms):
            if arm is None or a == arm:
                self._reset_arm(a)

    def _reset_arm(self, arm: str) -> None:
        del self.arms[arm]

    def _decode_state(self, name: str, value: Any) -> Any:
        return {a: dict(v) for a, v in value.items()} if name == "arms" else value

