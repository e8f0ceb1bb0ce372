"""Shared result type, the detector state protocol and the false-alarm budget arithmetic.

**State protocol (``StatefulDetector``).** Why: a restart must neither forget an alarm nor its
evidence (a CUSUM sum, a two-sample window, an A/A count), and an acknowledged alarm must stay
acknowledged. So every detector and monitor declares the attributes that make up its state, and
the service persists them all in one state file. A detector:

* sets ``STATE = ("attr", ...)``: the attribute names that, together with the constructor
  arguments (the config), restore the object exactly;
* may set ``STATE_VERSION``: bump it when the meaning of ``STATE`` changes. ``set_state`` refuses a
  newer version and calls ``_upgrade_state`` on an older one;
* may override ``_encode_state(name, value)`` / ``_decode_state(name, value)`` for values that
  plain JSON cannot carry: tuples come back as lists, int dict keys as strings, deques as lists,
  nested detectors as their own state dicts;
* may override ``_after_set_state()`` to rebuild derived values (thresholds, increments) from the
  restored ones.

``get_state()`` returns ``{"type": class name, "version": STATE_VERSION, "state": {...}}``, which is
JSON-safe (``json.dumps`` works on it). ``set_state(get_state())`` on a fresh instance built with the
same config gives back the same statistics and alarm status. Nested detectors are encoded by
default, since a ``StatefulDetector`` value is stored as its ``get_state()``. Decoding needs the
parent to build the child (``_decode_state``), because only the parent knows its constructor
arguments.

The alarm life cycle the service builds on: ``alarm_`` (or an equivalent flag) latches until
``acknowledge()``. That method resets the statistic so that the detector can fire again, and it is
part of the protocol (default: ``reset()``).

Every alarm threshold in the sidecar is derived from an *expected run time* (ERT, a.k.a. ARL0): the
mean number of samples between false alarms on a stream without drift.  A budget of "at most one false
alarm per 100k samples per (model, arm)" split over d detectors gives each detector
ERT_d = d * ERT_total (union bound: the alarm rates add up), see ``split_budget``.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar


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
        if "state" not in st or "version" not in st:
            st = self._upgrade_state(dict(st), 0)
        elif int(st["version"]) < self.STATE_VERSION:
            st = self._upgrade_state(dict(st), int(st["version"]))
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

    def _upgrade_state(self, st: dict[str, Any], version: int) -> dict[str, Any]:
        raise ValueError(f"{type(self).__name__}: cannot read state version {version}")


def split_budget(ert_total: float, n_detectors: int) -> float:
    """ERT each of ``n_detectors`` must have for the union to keep ``ert_total`` (Bonferroni)."""
    if ert_total <= 0 or n_detectors <= 0:
        raise ValueError("ert_total and n_detectors must be positive")
    return ert_total * n_detectors
