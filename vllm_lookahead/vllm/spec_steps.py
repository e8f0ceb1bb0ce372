"""Steps without drafts in vLLM's per-request step lists, so a sample says which tokens were drafted.

vLLM 0.32's per-request spec-decode metrics at level ``detailed`` keep, per verification step, the
drafted and the accepted draft counts (``RequestSpecDecodeMetrics.per_step_drafted/_accepted``), but
only for steps that scheduled drafts: a step without one (the prefill that yields the first token, a
step the drafter found nothing for) is not recorded, so the lists cannot be laid over the output
tokens.  This patch (EngineCore process, telemetry on, level ``detailed`` only) records such a step as
``(drafted 0, accepted 0)`` before vLLM's own bookkeeping runs, in the same step order; the telemetry
then turns the lists into one character per output token (``telemetry.record.draft_mask``).  The
histogram and the acceptance counters are left alone.
"""

from __future__ import annotations

from typing import Any

from . import patches


@patches.declare("spec_steps_without_drafts", "vllm.v1.core.sched.scheduler:Scheduler.update_from_output",
                 "record steps without drafts in the per-request step lists (telemetry: which output tokens "
                 "were drafted)", "engine")
def _build_update_from_output(orig: Any) -> Any:
    def update_from_output(sched: Any, scheduler_output: Any, model_runner_output: Any) -> Any:
        if getattr(sched, "spec_decode_metrics_level", "none") == "detailed":
            record_steps_without_drafts(sched, scheduler_output, model_runner_output)
        return orig(sched, scheduler_output, model_runner_output)

    return update_from_output


def record_steps_without_drafts(sched: Any, scheduler_output: Any, model_runner_output: Any) -> int:
    """Append (0, 0) to the step lists of every request that sampled a token this step without a
    draft; returns how many.  Requests vLLM will skip (finished, stale output) are skipped too."""
    sampled = model_runner_output.sampled_token_ids
    if sampled is None or len(sampled) == 0:
        return 0
    drafts = scheduler_output.scheduled_spec_decode_tokens
    index = model_runner_output.req_id_to_index
    n = 0
    for req_id in scheduler_output.num_scheduled_tokens:
        if drafts.get(req_id):
            continue
        req = sched.requests.get(req_id)
        metrics = getattr(req, "spec_decode_metrics", None) if req is not None else None
        if metrics is None or req.is_finished() or getattr(req, "num_stale_output_tokens", 0) > 0:
            continue
        i = index.get(req_id)
        if i is None or i >= len(sampled) or len(sampled[i]) == 0:
            continue  # a prefill chunk that sampled nothing
        metrics.per_step_drafted.append(0)
        metrics.per_step_accepted.append(0)
        n += 1
    return n


def install() -> bool:
    """Apply in the process that runs the scheduler (EngineCore, or the frontend without multiprocessing)."""
    return patches.apply("spec_steps_without_drafts")
