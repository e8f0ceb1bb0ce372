"""Drive vLLM for the gate: one engine per decoder, in-process, greedy and seeded-sampled runs.

Why in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``distributed_executor_backend="uni"``): the
engine starts faster, and fault-injection proposers can patch the worker because it is this process.
Why one engine at a time: two CPU engines double memory and fight for two cores; each run creates,
uses and shuts down its engine before the next one starts.

Records per request: output ids and text, finish reason, TTFT and time per output token (from
``RequestOutput.metrics``), and speculative-decoding counters (``per_request_spec_decode_metrics=
"detailed"``: drafted/accepted tokens and per-step counts, hence steps, compression and acceptance
per draft position).
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from vllm_lookahead.decoders import DecoderSpec
from vllm_lookahead.gate.evalset import EvalItem
from vllm_lookahead.gate.profiles import SamplingProfile, seeded


@dataclass
class RequestRecord:
    """One finished request (one item, one sample)."""

    @property
    def draft_positions(self) -> Any:
        """Per output token its draft position (0: a step without a draft; see
        ``telemetry.record.draft_mask``), or None where the step lists do not cover the output."""
        from vllm_lookahead.telemetry.record import draft_mask

        mask = draft_mask(self, len(self.token_ids))
        if mask is None:
            return None
        from quality_sidecar.baseline_scoring import mask_positions

        return mask_positions(mask)

    item_id: str
    sample: int
    token_ids: list[int]
    text: str
    finish_reason: str | None
    num_prompt_tokens: int
    ttft_s: float | None = None
    tpot_s: float | None = None
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    per_step_drafted: list[int] = field(default_factory=list)  # steps without a draft included (spec_steps)
    per_step_accepted: list[int] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=list)  # T>0 scoring re-feeds prompt + output
    latency_s: float | None = None  # HTTP engine: request wall time (no TTFT without streaming)


@dataclass
class RunResult:
    """All requests of one pass over the eval set with one decoder and one submission mode."""

    name: str
    decoder: dict[str, Any]
    mode: str  # "batch" (all prompts at once) or "sequential" (one at a time)
    # [] for greedy runs; else the sampling profiles (``gate.profiles``): sample j used profiles[j % len]
    sampling: list[dict[str, Any]]
    seed: int
    wall_s: float
    records: list[RequestRecord]
    engine_counters: dict[str, Any] = field(default_factory=dict)
    # T>0 runs: one dict per record (same order) from gate.inprocess_scoring.score_runs: the sample's mean
    # raw token log-prob under the baseline model, its PIT values and out-of-support count
    scores: list[dict[str, Any]] | None = None
    scoring_s: float | None = None
    scoring_check: float | None = None  # max |full row at the token - vLLM's own prompt log-prob|
    # T>0 speculative steps with drafts during this run, by verifier (``coupled_verify.STEPS`` delta:
    # "coupled", "rejection_sampler"); in-process only -- None where it cannot be measured (HTTP)
    verifier_steps: dict[str, int] | None = None

    def by_item(self, sample: int = 0) -> dict[str, RequestRecord]:
        return {r.item_id: r for r in self.records if r.sample == sample}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class RunCrashed(RuntimeError):
    """A run's engine (in-process) or endpoint died under its requests.

    Why a type of its own: the gate must tell a broken *candidate* (a verdict: FAIL) from a broken
    baseline or gate (no verdict), and a crash is only actionable with where it happened: the run,
    the sampling profile and the requests in flight (in-process, every request of the ``generate``
    call that died: vLLM steps a batch as one, so one request cannot be singled out; over HTTP, the
    one request that failed)."""

    def __init__(self, run: str, error: BaseException, requests: list[tuple[str, int, int]],
                 profile: SamplingProfile | None):
        cause = error.__cause__ or error.__context__
        text = f"{type(error).__name__}: {error}"
        if cause is not None and str(cause) not in text:  # EngineDeadError says only "see the stack trace"
            text += f" (caused by {type(cause).__name__}: {cause})"
        self.run, self.error, self.profile = run, text[:2000], profile
        self.requests = [{"item_id": i, "item_index": k, "sample": s} for i, k, s in requests]
        super().__init__(f"{run} died {self.where()}: {self.error}")

    def where(self) -> str:
        """Human words for the profile and the requests, e.g. ``at T=1 top_k=50 on 1 request (item x, sample 1)``."""
        reqs = self.requests
        shown = ", ".join(f"{r['item_id']} sample {r['sample']}" for r in reqs[:3]) + (", ..." if len(reqs) > 3 else "")
        return (f"at {self.profile.label if self.profile else 'T=0 (greedy)'} on {len(reqs)} request"
                f"{'s' if len(reqs) != 1 else ''} in flight ({shown})")

    def to_json(self) -> dict[str, Any]:
        return {"run": self.run, "error": self.error, "profile": self.profile.to_json() if self.profile else None,
                "profile_label": self.profile.label if self.profile else "T=0 (greedy)",
                "requests": self.requests, "where": self.where()}


@dataclass(frozen=True)
class EngineOptions:
    """Engine settings shared by baseline and candidate (only the decoder differs)."""

    model: str
    dtype: str = "float32"
    seed: int = 0
    max_model_len: int | None = None
    default_max_tokens: int = 48
    kv_cache_gib: str = "1"


def _record(item_id: str, sample: int, out: Any) -> RequestRecord:
    c = out.outputs[0]
    rec = RequestRecord(item_id, sample, list(c.token_ids), c.text, c.finish_reason,
                        len(out.prompt_token_ids or []), prompt_token_ids=list(out.prompt_token_ids or []))
    m = getattr(out, "metrics", None)
    n = len(rec.token_ids)
    if m is not None and getattr(m, "first_token_ts", 0):
        rec.ttft_s = float(m.first_token_latency)
        if n > 1 and m.last_token_ts >= m.first_token_ts:
            rec.tpot_s = float(m.last_token_ts - m.first_token_ts) / (n - 1)
    sd = getattr(c, "spec_decode_metrics", None)
    if sd is not None:
        rec.drafted = int(sd.num_draft_tokens)
        rec.accepted = int(sum(j * h for j, h in enumerate(sd.histogram)))
        rec.per_step_drafted = [int(x) for x in sd.per_step_drafted]
        rec.per_step_accepted = [int(x) for x in sd.per_step_accepted]
    # every engine step emits one token plus the accepted drafts of that step
    rec.steps = max(0, n - rec.accepted)
    return rec


class GateEngine:
    """Context manager around one ``vllm.LLM`` with one decoder; shuts the engine down on exit."""

    def __init__(self, opts: EngineOptions, spec: DecoderSpec, prefix_caching: bool = False):
        # prefix caching stays off for the measured arms (timings, A/A); the T>0 scorer turns it on
        self.opts, self.spec, self.prefix_caching = opts, spec, prefix_caching
        self.llm: Any = None

    def __enter__(self) -> GateEngine:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", self.opts.kv_cache_gib)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from vllm import LLM

        kwargs: dict[str, Any] = dict(
            model=str(self.opts.model), dtype=self.opts.dtype, seed=self.opts.seed,
            distributed_executor_backend="uni", enable_prefix_caching=self.prefix_caching, disable_log_stats=False,
            **self.spec.engine_kwargs())
        if self.opts.max_model_len:
            kwargs["max_model_len"] = self.opts.max_model_len
        if self.spec.speculative:
            kwargs["per_request_spec_decode_metrics"] = "detailed"
        from vllm_lookahead.vllm.fixes import (
            apply_tool_fixes,
            fix_cpu_expand_if_broken,
            use_loadable_compile_cache,
        )

        apply_tool_fixes()  # before: a second in-process engine (rebind scan fix, if the probe needs it)
        use_loadable_compile_cache()  # the gate's engines compile: load the cache instead of compiling again
        if self.spec.speculative:  # the scheduler runs here: steps without drafts in the step lists
            from vllm_lookahead.vllm.spec_steps import install

            install()
        self.llm = LLM(**kwargs)
        fix_cpu_expand_if_broken()  # every arm samples at T>0: vLLM's CPU expand kernel, if broken
        return self

    def __exit__(self, *exc: object) -> None:
        llm, self.llm = self.llm, None
        if llm is not None:
            with contextlib.suppress(Exception):  # best effort; the engine may already be down
                llm.llm_engine.engine_core.shutdown()
            del llm
        gc.collect()

    def spec_counters(self) -> dict[str, Any]:
        """vLLM's aggregate spec-decode counters (Prometheus ``vllm:spec_decode_*``), cumulative."""
        out: dict[str, Any] = {}
        try:
            metrics = self.llm.get_metrics()
        except Exception:  # noqa: BLE001 - counters are a cross-check, never a reason to fail a run
            return out
        for m in metrics:
            if m.name.startswith("vllm:spec_decode_"):
                key = m.name.removeprefix("vllm:spec_decode_")
                out[key] = list(m.values) if hasattr(m, "values") else m.value
        return out

    def _delta(self, before: dict[str, Any]) -> dict[str, Any]:
        after = self.spec_counters()
        out: dict[str, Any] = {}
        for k, v in after.items():
            b = before.get(k)
            if isinstance(v, list):
                out[k] = [x - (b[i] if b and i < len(b) else 0) for i, x in enumerate(v)]
            else:
                out[k] = v - (b or 0)
        return out

    def _params(self, item: EvalItem, profile: SamplingProfile | None = None, sample: int = 0) -> Any:
        from vllm import SamplingParams

        mt = item.max_tokens or self.opts.default_max_tokens
        if profile is None:
            return SamplingParams(temperature=0.0, max_tokens=mt)
        return SamplingParams(temperature=profile.temperature, top_p=profile.top_p, top_k=profile.top_k or 0,
                              min_p=profile.min_p, seed=profile.request_seed(item.id, sample, self.opts.seed),
                              max_tokens=mt)

    def run_batch(self, name: str, items: list[EvalItem], *, profiles: list[SamplingProfile] | None = None,
                  samples: int = 1, chunk: int | None = None) -> RunResult:
        """All prompts (x samples) submitted at once; vLLM schedules the batch.  Greedy without
        ``profiles``; else sample j of each item is drawn with ``profile_of(profiles, j)``, the samples
        of one profile submitted together (a crash then names its profile).  ``chunk``: ``chunk``
        requests at a time instead (the seeded T>0 A/A partner: other batch shapes)."""
        from vllm_lookahead.vllm import coupled_verify

        jobs = [(it, s) for s in range(samples) for it in items]
        before = self.spec_counters()
        steps0 = dict(coupled_verify.STEPS)
        t0 = time.perf_counter()
        outs: list[Any] = [None] * len(jobs)
        # one generate per sampling profile, so a crash names the profile that triggered it
        for p in range(len(profiles) if profiles else 1):
            idx = [j for j, (_, s) in enumerate(jobs) if not profiles or s % len(profiles) == p]
            prof = profiles[p] if profiles else None
            bar = (lambda *a, **k: tqdm(*a, **{**k, "desc": f"{name} (batch)"})) if not chunk else False
            for c in range(0, len(idx), chunk or max(1, len(idx))):
                part = idx[c: c + chunk] if chunk else idx
                got = self._generate(name, [(jobs[j][0], j % len(items), jobs[j][1]) for j in part], prof, bar)
                for j, o in zip(part, got):
                    outs[j] = o
        wall = time.perf_counter() - t0
        recs = [_record(it.id, s, o) for (it, s), o in zip(jobs, outs)]
        return RunResult(name, self.spec.describe(), f"chunks of {chunk}" if chunk else "batch",
                         [p.to_json() for p in profiles or []], self.opts.seed, wall, recs, self._delta(before),
                         verifier_steps={k: v - steps0.get(k, 0) for k, v in coupled_verify.STEPS.items()})

    def _generate(self, name: str, jobs: list[tuple[EvalItem, int, int]], profile: SamplingProfile | None,
                  use_tqdm: Any) -> list[Any]:
        """``llm.generate`` of (item, item index, sample) jobs at one profile (None: greedy); an engine
        that dies under them raises ``RunCrashed`` naming the run, the profile and these requests."""
        try:
            return self.llm.generate([it.prompt for it, _, _ in jobs],
                                     [self._params(it, profile, s) for it, _, s in jobs], use_tqdm=use_tqdm)
        except Exception as e:  # noqa: BLE001 - in-process, vLLM V1's engine death is any exception of its step
            raise RunCrashed(name, e, [(it.id, k, s) for it, k, s in jobs], profile) from e

    def score(self, runs: list[RunResult]) -> float:
        """Score T>0 runs under this (non-speculative) engine: see ``gate.inprocess_scoring``."""
        from vllm_lookahead.gate.inprocess_scoring import score_runs

        return score_runs(self.llm, runs, seed=self.opts.seed)

    def run_chunked(self, name: str, items: list[EvalItem], batch_size: int = 1) -> RunResult:
        """Greedy, ``batch_size`` prompts at a time (1 = one at a time): the A/A partner of the
        batched run (same decoder, other batch shapes) and, at 1, the batch-1 latency view."""
        recs = []
        before = self.spec_counters()
        t0 = time.perf_counter()
        chunks = [list(range(i, min(i + batch_size, len(items)))) for i in range(0, len(items), batch_size)]
        unit = "req" if batch_size == 1 else f"batch of {batch_size}"
        for chunk in tqdm(chunks, desc=f"{name} ({unit})", unit="batch" if batch_size > 1 else "req"):
            outs = self._generate(name, [(items[k], k, 0) for k in chunk], None, False)
            recs += [_record(items[k].id, 0, o) for k, o in zip(chunk, outs)]
        wall = time.perf_counter() - t0
        mode = "sequential" if batch_size == 1 else f"chunks of {batch_size}"
        return RunResult(name, self.spec.describe(), mode, [], self.opts.seed, wall, recs,
                         self._delta(before))


