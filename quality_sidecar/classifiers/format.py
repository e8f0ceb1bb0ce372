"""Format validity: JSON (and JSON Schema when the request asked for one) and Python syntax.

Outputs of a code model are usually *truncated* code (max_tokens cuts a function in half), so the
Python check judges "is there a syntax error before the truncation point": it compiles
prompt + output with ``codeop.compile_command(..., symbol="exec")``, which (Python >= 3.11) returns
``None`` for input that is merely incomplete and raises only for real errors.  For a truncated sample
the last (partial) line is dropped first, because a cut in the middle of a token ("retu") is not the
model's fault.  When unsure (no prompt, output starts mid-block) the classifier does not flag.
"""

from __future__ import annotations

import ast
import codeop
import json
import re
import warnings
import zlib
from functools import lru_cache
from typing import Any

from .base import Verdict
from .degeneration import TRUNCATED_REASONS

_PY_HINT = re.compile(r"^\s*(def |class |import |from \w+ import |return\b|if .*:$|for .*:$|while .*:$|@\w)",
                      re.MULTILINE)
_DONT_INHERIT = 0
_FENCE = re.compile(r"```(?:python|py)\s*\n(.*?)(?:```|\Z)", re.DOTALL)


def _schema_of(response_format: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON Schema inside an OpenAI-style response_format, or the dict itself if it is one."""
    if response_format.get("type") == "json_schema":
        js = response_format.get("json_schema") or {}
        return js.get("schema", js) if isinstance(js, dict) else None
    if response_format.get("type") == "json_object":
        return None
    if "properties" in response_format or "$schema" in response_format or "type" in response_format:
        return response_format
    return None


@lru_cache(maxsize=256)
def _compiled_validator(schema_json: str):
    import jsonschema

    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema)


def check_json(text: str, response_format: dict[str, Any] | None) -> tuple[bool, str]:
    """(ok, reason): parses ``text`` as JSON and validates it against the requested schema."""
    body = text.strip()
    if body.startswith("```"):
        body = body.strip("`").removeprefix("json").strip()
    try:
        value = json.loads(body)
    except json.JSONDecodeError as e:
        return False, f"invalid JSON at char {e.pos}: {e.msg}"
    except RecursionError:  # e.g. "[" x 5000 + "]" x 5000: what a looping decoder emits
        return False, "JSON nested deeper than the parser's recursion limit (degenerate output)"
    schema = _schema_of(response_format) if response_format else None
    if schema:
        try:
            err = next(iter(_compiled_validator(json.dumps(schema, sort_keys=True)).iter_errors(value)), None)
        except RecursionError:
            return False, "JSON nested too deeply to validate against the schema (degenerate output)"
        except Exception as e:  # noqa: BLE001 (a broken client schema is not the model's fault)
            return True, f"response_format schema unusable: {e}"
        if err is not None:
            path = "/".join(map(str, err.absolute_path)) or "<root>"
            return False, f"JSON Schema violation at {path}: {err.message}"
    return True, "valid JSON"


def _compile_incomplete_ok(source: str) -> tuple[bool, str]:
    try:  # fast path: a parse-only compile (no bytecode) of complete, valid code
        compile(source, "<output>", "exec", ast.PyCF_ONLY_AST | _DONT_INHERIT)
        return True, ""
    except (RecursionError, MemoryError):  # nesting beyond the compiler's limits: degenerate code
        return False, "code nested deeper than the compiler's limit"
    except (SyntaxError, ValueError, OverflowError):
        pass
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            codeop.compile_command(source, "<output>", "exec")
            return True, ""
        except (RecursionError, MemoryError):
            return False, "code nested deeper than the compiler's limit"
        except (SyntaxError, ValueError, OverflowError) as e:
            line = getattr(e, "lineno", None)
            return False, f"{type(e).__name__} line {line}: {getattr(e, 'msg', e)}"


def check_python(text: str, prompt: str | None, truncated: bool) -> tuple[bool | None, str]:
    """(ok, reason) for Python code; ``ok=None`` means "cannot judge" (never flagged)."""
    fenced = _FENCE.search(text)
    if fenced:
        source, prefix = fenced.group(1), ""
        truncated = truncated or not text.rstrip().endswith("```")
    else:
        prefix = prompt if prompt and _PY_HINT.search(prompt) else ""
        source = text
    full = prefix + source
    if truncated:
        cut = full.rfind("\n")
        full = full[:cut + 1] if cut >= 0 else ""
        if len(prefix) > len(full):
            return None, "truncated inside the prompt"
    ok, why = _compile_incomplete_ok(full)
    if ok:
        return True, "python syntax ok" + (" up to the truncation point" if truncated else "")
    if not prefix and source[:1] in (" ", "\t"):
        # The output continues a block we cannot see: judge it inside a dummy block.
        ok2, _ = _compile_incomplete_ok("if True:\n" + full)
        if ok2:
            return True, "python syntax ok (as a continuation)"
        return None, "continuation without prompt: " + why
    return False, why


def looks_like_python(text: str, prompt: str | None) -> bool:
    if _FENCE.search(text):
        return True
    hits = len(_PY_HINT.findall(text)) + (2 if prompt and _PY_HINT.search(prompt) else 0)
    return hits >= 2


class FormatClassifier:
    """Flags outputs that break the format the request asked for (or obviously intended)."""

    name = "format_invalid"

    def __init__(self, code_fraction: float = 1.0):
        """``code_fraction`` < 1 syntax-checks only that share of code outputs (chosen by a hash of
        the text, so deterministic): parsing costs ~0.2 ms per output, the largest single cost of the
        sidecar's hot path.  Unchecked outputs are reported "not judged" and never flagged."""
        self.code_fraction = code_fraction

    def classify(self, text: str | None, *, prompt: str | None = None,
                 response_format: dict[str, Any] | None = None,
                 finish_reason: str | None = None) -> Verdict:
        if text is None:
            return Verdict(self.name, False, 0.0, "no output text in sample")
        truncated = finish_reason in TRUNCATED_REASONS
        stripped = text.lstrip()
        if response_format and response_format.get("type") != "text":
            ok, why = check_json(text, response_format)
            return Verdict(self.name, not ok, 0.0 if ok else 1.0, why)
        if stripped[:1] in ("{", "[") and not truncated:
            ok, why = check_json(text, None)
            if ok:
                return Verdict(self.name, False, 0.0, why)
        if looks_like_python(text, prompt):
            if self.code_fraction < 1.0 and (zlib.crc32(text.encode()) % 10_000) >= self.code_fraction * 10_000:
                return Verdict(self.name, False, 0.0, "not judged: outside code_fraction")
            ok_py, why = check_python(text, prompt, truncated)
            if ok_py is None:
                return Verdict(self.name, False, 0.0, "not judged: " + why)
            return Verdict(self.name, not ok_py, 0.0 if ok_py else 1.0, why)
        return Verdict(self.name, False, 0.0, "no format to check")
