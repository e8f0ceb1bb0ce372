"""Decoder SPEC strings: how the CLIs (`gate --baseline/--candidate`, `bench --methods`) name a decoder.

One short string per decoder keeps the command line readable and the report self-describing::

    none                                       no speculation
    ngram:k=4[,n_min=2,n_max=4]                vLLM's prompt-lookup (n-gram) proposer
    ngram:k=4,kbs=1-8x4/9-32x2                 ... with vLLM's per-batch-size K
                                               (num_speculative_tokens_per_batch_size; vLLM 0.32's
                                               suffix proposer asserts a fixed K, so ngram only)
    suffix:k=4[,depth=24,spec_factor=1.0,min_prob=0.1,cache=10000]
                                               vLLM's suffix decoding (needs arctic-inference,
                                               extra "suffix"); drafts up to k tokens
    lookahead:k=4[,chain_min_p=,memory_tokens=,...]
                                               vllm_lookahead.LookaheadProposer (CONTRACTS.md); keys
                                               and ranges are the proposer's (core.LookaheadConfig)
    lookahead2d:W=5,N=3,G=5[,k=,max_batch=1,chain_k=4,policy=measure,context=0]
                                               vllm_lookahead.lade2d.Lade2DProposer: LADE's opt-in 2D
                                               layout (docs/lade2d.md; keys of its "lookahead2d"
                                               section); k defaults to (N-1)(W+G)-1, chain_k =
                                               chain_max_draft (drafts of chain requests), policy
                                               (measure | always), context = context_candidate
    custom:pkg.module.Class:k=4[,key=value...] any proposer class vLLM can load as custom_class;
                                               extra keys go to additional_config["custom_proposer"]

A spec maps to the ``speculative_config`` / ``additional_config`` arguments of ``vllm.LLM``; a bad
spec raises :class:`SpecError` with a message that says what is allowed.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_lookahead.core.config import K_LIMITS

LOOKAHEAD_CLASS = "vllm_lookahead.LookaheadProposer"
LADE2D_CLASS = "vllm_lookahead.lade2d.Lade2DProposer"
DEFAULT_DECODER = "lookahead:k=8"
"""The project's default decoder, the one its CLIs run and its README reports: ``num_speculative_tokens``
8 is the longest draft, the drafter decides each draft's length (docs/lookahead.md)."""
DEMO_MODEL = Path(__file__).resolve().parents[1] / "models" / "demo-code-4l"
"""The model the CLIs run when none is given: in a source checkout only (models/ is not in the wheel)."""
NGRAM_KEYS = ("n_min", "n_max", "kbs")
# suffix SPEC key -> vLLM SpeculativeConfig field (vLLM's defaults when a key is left out)
SUFFIX_KEYS = {"depth": "suffix_decoding_max_tree_depth", "spec_factor": "suffix_decoding_max_spec_factor",
               "min_prob": "suffix_decoding_min_token_prob", "cache": "suffix_decoding_max_cached_requests",
               "kbs": "num_speculative_tokens_per_batch_size"}
MAX_K = 16
MAX_K_2D = K_LIMITS[1]  # vLLM's MAX_SPEC_LEN: the 2D layout's rows are its drafts
# lookahead2d SPEC key -> key of its "lookahead2d" section (W/N/G: lade2d.config.ALIASES, resolved there)
LADE_KEYS = {"chain_k": "chain_max_draft", "context": "context_candidate"}
SPEC_HELP = (
    "decoder SPEC: none | ngram:k=4[,n_min=2,n_max=4] | suffix:k=4[,depth=24,spec_factor=1.0,min_prob=0.1]"
    " | lookahead:k=4[,chain_min_p=0.05,memory_tokens=65536] | lookahead2d:W=5,N=3,G=5[,max_batch=1]"
    " | custom:pkg.module.Class:k=4[,key=value,...]"
)


class SpecError(ValueError):
    """A decoder SPEC string that cannot be used; the message says why and what is allowed."""