@dataclass
class ArmRuns:
    """What the gate needs from one decoder."""

    greedy: RunResult
    sequential: RunResult | None = None  # batch-1 latency subset
    sampled: RunResult | None = None
    startup_s: float = 0.0
    aa: RunResult | None = None  # baseline only: every item again at another batch size
    # baseline only, with per-request-seeded profiles: the T>0 samples again at another batch size
    sampled_aa: RunResult | None = None


def run_arm(opts: EngineOptions, spec: DecoderSpec, items: list[EvalItem], *, name: str,
            sequential_items: list[EvalItem] | None, samples: int = 0,
            profiles: list[SamplingProfile] | None = None, aa_batch_size: int | None = None) -> ArmRuns:
    """Start an engine for ``spec``; run greedy batched, the optional A/A pass (all items at
    ``aa_batch_size``), the batch-1 latency subset and the T>0 samples (with the A/A pass and
    per-request-seeded profiles: the samples again, ``aa_batch_size`` at a time); shut the engine down."""
    if not Path(opts.model).is_dir():
        raise FileNotFoundError(f"model directory {opts.model} not found")
    t0 = time.perf_counter()
    with GateEngine(opts, spec) as eng:
        startup = time.perf_counter() - t0
        greedy = eng.run_batch(name, items)
        aa = eng.run_chunked(f"{name} A/A", items, aa_batch_size) if aa_batch_size else None
        seq = eng.run_chunked(f"{name} latency", sequential_items) if sequential_items else None
        sampled = eng.run_batch(f"{name} T>0", items, profiles=profiles, samples=samples) \
            if samples > 0 and profiles else None
        sampled_aa = eng.run_batch(f"{name} T>0 A/A", items, profiles=profiles, samples=samples,
                                   chunk=aa_batch_size) \
            if sampled is not None and aa_batch_size and seeded(profiles) else None
    return ArmRuns(greedy, seq, sampled, startup, aa, sampled_aa)
