"""Exact match: ``PairTable`` pairs greedy outputs of the two arms (and with ``--baseline-url`` greedy
and seeded T>0 replays) and feeds them to ``PairedExactMatch``, which tests the candidate's mismatch rate against
the baseline arm's measured A/A rate.  Its budget slot is one of monitor.py's ``N_DETECTORS``.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Any

from .detectors import PairedExactMatch, Result, StatefulDetector
from .features import Features
from .monitor import Alarm, MonitorConfig


class PairTable(StatefulDetector):
    """Greedy outputs waiting for their counterpart in the other arm (bounded LRU by pair key).

    Feeds ``PairedExactMatch`` with both kinds of pairs and their measured A/A references: the same
    prompt served twice by the baseline arm is an A/A ``arm`` pair, a baseline-arm sample replayed
    against ``--baseline-url`` an A/A ``replay`` pair.  There is no configured A/A rate: without
    ``cfg.exact_match_block`` A/A pairs of a source, that source gives no verdict.
    ``rebaseline()`` forgets them.

    State: the detector (A/A and candidate counts), the mismatch examples and the newest
    ``cfg.pair_state_entries`` outputs still waiting for a counterpart.  The full table, up to
    ``pair_cache`` token-id lists, would make the state file megabytes per checkpoint.  An older
    waiting output lost in a restart costs one pair, not a statistic.
    """

    STATE = ("table", "mismatch_examples", "detector", "last")
    STATE_VERSION = 2

    def __init__(self, model: str, cfg: MonitorConfig):
        self.model, self.cfg = model, cfg
        self.table: OrderedDict[str, tuple[str, list[int] | None, str | None, str]] = OrderedDict()
        self.detector = PairedExactMatch(cfg.ert_each, cfg.exact_match_block)
        self.mismatch_examples: deque = deque(maxlen=5)
        self.last: Result | None = None

    def add(self, feats: Iterable[Features]) -> list[Alarm]:
        pairs, trace = [], []
        for f in feats:
            if not f.greedy or f.token_ids is None or f.arm not in ("baseline", "candidate"):
                continue
            other = self.table.pop(f.pair_key, None)
            if other is None or other[0] == f.arm:
                if other is not None and f.arm == "baseline":  # A/A pair: tracks batch non-invariance
                    self.detector.add_aa([other[1] != f.token_ids], "arm")
                self.table[f.pair_key] = (f.arm, f.token_ids, f.trace_id, f.request_id)
                if len(self.table) > self.cfg.pair_cache:
                    self.table.popitem(last=False)
                continue
            cand, base = (f.token_ids, other[1]) if f.arm == "candidate" else (other[1], f.token_ids)
            pairs.append((cand, base))
            trace.append((f.trace_id, f.request_id) if f.arm == "candidate" else (other[2], other[3]))
        return self._score(pairs, trace, "arm")

    def add_replay(self, arm: str, output: list[int] | str | None, replayed: list[int] | str | None,
                   trace_id: str | None, request_id: str, source: str = "replay") -> list[Alarm]:
        """A sample and the ``--baseline-url`` server's answer to its prompt (``source`` "replay": greedy,
        "seeded": seeded T>0): a test pair for the candidate arm, an A/A pair (the measured reference)
        for the baseline arm."""
        if arm == "baseline":
            self.detector.add_aa([output != replayed], source)
            return []
        return self._score([(output, replayed)], [(trace_id, request_id)], source)

    def _score(self, pairs: list, trace: list, source: str) -> list[Alarm]:
        if not pairs:
            return []
        for (c, b), t in zip(pairs, trace):
            if c != b:
                self.mismatch_examples.append(t)
        r = self.detector.update(pairs, source)
        self.last = r
        if r.alarm_new:
            return [Alarm.with_examples("exact_match", self.model, "candidate", r, self.mismatch_examples)]
        return []

    def active_alarms(self) -> list[dict[str, Any]]:
        d = self.detector
        if not d.alarm_:
            return []
        st = d.sources_[d.alarm_source_]
        return [{"detector": "exact_match", "model": self.model, "arm": "candidate", "source": d.alarm_source_,
                 "statistic": self.last.statistic if self.last else math.nan,
                 "threshold": self.last.threshold if self.last else math.nan, "pvalue": st["pvalue"],
                 "samples_since_fit": st["pairs"], "mismatches": st["mismatches"], "aa_pairs": st["aa_pairs"],
                 "aa_mismatches": st["aa_mismatches"]}]

    def acknowledge(self, detector: str | None = None) -> list[str]:
        if detector not in (None, "exact_match") or not self.detector.alarm_:
            return []
        self.detector.acknowledge()
        if self.last is not None:
            self.last.alarm = False
        return ["exact_match"]

    def rebaseline(self) -> None:
        """Forget the A/A pairs, the candidate pairs and the waiting table: no verdict until new pairs."""
        self.detector.fit()
        self.table.clear()
        self.mismatch_examples.clear()
        self.last = None

    def _encode_state(self, name: str, value: Any) -> Any:
        if name == "table":
            keep = list(value.items())[-self.cfg.pair_state_entries:] if self.cfg.pair_state_entries > 0 else []
            return [[k, *v] for k, v in keep]
        return value

    def _decode_state(self, name: str, value: Any) -> Any:
        if name == "table":
            return OrderedDict((k, (arm, ids, tr, rq)) for k, arm, ids, tr, rq in value)
        if name == "mismatch_examples":
            return deque((tuple(x) for x in value), maxlen=5)
        if name == "detector":
            self.detector.set_state(value)
            return self.detector
        if name == "last":
            return None if value is None else Result.from_dict(value)
        return value