@dataclass(frozen=True)
class DecoderSpec:
    """A parsed decoder: its kind, k, parameters and the vLLM engine arguments it needs."""

    text: str
    kind: str  # none | ngram | suffix | lookahead | lookahead2d | custom
    k: int = 0
    params: dict[str, Any] = field(default_factory=dict)
    class_path: str | None = None

    @property
    def speculative(self) -> bool:
        return self.kind != "none"

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM`` that select this decoder (empty for ``none``)."""
        if self.kind == "none":
            return {}
        if self.kind == "ngram":
            cfg = {"method": "ngram", "num_speculative_tokens": self.k,
                   "prompt_lookup_min": self.params["n_min"], "prompt_lookup_max": self.params["n_max"]}
            if "kbs" in self.params:
                cfg["num_speculative_tokens_per_batch_size"] = parse_kbs(self.params["kbs"], self.text)
            return {"speculative_config": cfg}
        if self.kind == "suffix":
            return {"speculative_config": {"method": "suffix", "num_speculative_tokens": self.k,
                                           **{SUFFIX_KEYS[k]: parse_kbs(v, self.text) if k == "kbs" else v
                                              for k, v in self.params.items()}}}
        if self.kind == "lookahead":
            return {"speculative_config": {"model": LOOKAHEAD_CLASS, "num_speculative_tokens": self.k},
                    "additional_config": {"lookahead": dict(self.params)}}
        if self.kind == "lookahead2d":
            return {"speculative_config": {"model": LADE2D_CLASS, "num_speculative_tokens": self.k},
                    "additional_config": {"lookahead2d": dict(self.params)}}
        assert self.class_path is not None
        return {"speculative_config": {"model": self.class_path, "num_speculative_tokens": self.k},
                "additional_config": {"custom_proposer": dict(self.params)}}

    def describe(self) -> dict[str, Any]:
        """JSON-friendly description for reports."""
        return {"spec": self.text, "kind": self.kind, "k": self.k, "params": dict(self.params),
                "class": self.class_path if self.kind == "custom" else
                {"lookahead": LOOKAHEAD_CLASS, "lookahead2d": LADE2D_CLASS}.get(self.kind)}


def _value(raw: str) -> Any:
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


def _kv(text: str, spec: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not text:
        return out
    for part in text.split(","):
        if "=" not in part:
            raise SpecError(f"{spec!r}: expected key=value, got {part!r}. {SPEC_HELP}")
        key, raw = (s.strip() for s in part.split("=", 1))
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) or raw == "":
            raise SpecError(f"{spec!r}: bad parameter {part!r}. {SPEC_HELP}")
        if key in out:
            raise SpecError(f"{spec!r}: parameter {key!r} given twice")
        out[key] = _value(raw)
    return out


def parse_kbs(value: Any, spec: str) -> list[tuple[int, int, int]]:
    """``kbs=1-8x4/9-32x2`` -> vLLM's ``num_speculative_tokens_per_batch_size`` [(1, 8, 4), (9, 32, 2)]:
    K per inclusive batch-size range (the first range must start at 1; K may be 0)."""
    out = []
    for part in str(value).split("/"):
        m = re.fullmatch(r"(\d+)-(\d+)x(\d+)", part.strip())
        if not m:
            raise SpecError(f"{spec!r}: kbs must look like 1-8x4/9-32x2 (batch range x K), got {value!r}")
        out.append((int(m[1]), int(m[2]), int(m[3])))
    if out[0][0] != 1 or any(a > b for a, b, _ in out) or any(b1 >= a2 for (_, b1, _), (a2, _, _) in zip(out, out[1:])):
        raise SpecError(f"{spec!r}: kbs ranges must start at 1, be ascending and not overlap, got {value!r}")
    return out


def _positive_int(spec: str, key: str, value: Any, upper: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (upper and value > upper):
        limit = f" and <= {upper}" if upper else ""
        raise SpecError(f"{spec!r}: {key} must be an integer >= 1{limit}, got {value!r}")
    return value


def _take_k(spec: str, params: dict[str, Any]) -> int:
    if "k" not in params:
        raise SpecError(f"{spec!r}: missing k (number of speculative tokens), e.g. k=4. {SPEC_HELP}")
    return _positive_int(spec, "k", params.pop("k"), MAX_K)


def parse_spec(spec: str, *, check_import: bool = True) -> DecoderSpec:
    """Parse a decoder SPEC string (see module docstring); raises :class:`SpecError`."""
    text = spec.strip()
    if not text:
        raise SpecError(f"empty decoder spec. {SPEC_HELP}")
    kind, _, rest = text.partition(":")
    kind = kind.lower()
    if kind == "none":
        if rest:
            raise SpecError(f"{spec!r}: 'none' takes no parameters")
        return DecoderSpec(text, "none")
    if kind == "ngram":
        params = _kv(rest, spec)
        k = _take_k(spec, params)
        unknown = set(params) - set(NGRAM_KEYS)
        if unknown:
            raise SpecError(f"{spec!r}: unknown ngram parameter(s) {sorted(unknown)}; allowed: k, {', '.join(NGRAM_KEYS)}")
        n_min = _positive_int(spec, "n_min", params.get("n_min", 2))
        n_max = _positive_int(spec, "n_max", params.get("n_max", max(4, n_min)))
        if n_min > n_max:
            raise SpecError(f"{spec!r}: n_min ({n_min}) > n_max ({n_max})")
        extra = {"kbs": params["kbs"]} if "kbs" in params else {}
        if extra:
            parse_kbs(params["kbs"], spec)
        return DecoderSpec(text, "ngram", k, {"n_min": n_min, "n_max": n_max, **extra})
    if kind == "suffix":
        params = _kv(rest, spec)
        k = _take_k(spec, params)
        unknown = set(params) - set(SUFFIX_KEYS)
        if unknown:
            raise SpecError(f"{spec!r}: unknown suffix parameter(s) {sorted(unknown)}; "
                            f"allowed: k, {', '.join(SUFFIX_KEYS)}")
        if "depth" in params:
            _positive_int(spec, "depth", params["depth"])
        if "kbs" in params:  # vLLM 0.32's SuffixDecodingProposer asserts a fixed K (measured: it crashes)
            raise SpecError(f"{spec!r}: vLLM 0.32's suffix proposer does not support a per-batch-size K "
                            "(kbs); it asserts num_speculative_tokens is fixed. Use it with ngram")
        if "cache" in params and params["cache"] != 0:  # 0 = no global tree (prompt trees only)
            _positive_int(spec, "cache", params["cache"])
        for key, hi in (("spec_factor", None), ("min_prob", 1.0)):
            v = params.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0
                                  or (hi is not None and v > hi)):
                raise SpecError(f"{spec!r}: {key} must be a number >= 0{f' and <= {hi}' if hi else ''}, got {v!r}")
        if check_import and importlib.util.find_spec("arctic_inference") is None:
            raise SpecError(f"{spec!r}: vLLM's suffix decoding needs arctic-inference "
                            "(pip install 'vllm-lookahead[suffix]')")
        return DecoderSpec(text, "suffix", k, params)
    if kind == "lookahead":
        params = _kv(rest, spec)
        k = _take_k(spec, params)
        from vllm_lookahead.core.config import LookaheadConfig, LookaheadConfigError

        try:  # the proposer's own validation: one source of truth for keys and ranges
            LookaheadConfig.from_dict(params)
        except (LookaheadConfigError, TypeError) as e:
            raise SpecError(f"{spec!r}: {e}") from None
        return DecoderSpec(text, "lookahead", k, params)
    if kind == "lookahead2d":
        params = _kv(rest, spec)
        section = {"chain_max_draft": 4,  # requests on the chain draft chain-sized drafts
                   **{LADE_KEYS.get(k, k): v for k, v in params.items() if k != "k"}}
        from vllm_lookahead.core.config import LookaheadConfigError
        from vllm_lookahead.lade2d.config import Lade2DConfig

        try:
            rows = Lade2DConfig.from_dict(section).rows
        except (LookaheadConfigError, TypeError) as e:
            raise SpecError(f"{spec!r}: {e}") from None
        k = _positive_int(spec, "k", params.get("k", rows - 1), MAX_K_2D)
        if k < rows - 1:
            raise SpecError(f"{spec!r}: k={k} is below the (N-1)(W+G)-1 = {rows - 1} rows of the layout")
        return DecoderSpec(text, "lookahead2d", k, section)
    if kind == "custom":
        class_path, sep, kvs = rest.partition(":")
        if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+", class_path or ""):
            raise SpecError(f"{spec!r}: custom needs a dotted class path, e.g. custom:pkg.module.Class:k=4")
        params = _kv(kvs, spec)
        k = _take_k(spec, params)
        if check_import:
            check_class(class_path, spec)
        return DecoderSpec(text, "custom", k, params, class_path)
    raise SpecError(f"{spec!r}: unknown decoder kind {kind!r}. {SPEC_HELP}")


def lookahead_overrides(k: int, settings: list[str]) -> dict[str, Any]:
    """LookaheadConfig overrides from ``KEY=VALUE`` strings (the scripts' ``--set``), parsed and checked
    as the lookahead SPEC's parameters are: one KEY=VALUE coercion, LookaheadConfig's keys and ranges."""
    return parse_spec("lookahead:" + ",".join([f"k={k}", *settings])).params


def check_class(class_path: str, spec: str) -> None:
    """Import ``pkg.module.Class`` now so that a typo fails before any engine starts."""
    module_path, name = class_path.rsplit(".", 1)
    try:
        module = importlib.import_module(module_path)
    except ImportError as e:
        raise SpecError(f"{spec!r}: cannot import {module_path!r}: {e}") from None
    if not isinstance(getattr(module, name, None), type):
        raise SpecError(f"{spec!r}: {module_path!r} has no class {name!r}")
