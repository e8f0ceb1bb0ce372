"""Gate policy: which criteria, which tolerances (YAML; the bundled default documents every key).

Validation is strict (unknown keys, wrong types and attempts to switch off a quality criterion are
errors with the key path in the message) because a typo in a release gate must not silently loosen it.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from vllm_lookahead.gate.profiles import parse_profiles, seeded

DEFAULT_POLICY = Path(__file__).with_name("default_policy.yaml")
MANDATORY = ("pass_rate_overall", "pass_rate_per_task", "exact_match", "behaviour")
MARGIN = (int, float, type(None))
SCHEMA: dict[str, dict[str, type | tuple[type, ...]]] = {
    "pass_rate_overall": {"max_drop": (int, float), "required": bool, "ni_margin": MARGIN},
    "pass_rate_per_task": {"max_drop": (int, float), "required": bool, "ni_margin": MARGIN},
    "exact_match": {"max_excess_mismatch": (int, float), "required": bool},
    "behaviour": {"max_increase": (int, float), "classifiers": list, "required": bool, "ni_margin": MARGIN},
    "sampled": {"required": bool, "samples_per_item": int, "profiles": list, "alpha": (int, float),
                "impossible_floor_per_token": MARGIN},
    "seeded_exact": {"required": (bool, str), "max_excess_mismatch": (int, float)},
    "latency": {"required": bool, "min_speedup": (int, float)},
    "acceptance_length": {"required": bool, "min_mean_length": (int, float)},
}
TOP = {"version", "alpha", "multiple_testing", "bootstrap", "criteria", "runs", "sequential"}
# keys that were replaced: the error names the replacement instead of "unknown key"
REMOVED = {("sampled", "temperature"): "criteria.sampled.profiles (a list of sampling profiles, e.g. "
                                       "[{temperature: 0.8}, {temperature: 1.0, top_p: 0.9, top_k: 50}])"}


class PolicyError(ValueError):
    """The policy file cannot be used; the message names the offending key."""


def _check_type(path: str, value: Any, typ: type | tuple[type, ...]) -> None:
    if isinstance(value, bool) and typ in ((int, float), int, MARGIN):
        raise PolicyError(f"policy: {path} must be a number, got {value!r}")
    if not isinstance(value, typ):
        raise PolicyError(f"policy: {path} has the wrong type ({type(value).__name__}): {value!r}")


def validate(policy: Any) -> dict[str, Any]:
    """Check a parsed policy and fill defaults from the bundled one; returns a normalised copy."""
    if not isinstance(policy, dict):
        raise PolicyError("policy: the top level must be a mapping")
    unknown = set(policy) - TOP
    if unknown:
        raise PolicyError(f"policy: unknown top-level key(s) {sorted(unknown)}; allowed: {sorted(TOP)}")
    base = yaml.safe_load(DEFAULT_POLICY.read_text())
    out = copy.deepcopy(base)
    for key in ("version", "alpha", "multiple_testing"):
        if key in policy:
            out[key] = policy[key]
    if out["version"] != 1:
        raise PolicyError(f"policy: version {out['version']!r} unsupported (this gate reads version 1)")
    _check_type("alpha", out["alpha"], (int, float))
    if not 0 < out["alpha"] < 1:
        raise PolicyError(f"policy: alpha must be in (0, 1), got {out['alpha']}")
    if out["multiple_testing"] not in ("holm", "bh", "bonferroni"):
        raise PolicyError(f"policy: multiple_testing must be holm, bh or bonferroni, got {out['multiple_testing']!r}")
    for section in ("bootstrap", "runs", "sequential"):
        given = policy.get(section) or {}
        if not isinstance(given, dict):
            raise PolicyError(f"policy: {section} must be a mapping")
        bad = set(given) - set(base[section])
        if bad:
            raise PolicyError(f"policy: unknown key(s) {section}.{sorted(bad)}; allowed: {sorted(base[section])}")
        out[section].update(given)
    crit = policy.get("criteria") or {}
    if not isinstance(crit, dict):
        raise PolicyError("policy: criteria must be a mapping")
    for name, given in crit.items():
        if name not in SCHEMA:
            raise PolicyError(f"policy: unknown criterion {name!r}; known: {sorted(SCHEMA)}")
        if given is None or given is False:
            if name in MANDATORY:
                raise PolicyError(f"policy: criterion {name!r} is mandatory (quality criteria cannot be switched off)")
            given = {"required": False}
        if not isinstance(given, dict):
            raise PolicyError(f"policy: criteria.{name} must be a mapping")
        for key, value in given.items():
            if (name, key) in REMOVED:
                raise PolicyError(f"policy: criteria.{name}.{key} was replaced by {REMOVED[(name, key)]}")
            if key not in SCHEMA[name]:
                raise PolicyError(f"policy: unknown key criteria.{name}.{key}; allowed: {sorted(SCHEMA[name])}")
            _check_type(f"criteria.{name}.{key}", value, SCHEMA[name][key])
        if name in MANDATORY and given.get("required") is False:
            raise PolicyError(f"policy: criterion {name!r} is mandatory (quality criteria cannot be switched off)")
        out["criteria"][name].update(given)
    c = out["criteria"]
    for name, key in (("pass_rate_overall", "max_drop"), ("pass_rate_per_task", "max_drop"),
                      ("exact_match", "max_excess_mismatch"), ("behaviour", "max_increase"),
                      ("seeded_exact", "max_excess_mismatch")):
        if not 0 <= c[name][key] <= 1:
            raise PolicyError(f"policy: criteria.{name}.{key} must be in [0, 1], got {c[name][key]}")
    for name in ("pass_rate_overall", "pass_rate_per_task", "behaviour"):
        m = c[name].get("ni_margin")
        if m is not None and not 0 < m < 1:
            raise PolicyError(f"policy: criteria.{name}.ni_margin must be in (0, 1) or null, got {m}")
    if c["acceptance_length"]["min_mean_length"] < 1:
        raise PolicyError("policy: criteria.acceptance_length.min_mean_length must be >= 1 (tokens per verify step)")
    if c["sampled"]["samples_per_item"] < 0:
        raise PolicyError("policy: criteria.sampled needs samples_per_item >= 0")
    try:
        parse_profiles(c["sampled"]["profiles"])
    except ValueError as e:
        raise PolicyError(f"policy: {e}") from None
    if c["sampled"]["samples_per_item"] == 0 and c["sampled"]["required"]:
        # a required check that never runs would pass by omission: say so instead of downgrading it
        raise PolicyError("policy: criteria.sampled.samples_per_item is 0 but criteria.sampled.required is true; "
                          "the T>0 check cannot run without samples: set samples_per_item >= 1, or "
                          "required: false to ship without checking T>0 outputs")
    se = c["seeded_exact"]["required"]
    if se not in (True, False, "auto"):
        raise PolicyError(f"policy: criteria.seeded_exact.required must be true, false or auto, got {se!r}")
    if se is True and (c["sampled"]["samples_per_item"] == 0
                       or not seeded(parse_profiles(c["sampled"]["profiles"]))):
        raise PolicyError("policy: criteria.seeded_exact.required is true but no T>0 sample has its own seed; "
                          "it needs samples_per_item >= 1 and a sampled profile with seed: per_request "
                          "(or required: auto)")
    sq = out["sequential"]
    if isinstance(sq["looks"], bool) or not isinstance(sq["looks"], int) or not 1 <= sq["looks"] <= 10:
        raise PolicyError(f"policy: sequential.looks must be an integer in 1..10, got {sq['looks']!r}")
    if sq["spending"] != "obrien_fleming":
        raise PolicyError(f"policy: sequential.spending must be obrien_fleming, got {sq['spending']!r}")
    for key in ("aa_batch_size", "latency_items"):
        v = out["runs"][key]
        if isinstance(v, bool) or not isinstance(v, int) or v < (1 if key == "aa_batch_size" else 0):
            raise PolicyError(f"policy: runs.{key} must be an integer >= {1 if key == 'aa_batch_size' else 0}, got {v!r}")
    return out


def load_policy(path: str | Path | None = None) -> dict[str, Any]:
    """Read a policy YAML (the bundled default when ``path`` is None) and validate it."""
    p = Path(path) if path else DEFAULT_POLICY
    if not p.is_file():
        raise PolicyError(f"policy file {p} does not exist")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise PolicyError(f"policy file {p} is not valid YAML: {e}") from None
    return validate(raw or {})
