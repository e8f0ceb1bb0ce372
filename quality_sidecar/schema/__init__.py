"""The versioned sample schema: the one contract between the producer (vllm_lookahead.telemetry)
and the consumer (the quality sidecar).

It lives in the sidecar package so that dependencies point one way (vllm_lookahead -> quality_sidecar,
never back) and the sidecar stays free of vLLM.  ``schemas/`` at the repository root links here.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

SCHEMA_VERSION = "1.6"  # 1.1: optional output.stop_reason, output.index, vllm_request_id; 1.2: sampling.min_tokens;
# 1.3: spec.draft_mask; 1.4: decoder.dtype; 1.5: decoder.seeded_exact; 1.6: sampling.allowed_token_ids(_count,
# _sha256), bad_words_token_ids, bad_words
SCHEMA_FILE = "sample.v1.schema.json"


@lru_cache(maxsize=1)
def sample_schema() -> dict[str, Any]:
    return json.loads(resources.files(__name__).joinpath(SCHEMA_FILE).read_text())


@lru_cache(maxsize=1)
def _validator():
    import jsonschema

    schema = sample_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


class SampleValidationError(ValueError):
    """A sample that does not match schema v1; ``reason`` names the first offending field."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def validation_errors(sample: Any) -> list[str]:
    """All schema violations as 'path: message' strings (empty when valid)."""
    errors = sorted(_validator().iter_errors(sample), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors]


def validate_sample(sample: Any) -> None:
    """Raise SampleValidationError if ``sample`` is not a valid v1 sample."""
    errs = validation_errors(sample)
    if errs:
        raise SampleValidationError(errs[0] if len(errs) == 1 else f"{errs[0]} (+{len(errs) - 1} more)")
