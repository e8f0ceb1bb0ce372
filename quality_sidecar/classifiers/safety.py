"""Safety flags: a pluggable classifier with a regular-expression baseline.

Limits of the baseline (documented in docs/sidecar.md): English keywords only, no context (a security
tutorial that names "ransomware" is not flagged but one that says "here is a working keylogger" is),
trivially evaded by paraphrase or encoding, no notion of who asked.  It is a tripwire for gross
regressions (a decoder bug that suddenly emits private keys or e-mail dumps), not a moderation model.
Plug a real one in with ``SafetyClassifier(backends=[...])`` or the config key
``safety_backend: "package.module:ClassName"`` (the class must follow the Classifier protocol).
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from .base import Classifier, Verdict

PATTERNS: dict[str, re.Pattern[str]] = {
    "private_key": re.compile(r"-----BEGIN (?:RSA |EC |OPENSSH |DSA )?PRIVATE KEY-----"),
    "cloud_secret": re.compile(r"\b(?:AKIA[0-9A-Z]{16}|sk-[A-Za-z0-9]{32,}|ghp_[A-Za-z0-9]{36})\b"),
    "us_ssn": re.compile(r"\b(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}\b"),
    "weapon_synthesis": re.compile(
        r"\b(?:how to (?:make|build|synthesi[sz]e)|step[- ]by[- ]step|recipe for)\b.{0,60}"
        r"\b(?:pipe bomb|explosive|nerve agent|sarin|ricin|napalm|thermite bomb)\b", re.I | re.S),
    "malware": re.compile(r"\b(?:here is|below is|this is) (?:a |the )?(?:working|functional|complete) "
                          r"(?:keylogger|ransomware|botnet|credential stealer|rootkit)\b", re.I),
    "self_harm": re.compile(r"\b(?:you should|go ahead and) (?:kill|hurt|harm) yourself\b", re.I),
}
# Cheap literal triggers: a pattern's regex runs only if one of its triggers occurs (hot-path speed).
TRIGGERS: dict[str, tuple[str, ...]] = {
    "private_key": ("PRIVATE KEY",), "cloud_secret": ("AKIA", "sk-", "ghp_"), "us_ssn": ("-",),
    "weapon_synthesis": ("bomb", "explosive", "nerve agent", "sarin", "ricin", "napalm", "thermite"),
    "malware": ("keylogger", "ransomware", "botnet", "credential stealer", "rootkit"),
    "self_harm": ("yourself",),
}
_DIGIT_RUN = re.compile(r"\d[\d -]{11,}\d")
_CARD = re.compile(r"\b(?:\d[ -]?){13,19}\b")


def _luhn_ok(digits: str) -> bool:
    total, alt = 0, False
    for ch in reversed(digits):
        d = ord(ch) - 48
        if alt:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
        alt = not alt
    return total % 10 == 0


_TRIGGERS_LOWER = {k: tuple(t.lower() for t in v) for k, v in TRIGGERS.items()}


class PatternSafety:
    """The regex baseline: score 1.0 on any hit, category names in ``detail``."""

    name = "unsafe"

    def classify(self, text: str | None, *, prompt: str | None = None,
                 response_format: dict[str, Any] | None = None,
                 finish_reason: str | None = None) -> Verdict:
        if not text:
            return Verdict(self.name, False, 0.0, "")
        lower = text.lower()
        hits = [k for k, p in PATTERNS.items()
                if any(t in lower for t in _TRIGGERS_LOWER[k]) and p.search(text)]
        for m in (_CARD.finditer(text) if _DIGIT_RUN.search(text) else ()):
            digits = re.sub(r"\D", "", m.group())
            if 13 <= len(digits) <= 19 and _luhn_ok(digits):
                hits.append("payment_card")
                break
        return Verdict(self.name, bool(hits), 1.0 if hits else 0.0, ",".join(hits))


def load_backend(spec: str) -> Classifier:
    """Instantiate ``package.module:ClassName`` (no arguments) as a safety backend."""
    module, _, cls = spec.partition(":")
    if not cls:
        raise ValueError(f"safety backend {spec!r} must look like 'package.module:ClassName'")
    return getattr(importlib.import_module(module), cls)()


class SafetyClassifier:
    """Runs every backend; flagged if any backend flags, score = max score, details joined."""

    name = "unsafe"

    def __init__(self, backends: list[Classifier] | None = None):
        self.backends = backends or [PatternSafety()]

    def classify(self, text: str | None, *, prompt: str | None = None,
                 response_format: dict[str, Any] | None = None,
                 finish_reason: str | None = None) -> Verdict:
        verdicts = [b.classify(text, prompt=prompt, response_format=response_format,
                               finish_reason=finish_reason) for b in self.backends]
        flagged = any(v.flagged for v in verdicts)
        detail = ";".join(v.detail for v in verdicts if v.detail)
        return Verdict(self.name, flagged, max(v.score for v in verdicts), detail)
