"""The alarm catalogue: what each alarm means and what the operator should do, as data.

Every alert event (``quality_sidecar.alert``) carries its entry's ``meaning`` and ``action``
(``Pipeline._emit``), and docs/sidecar.md's table "What each alarm means and what to do" is rendered
from this catalogue by ``scripts/gen_alarm_table.py``, so the texts are written once.  ``note`` is
docs-only detail: how the test works, which values a field takes.

An alarm name without an entry (the two-sample family's ``twosample_<metric>``: one per metric of the
Holm family) gets the ``twosample_<metric>`` entry.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AlarmText:
    meaning: str  # what changed (the alert event's ``meaning``)
    action: str  # the runbook: what to do (the alert event's ``action``)
    note: str = ""  # docs only: detail for the table in docs/sidecar.md


OTHER = "twosample_<metric>"  # the entry of every name not in the catalogue

_DECODER_OR_MIX = "compare prompts mix; if unchanged, suspect the decoder/model"

CATALOGUE: dict[str, AlarmText] = {
    "refusal": AlarmText(
        "refusal rate rose", "read the example traces; check the model/template version and the decoder",
        "this arm's rate vs its reference window"),
    "format_invalid": AlarmText(
        "more outputs break their format", "check structured-output settings and the decoder",
        "JSON, the requested schema, Python syntax"),
    "unsafe": AlarmText(
        "safety patterns fire more often", "inspect examples; escalate to the safety owner",
        "the safety tripwire"),
    "degenerate": AlarmText(
        "more empty or looping outputs", "suspect the speculative decoder: compare with decoding off",
        "typical of a broken speculative decoder"),
    "truncated": AlarmText(
        "more outputs cut short", "check max_tokens, aborts and the decoder's stop handling",
        "cut before their budget: abort, error, early `length`; check `max_model_len` too"),
    "length_up": AlarmText("outputs got longer", _DECODER_OR_MIX,
                           "output-length distribution moved; the prompts mix: prompt lengths, clients"),
    "length_down": AlarmText("outputs got shorter", _DECODER_OR_MIX,
                             "output-length distribution moved; the prompts mix: prompt lengths, clients"),
    "acceptance_down": AlarmText(
        "draft acceptance fell (speed, not correctness)", "check lookahead params and traffic mix",
        "outputs are still exact; lookahead params: W/N/G/k"),
    "exact_match": AlarmText(
        "greedy or seeded T>0 outputs differ from the baseline more often than the baseline arm's own "
        "(measured A/A mismatch rate, same pair source)",
        "lossless decoding is broken: roll the candidate back, replay the example prompts",
        "tested against the measured A/A rate (\"Exact match\" below)"),
    "sampling_conformance": AlarmText(
        "T>0 outputs are not distributed as the sampler specifies, judged by the "
        "baseline model's own likelihood (PIT)",
        "speculative sampling is not lossless: roll the candidate back; on the "
        "baseline arm it means the scorer and the serving engine differ (model, dtype)",
        "PIT and excess charts; the alarm names the chart and the direction"),
    "repeated_samples": AlarmText(
        "T>0 samples of one prompt repeat each other more often than on the baseline arm "
        "(every single sample can still look right)",
        "the decoder reuses one random stream across requests: roll the candidate back; "
        "compare the example requests' outputs"),
    "twosample_unscored": AlarmText(
        "T>0 outputs the conformance scorer cannot judge (aborted, ...) are more frequent in "
        "the candidate arm than in the baseline arm",
        "a decoder that aborts or errors hides from the T>0 checks: read the example requests",
        "cannot judge: aborted, penalties, structured output, no token ids; in the windowed Holm family; "
        "equal under any random traffic split"),
    "twosample_evidence_loss": AlarmText(
        "the baseline server gives up on more candidate T>0 samples than baseline ones "
        "(e.g. the server rejects their token ids)",
        "the decoder removes its own evidence: roll the candidate back, read the "
        "scorer's failure reasons (quality_sidecar_baseline_failed_samples)",
        "one-sided Fisher at each candidate give-up, 1 / `ert_each` per look: at most one false alarm "
        "per `ert_each` give-ups"),
    "impossible_tokens": AlarmText(
        "outputs hold tokens the request's sampler could not have drawn (outside its "
        "top-p / top-k / min-p cut or the vocabulary at T>0; at any T: an EOS or stop token inside min_tokens, "
        "a token outside allowed_token_ids, a completed bad word)",
        "the decoder ignores a sampling parameter: roll the candidate back; detail.reasons "
        "names the parameter; on the baseline arm the scorer and the serving engine differ",
        "`detail.reasons`: top_p, top_k, min_p, vocab, min_tokens, allowed_token_ids, bad_words; on the baseline "
        "arm: another model, dtype or tokenizer"),
    OTHER: AlarmText(
        "baseline and candidate distributions differ", "compare the arms on the example requests",
        "the arms' latest windows differ on that metric (length, finish_reason, a classifier's rate, "
        "text_mmd), Holm-adjusted; the metric's own row says more"),
}


def describe(detector: str) -> AlarmText:
    """The catalogue entry of an alarm name (``twosample_<metric>``'s for a name without one)."""
    return CATALOGUE.get(detector) or CATALOGUE[OTHER]
