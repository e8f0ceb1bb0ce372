"""Exact hard checks: output tokens that vLLM's sampler masks, at any temperature, in any dtype.

Why: the scorer cannot rebuild a distribution changed by ``allowed_token_ids`` or ``bad_words`` (such
samples are skipped), so a verifier that accepts a drafted token without applying these masks would go
unseen by the T>0 charts.  But both masks are hard rules: vLLM 0.32 sets the logit of every token
outside ``allowed_token_ids``, and of a bad word's last token wherever the output's tail matches the
rest of the word, to -inf before sampling, greedy or not, draft positions included
(``RejectionSampler.apply_logits_processors``).  An output that breaks one holds an impossible token,
counted without the baseline server and without statistics; so does an EOS or stop token inside
``min_tokens`` (``min_tokens_check``).  Each check returns (output positions checked, impossible tokens),
a reason it cannot run (``quality_sidecar_exact_check_skipped_samples``), or None when the request did
not set the option.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# The checks of this module, by the reason their impossible tokens are counted under.
EXACT_CHECKS = ("allowed_token_ids", "bad_words")
# Samples older than this cannot say whether the request set allowed_token_ids or bad_words (schema 1.6
# added them; before it only ``logits_modified`` told that *some* logit modifier was used).
RECORDED_SINCE = (1, 6)

CheckOutcome = tuple[int, int] | str | None


def _version(sample: Mapping[str, Any]) -> tuple[int, int]:
    major, _, minor = str(sample.get("schema_version") or "1.0").partition(".")
    try:
        return int(major), int(minor or 0)
    except ValueError:
        return 1, 0


def _recorded(sample: Mapping[str, Any], key: str, partial: str, reason: str) -> tuple[Any, list[int]] | str | None:
    """(the recorded ``sampling[key]``, the output's token ids) for a check; else the reason it is
    skipped -- ``reason`` when only ``sampling[partial]`` was recorded, "no_token_ids" when the output
    has tokens but not their ids -- or None when there is nothing to check."""
    s = sample.get("sampling") or {}
    value = s.get(key)
    if not value:
        return reason if s.get(partial) else None
    out = sample.get("output") or {}
    ids = out.get("token_ids")
    if ids is None:
        return "no_token_ids" if out.get("num_tokens") else None
    return (value, list(ids)) if ids else None


def allowed_token_ids_check(sample: Mapping[str, Any]) -> CheckOutcome:
    """Output tokens outside the request's ``allowed_token_ids`` (vLLM masks every other id).

    Skipped (a reason) when the set was too large to record (``too_many_ids``: schema 1.6 keeps only its
    count and sha256 above 4,096 ids) or the output has no token ids."""
    got = _recorded(sample, "allowed_token_ids", "allowed_token_ids_count", "too_many_ids")
    if not isinstance(got, tuple):
        return got
    ok, ids = set(got[0]), got[1]
    return len(ids), sum(t not in ok for t in ids)


def bad_word_hits(output: Sequence[int], bad_words_token_ids: Sequence[Sequence[int]]) -> int:
    """Output positions whose token vLLM 0.32 would have banned (``_apply_bad_words_single_batch``).

    At output position j, with the j output tokens before it as the past (the prompt is not part of
    it), a sequence w of length L is applied when L <= j + 1: its last token is banned when the past's
    last L - 1 tokens equal w[:-1] (a one-token w is banned everywhere).  So position j is a hit when
    the output's tokens j - L + 1 .. j equal w: exactly the occurrences of a whole w inside the output.
    A w's proper prefix, or a w that starts in the prompt, bans nothing and is never counted."""
    by_last: dict[int, list[list[int]]] = {}
    for w in bad_words_token_ids:
        if w:
            by_last.setdefault(int(w[-1]), []).append([int(t) for t in w[:-1]])
    out = [int(t) for t in output]
    hits = 0
    for j, tok in enumerate(out):
        for prefix in by_last.get(tok, ()):
            n = len(prefix)
            if n <= j and out[j - n:j] == prefix:
                hits += 1
                break
    return hits


def bad_words_check(sample: Mapping[str, Any]) -> CheckOutcome:
    """Output tokens that complete one of the request's bad words (``bad_word_hits`` on the token-id
    sequences vLLM built from them, as the producer recorded them).

    Skipped (a reason) when only the strings were recorded (``not_tokenized``: vLLM had no tokenizer;
    re-tokenizing here could differ from the serving tokenizer, so nothing is guessed) or the output has
    no token ids."""
    got = _recorded(sample, "bad_words_token_ids", "bad_words", "not_tokenized")
    if not isinstance(got, tuple):
        return got
    seqs, ids = got
    return len(ids), bad_word_hits(ids, seqs)


def exact_checks(sample: Mapping[str, Any]) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
    """({check: (positions checked, impossible tokens)}, {check: why it was skipped}) for the checks
    of this module that apply to the sample.  A sample older than schema 1.6 whose request used a logit
    modifier (``logits_modified``) may have set allowed ids or bad words unrecorded: both are skipped as
    ``not_recorded``."""
    done: dict[str, tuple[int, int]] = {}
    skipped: dict[str, str] = {}
    got_min = min_tokens_check(sample)
    if got_min is not None:
        done["min_tokens"] = got_min
    if _version(sample) < RECORDED_SINCE:
        if (sample.get("sampling") or {}).get("logits_modified"):
            skipped = dict.fromkeys(EXACT_CHECKS, "not_recorded")
        return done, skipped
    for name, check in (("allowed_token_ids", allowed_token_ids_check), ("bad_words", bad_words_check)):
        got = check(sample)
        if isinstance(got, str):
            skipped[name] = got
        elif got is not None:
            done[name] = got
    return done, skipped


def exposure(done: Mapping[str, tuple[int, int]]) -> tuple[int, dict[str, int]]:
    """(output positions checked, {check: impossible tokens}) of ``exact_checks``' results: a sample's
    positions count once as exposure, whatever the number of checks that ran on it."""
    return max(n for n, _bad in done.values()), {check: bad for check, (_n, bad) in done.items()}


def min_tokens_check(sample: Mapping[str, Any]) -> tuple[int, int] | None:
    """(output positions checked, impossible stops) of vLLM's ``min_tokens`` promise, or None.

    vLLM masks EOS and the request's stop token ids at the first ``min_tokens`` output positions, at any
    temperature and in any dtype, so an output that ends on one of them there (finish ``stop`` with no
    stop string, within ``min_tokens`` tokens; the stopping token is the last of ``token_ids``) holds a
    token its sampler could not have drawn -- an exact check, no statistics: a verifier that accepts a
    drafted EOS without the mask does exactly this.  Stop strings are matched only after ``min_tokens``
    tokens too, but on text, so they are left out."""
    m = int((sample.get("sampling") or {}).get("min_tokens") or 0)
    out = sample.get("output") or {}
    n = out.get("num_tokens")
    n = len(out.get("token_ids") or []) if n is None else n
    if m <= 0 or not n:
        return None
    stopped = out.get("finish_reason") == "stop" and not isinstance(out.get("stop_reason"), str)
    return min(n, m), int(stopped and n <= m)
