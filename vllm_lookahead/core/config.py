"""Lookahead configuration: one validated dataclass, built from a dict (``additional_config["lookahead"]``
or the ``VLLM_LOOKAHEAD_CONFIG`` JSON environment variable).  Bad values raise ``LookaheadConfigError``
naming the key, the value and the allowed range, so a typo fails at engine start, not mid-request."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, fields
from typing import Any


class LookaheadConfigError(ValueError):
    pass


# Ranges and choices, declared once: ``LookaheadConfig.__post_init__`` enforces them, the per-request
# ``extra_args["lookahead"]`` reader clamps to them, and the Helm chart's values.schema.json
# ``lookahead`` subtree is generated from them (deploy/scripts/gen_lookahead_schema.py; a test fails on
# drift).  (lo, hi): inclusive; hi None = unbounded.  Keys not listed here have no range.
LIMITS: dict[str, tuple[float, float | None]] = {
    "ngram": (2, 16), "pool_size": (1, 1024), "max_pool_keys": (1, 10_000_000),
    "shared_pool_keys": (0, 10_000_000), "max_prompt_index_tokens": (0, None), "min_match": (1, 32),
    "max_match": (1, 32), "window": (0, 64), "memory_tokens": (0, 100_000_000), "memory_depth": (1, 32),
    "cost_margin": (0.0, 1.0), "chain_min_p": (0.0, 1.0), "chain_busy_min_p": (0.0, 1.0), "chain_strict_min_p": (0.0, 1.0),
    "guard_batch_size": (1, None), "guard_max_retry_steps": (64, None), "pool_max_batch": (0, None), "ema_decay": (0.0, 1.0), "min_acceptance": (0.0, 1.0),
    "free_draft_batch_size": (0, None), "probe_interval": (1, None), "max_batch_draft_tokens": (0, None),
    "batch_size_threshold": (1, None), "busy_min_acceptance": (0.0, 1.0), "confident_match": (1, 32),
    "max_dormant_requests": (0, None), "lade_window": (1, 64), "lade_ngram": (3, 16),
    "lade_candidates": (0, 64), "lade_max_batch": (0, None), "lade_context_candidate": (0, 32),
    "lade_shared_candidates": (0, 16), "chain_max_draft": (0, 128),
}
CHOICES: dict[str, tuple[str, ...]] = {
    "policy": ("chain", "cost", "ema"), "layout": ("chain", "2d"), "lade_policy": ("measure", "always"),
}
EXCLUSIVE_HI = frozenset({"ema_decay"})  # upper bound not allowed itself
K_LIMITS = (1, 128)
"""num_speculative_tokens: vLLM's MAX_SPEC_LEN bounds a step's draft rows (the 2D layout uses them all)."""
BUSY_FLOOR_BY_K = ((4, 0.05), (8, 0.15))
"""(k, floor) points of the default busy floor (``LookaheadConfig.busy_floor``): measured at k = 4 and 8."""
ALIASES: dict[str, str] = {"W": "lade_window", "N": "lade_ngram", "G": "lade_candidates"}
"""W/N/G mean LADE's window, n-gram size and candidates (guess set) -- the 2D layout's shape -- in
every place they are accepted: this config dict, the ``lookahead`` / ``lookahead2d`` SPEC strings and a
request's ``extra_args["lookahead"]``.  The chain's own knobs have long names only (``window``,
``ngram``, ``pool_size``)."""
NOTES = {"window": " (0 = k)", "chain_max_draft": " (0 = k)", "lade_ngram": " (N=2 leaves no lookahead level)"}


def _field_type(f: dataclasses.Field) -> tuple[str, bool]:
    """A config field's type as (base type name, whether None is allowed): ``"float | None"`` ->
    ("float", True).  The annotations are strings here (``from __future__ import annotations``)."""
    text = str(f.type)
    return text.split(" |")[0], text.endswith("| None")


def range_text(key: str) -> str:
    lo, hi = LIMITS[key]
    if hi is None:
        text = f"must be >= {lo}"
    else:
        text = f"must be in [{lo}, {hi})" if key in EXCLUSIVE_HI else f"must be in {lo}..{hi}"
    return text + NOTES.get(key, "")


def in_range(key: str, value: float) -> bool:
    lo, hi = LIMITS[key]
    return value >= lo and (hi is None or (value < hi if key in EXCLUSIVE_HI else value <= hi))


@dataclass(frozen=True)
class LookaheadConfig:
    # --- n-gram pool (LADE's G and N) ---
    ngram: int = 4
    """N: length of the n-grams stored in the pool (key token + N-1 continuation tokens)."""
    pool_size: int = 8
    """G: continuations kept per key token (LRU)."""
    max_pool_keys: int = 32768
    """Bound on distinct keys per request; least recently used keys are evicted beyond it."""
    shared_pool_keys: int = 65536
    """Keys of the pool shared by all requests of the engine (0 = off): n-grams of every request's
    *output* enter it, and a request consults it when its own pool has nothing for the key.  A model
    repeats its own boilerplate across requests (suffix decoding's global tree exploits the same fact);
    LADE's pool is per request and forgets it.  Memory: at most `shared_pool_keys` x `pool_size`
    continuations per worker (an estimated 50-80 MB of Python objects at the defaults, worst case)."""
    seed_from_prompt: bool = True
    """Index the prompt's n-grams (LADE's prompt pool); output n-grams are always indexed."""
    max_prompt_index_tokens: int = 8192
    """Only the last this-many prompt tokens are indexed, bounding the one-off cost of a long prompt."""
    # --- context matching (prompt lookup inside the same drafter) ---
    min_match: int = 1
    max_match: int = 4
    # --- Jacobi window ---
    window: int = 0
    """W: Jacobi guesses carried from one verification to the next (0 = as many as k allows)."""
    # --- chain drafter policy (issue 14) ---
    policy: str = "chain"
    """"chain" (the default, issue 14): every source (context match, engine-wide output memory; LADE pool
    and Jacobi iterate at batch <= `pool_max_batch`, 0 by default) offers a candidate with a learned per-token
    acceptance estimate (core/chain.py); the best one is drafted while its estimated commit probability
    stays >= a floor that can rise with the batch (`chain_min_p` at one request to `chain_busy_min_p` at
    `batch_size_threshold`, 0.05 by default, the busy one higher for k > 4; above it a measured guard also switches drafting off
    while plain decoding serves more tokens/s).  "cost": the same candidates cut for the whole batch by a model of the
    engine's step times (core/cost_model.py; it drafted too little at batch 8 and 32 after a cold
    start).  "ema" (the default until issue 14): the fixed-k policy (per-request EMA floor, busy
    threshold, confident fallback; the keys below).  "chain" became the default once its T>0 sampling
    was shown conforming: the one T=1 test failure it had (a chi-square against one `none` sample,
    p = 3.7e-5 at seed 99) was that baseline sample's doing -- the same chain sample conforms under the
    model's own likelihood at every position and against 12 other `none` samples
    (benchmarks/results/t1_sampling_diag.json), and the release gate's T>0 check passes it
    (benchmarks/results/gate_conformance_chain_s6_r4.json).  Measured side by side: benchmarks/results/README.md."""
    memory_tokens: int = 65536
    """Output tokens kept in the engine-wide memory of earlier outputs (core/suffix_memory.py; 0 = off),
    oldest outputs evicted first.  Isolated per LoRA adapter and tenant (SamplingParams
    extra_args["lookahead"]["tenant"]).  Memory: at most `memory_depth` (context, next token) entries per
    token, 44 bytes each in tables kept a quarter to half full (46-92 MB at the defaults, worst case)."""
    memory_depth: int = 8
    """Longest context (tokens) the output memory matches on.  8 since session 26: with the context/memory
    agreement evidence (core/chain.py) a longer match ranks the memory's drafts better -- replayed at
    batch 1 (48 prompts, k=8) at floors 0.2-0.45 it committed about as many tokens (-1% to +1%) from 1-4% fewer drafts than
    depth 4, where 12 gained no more (a one-off sweep, not recorded; 4 had been as good as 6 or 8 without
    that evidence).  Agreement and depth 8 together: benchmarks/results/draft_ranking_{copy,open}_48_agree.json
    against draft_ranking_{copy,open}_48.json."""
    pool_max_batch: int = 0
    """Policies "chain" and "cost": LADE's pool and the Jacobi iterate are sources (and kept up to date)
    only while at most this many requests run (0 = never) -- their drafts are accepted least often (on
    32 open prompts at batch 1 they made 63 of ~3,800 draft tokens, bench_repeats_open_32_chain.json; at
    k=8 237 of 9,675 with 55 accepted), and their upkeep, with the target argmax it needs, is the
    proposer's largest cost.  0 since session 16: with them off, batch 1 also takes the compiled batch
    path (core/batch_rows.py) and the proposer's share of a step fell from 4.9% to 2.0% (open and copy
    prompts, k=8) while compression stayed (3.383 vs 3.323 open, 3.084 vs 3.092 copy) and tokens/s did
    not fall (1.037x vs 1.033x suffix's open, 1.001x vs 0.978x copy; benchmarks/results/README.md,
    "pool_max_batch"). 1 brings LADE's sources back for a lone request."""
    cost_margin: float = 0.02
    """Drafts are made only when the step-time model predicts at least this much more tokens/s than
    no drafts (a guard against estimation error)."""
    chain_min_p: float = 0.05
    """Policy "chain" with one running request: a draft token is drafted while its estimated probability
    of being committed (its own and its predecessors' acceptance estimates, times the request's own
    accepted/expected history) is at least this -- suffix decoding's ``min_token_prob`` rule, on
    learned estimates.  With more requests the floor rises linearly to `chain_busy_min_p`
    (``LookaheadDrafter.chain_floor``): a draft row pays when its commit probability beats what the
    step's time would serve otherwise, and that grows with the batch."""
    chain_busy_min_p: float | None = None
    """Policy "chain" from `batch_size_threshold` running requests on: the floor (the measured guard may
    still switch drafting off).  Unset (None, the default): chosen by k (``busy_floor``) -- 0.05 up to
    k = 4, rising linearly to 0.15 at k = 8 and staying there.  Why by k: on this project's 2-core CPU
    the floor that served most at busy batches was 0.05 with k = 4 (0.05 vs 0.25 vs 0.4,
    benchmarks/results/chain_floor_tuning_{open,copy}_64_s1.json; 0.3 lost again in
    busy_floor_k4_open_64_b.json) but 0.3 (against 0.05) with k = 8 (busy_floor_k8_{open_64_a,open_64_b,copy_64}.json,
    busy_floor_auto_k8_{open,copy}_64.json: ahead at batch 32 in all five runs): a request's k + 1
    query rows cost step time once they are many (batch 8: ~0.03 ms per draft row at k = 4, ~0.15 at
    k = 8), and the long drafts' tails are the least likely tokens.  k = 5..7 are interpolated; k = 6
    was checked (busy_floor_auto_k6_{open,copy}_64_r5.json: ahead at batch 32, batch 8 within the
    spread).  0.15 at k = 8 since session 16: once the proposer's upkeep was one compiled call per step,
    0.15 served more than 0.3 at batch 8 and 32 on open and copy prompts (4 of 4, 1.048x / 1.049x and
    0.991x / 1.034x suffix's against 0.989x / 1.025x and 0.983x / 0.961x;
    benchmarks/results/busy015_{open,copy}_64_r5.json, an AVX-512 host; 0.3 had been compared with 0.05
    only, on the AVX2 host).  A number here is used at every k; raise it where draft rows cost more (the floor then
    rises with the batch)."""
    measured_floor: bool = True
    """Policy "chain": once the engine has timed enough of its own pure decode steps at a batch size
    (32, per power-of-two bucket of running requests), the floor there is the measured price of a draft
    row -- the step time one row adds (a robust fit of step time against query rows) times the tokens/s of
    those steps (``core.cost_model.DraftRowPrice``) -- at least `chain_min_p`, at most 0.5.  Why: a draft
    token pays exactly when its commit probability beats that price, and the price depends on the
    hardware, the model, the prompts and the batch, which fixed floors can only guess (the ones above are
    tuned on this project's 2-core CPU and serve until the bucket is measured).  False: the fixed floors
    always."""
    chain_strict_min_p: float = 0.0
    """Policy "chain" above `guard_batch_size` running requests: the floor of the guard's "strict" mode
    (opt-in; at or below `chain_busy_min_p`, as by default, it is not tried).  With it the guard measures
    tokens/s per batch-size bucket for three modes -- "chain" (the floors above), "strict" (at least this
    floor: fewer, surer draft rows) and "off" (no drafts) -- and runs the fastest.  Why measured: which
    floor pays depends on what a draft row costs next to a row of real work (hardware, model, batch),
    which no acceptance estimate knows.  Why off by default: on this project's 2-core CPU, 0.3 lost the
    guard's own measurement to the configured floor at batch 8 and 32 on open and copy prompts, and its
    measuring steps cost tokens/s in short runs (docs/design/busy-floor.md,
    benchmarks/results/bench_repeats5_{open,copy}_64_guard3.json).  Try 0.2-0.4 where draft rows are
    dear (a larger model on CPU)."""
    guard_batch_size: int = 16
    """Policies "chain" and "ema": above this many running requests the measured guard (core/drafter.py,
    one ``core.arbiter.LayoutArbiter`` per batch-size bucket: 17-32, 33-64, ... at the default) chooses
    between drafting as configured, the strict floor (if set) and no drafts, from the engine's own step
    times.  16: at batch 8 on the 2-core CPU drafting won in every repeat (1.29x-1.87x `none`,
    benchmarks/results/bench_repeats5_{open,copy}_64_guard3.json), so measuring "off" there only cost
    its measuring steps; lower it where a batch of 8 is compute-bound."""
    guard_max_retry_steps: int = 512
    """The guard re-tries a losing mode (2 steps) every 64 steps; one that lost the last re-try by 1.25x
    or more waits twice as long before the next, up to this many steps, and a warm-up that separates the
    modes by 1.25x after 4 steps each ends there (``core.arbiter.LayoutArbiter``, ``max_explore_every``).
    Why: a loser's steps run at the loser's speed -- at batch 32 on the 2-core CPU "off" served 45% of
    drafting's tokens/s, and its 9-12 warm-up and re-try steps of a 128-request run (~100 steps of 17-32
    rows) cost it an estimated ~1.5% -- their time at 45% of drafting's rate, from the guard's summary in
    benchmarks/results/il2_k8_copy_128_r5.json.  The price: a change that makes the
    loser the winner is noticed within this many steps (~10 s at batch 32 there).  64: no back-off."""
    # --- adaptive policy ("ema") ---
    ema_decay: float = 0.7
    """Weight of the past in the per-request EMA of accepted tokens per drafted token."""
    min_acceptance: float = 0.15
    """Below this EMA acceptance a request stops drafting, then probes every `probe_interval` steps --
    only once more than `free_draft_batch_size` requests run: up to that, every request drafts freely
    (speculative fill included), because a weak draft still beats none while draft rows are close to
    free.  Default 1: measured with continuous batching on a 2-core CPU, free drafting pays at one
    request (1.8-2.1x none) but at 8 concurrent requests it ran 36% below the tokens/s that the
    confident-match fallback reaches (benchmarks/results/README.md).  On a memory-bound GPU raise it (8-16)."""
    free_draft_batch_size: int = 1
    probe_interval: int = 8
    max_batch_draft_tokens: int = 256
    """Token budget for draft rows in one step across the batch; best requests get slots first."""
    batch_size_threshold: int = 16
    """Policy "ema": above this many running requests only requests with EMA acceptance >= busy_min_acceptance
    draft.  Policy "chain": where the floor reaches `chain_busy_min_p`."""
    busy_min_acceptance: float = 0.4
    confident_fallback: bool = True
    """A request whose EMA is below the floor in force does not go silent: it still drafts *confident*
    context matches (a suffix of >= `confident_match` tokens seen before, what prompt lookup drafts),
    without pool or Jacobi fill.  Those drafts are accepted far more often than the speculative fill, so
    they pay even when draft rows cost compute (busy batches on CPU)."""
    confident_match: int = 2
    max_dormant_requests: int = 256
    """Per-request state kept for requests absent from the batch (preempted); LRU beyond it."""
    plain_steps_without_drafts: bool = True
    """A step in which no request has a draft runs vLLM's plain (non-speculative) path: logits of the last
    positions and vLLM's sampler, as with no speculation at all (vllm/plain_steps.py).  Why: once speculation is
    configured vLLM 0.32 runs its spec-decode metadata and rejection sampler on every step, drafts or not --
    measured in benchmarks/results/draft_row_cost.json -- so a guard that switches drafting off would still be
    slower than `none`.  Attention-only models; other runners keep the speculative path."""
    fast_greedy_verify: bool = True
    """A greedy speculative step in which nothing changes the argmax (no penalties, logit bias, min_tokens,
    bad words, logprobs; CPU float32 logits) is verified from the proposer's numpy argmax of the step's
    logits -- vLLM's greedy rule, token for token (core/verify.py) -- instead of vLLM's rejection sampler,
    which on CPU clones the logits and runs torch's argmax (~10x numpy's time here): the sampling phase of
    a step fell from 0.631 to 0.354 ms at batch 1 and from 1.596 to 0.921 ms at batch 32
    (benchmarks/results/verify_cost_k8_open.json; vllm/greedy_verify.py).  Any other step, and every step
    with this off, is verified by vLLM."""
    # --- LADE's 2D layout (issue 8; docs/design/lookahead-2d.md) ---
    layout: str = "chain"
    """"chain": drafts are one chain verified by vLLM's rejection sampler (the default).  "2d": LADE's
    own step -- G candidates and a W x (N-1) Jacobi window in one forward with LADE's mask, verified
    by a multi-candidate verifier -- for greedy requests while at most `lade_max_batch` requests run;
    everything else takes the chain.  Needs num_speculative_tokens >= (N-1)(W+G) - 1.  Off by default:
    on a compute-bound CPU no extra row is free and 2D loses to the chain (benchmarks/results)."""
    lade_window: int = 5
    """W of the 2D layout (Jacobi window columns); a request may ask for less (extra_args)."""
    lade_ngram: int = 3
    """N of the 2D layout (n-gram length; the window holds N-1 levels)."""
    lade_candidates: int = 5
    """G of the 2D layout (candidates verified per step)."""
    lade_max_batch: int = 1
    """The 2D layout runs only while at most this many requests are in the batch (its rows are free
    only while a step is memory-bound; raise it on GPUs, see the design note's section 6)."""
    lade_context_candidate: int = 0
    """Up to this many tokens of a context match (prompt lookup over prompt + output, the chain's own
    index) become the first 2D candidate when the match is >= `confident_match` tokens long -- an
    addition to LADE, whose pool candidates are only N-1 tokens.  0 = pure LADE.  Adds up to this
    many rows; k must cover them too."""
    lade_shared_candidates: int = 0
    """Up to this many continuations (`ngram` - 1 tokens each) from the engine-wide pool of output
    n-grams (`shared_pool_keys`) become 2D candidates after the context candidate -- the multi-source
    verification the 2D layout makes possible.  0 = pure LADE."""
    lade_policy: str = "measure"
    """How a 2D engine picks each step's layout.  "measure": it times its own steps and, per batch size,
    uses whichever of 2D (only at batch <= `lade_max_batch`), chain or no drafts at all serves the most
    tokens/s (core/arbiter.py; the others are re-tried 4 steps in 64).  "always": 2D whenever it can,
    the chain otherwise (for tests and measurements)."""
    lade_seed: int = 0
    chain_max_draft: int = 0
    """Longest chain draft (0 = num_speculative_tokens).  With layout="2d" the engine's k is sized for
    the 2D rows (19 at W5/N3/G5); requests on the chain (busy batches, sampling with penalties) should
    keep drafting chain-sized drafts, e.g. 4."""
    """Seed of the random prompt tokens that start a request's window (LADE's initialisation)."""

    def __post_init__(self) -> None:
        def need(cond: bool, key: str, rule: str) -> None:
            if not cond:
                raise LookaheadConfigError(f"lookahead config: {key}={getattr(self, key)!r} is invalid; {rule}")

        for f in fields(self):
            v = getattr(self, f.name)
            base, optional = _field_type(f)
            if v is None and optional:  # unset: a default chosen at run time
                continue
            expected = bool if base == "bool" else float if base == "float" else str if base == "str" else int
            ok = isinstance(v, expected) if expected in (bool, str) else (
                isinstance(v, (int, float)) and not isinstance(v, bool) if expected is float
                else isinstance(v, int) and not isinstance(v, bool))
            need(ok, f.name, f"expected {expected.__name__}")
        for key in LIMITS:
            v = getattr(self, key)
            need(v is None or in_range(key, v), key, range_text(key))
        for key, allowed in CHOICES.items():
            need(getattr(self, key) in allowed, key, "must be " + " or ".join(f'"{c}"' for c in allowed))
        need(self.min_match <= self.max_match, "min_match", "must be <= max_match")
        need(self.lade_rows <= 129, "lade_window",
             f"(N-1)(W+G) = {self.lade_rows} rows exceeds vLLM's 128 draft tokens + 1")

    @property
    def lade_rows(self) -> int:
        """Most query rows of a 2D step: (N-1)(W+G), the context and the shared-pool candidates; k must be
        >= lade_rows - 1."""
        return ((self.lade_ngram - 1) * (self.lade_window + self.lade_candidates) + self.lade_context_candidate
                + self.lade_shared_candidates * (self.ngram - 1))

    def busy_floor(self, k: int) -> float:
        """The policy "chain" floor from `batch_size_threshold` rows on, for drafts of up to ``k`` tokens:
        `chain_busy_min_p` if set, else the measured k-aware default (0.05 at k <= 4, 0.15 at k >= 8,
        linear between; see `chain_busy_min_p`)."""
        if self.chain_busy_min_p is not None:
            return self.chain_busy_min_p
        lo, hi = BUSY_FLOOR_BY_K
        return lo[1] + (hi[1] - lo[1]) * min(max(k - lo[0], 0), hi[0] - lo[0]) / (hi[0] - lo[0])

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> LookaheadConfig:
        raw = dict(raw or {})
        for short, long in ALIASES.items():
            if short in raw:
                if long in raw:
                    raise LookaheadConfigError(f"lookahead config: give {short!r} or {long!r}, not both")
                raw[long] = raw.pop(short)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise LookaheadConfigError(
                f"lookahead config: unknown key(s) {unknown}; known keys: {sorted(known)} (aliases W, N, G)")
        for f in fields(cls):  # ints given where floats are expected are fine
            if f.name in raw and _field_type(f)[0] == "float" and isinstance(raw[f.name], int) \
                    and not isinstance(raw[f.name], bool):
                raw[f.name] = float(raw[f.name])
        return cls(**raw)

    @classmethod
    def from_sources(cls, additional_config: dict[str, Any] | None) -> LookaheadConfig:
        """``additional_config["lookahead"]`` wins; else ``$VLLM_LOOKAHEAD_CONFIG`` (JSON); else defaults."""
        if additional_config and "lookahead" in additional_config:
            section = additional_config["lookahead"]
            if not isinstance(section, dict):
                raise LookaheadConfigError('additional_config["lookahead"] must be a JSON object')
            return cls.from_dict(section)
        env = os.environ.get("VLLM_LOOKAHEAD_CONFIG")
        if env:
            try:
                section = json.loads(env)
            except json.JSONDecodeError as e:
                raise LookaheadConfigError(f"VLLM_LOOKAHEAD_CONFIG is not valid JSON: {e}") from None
            if not isinstance(section, dict):
                raise LookaheadConfigError("VLLM_LOOKAHEAD_CONFIG must be a JSON object")
            return cls.from_dict(section)
        return cls()

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def overrides(self) -> dict[str, Any]:
        """The validated settings that differ from the defaults, by canonical name (what telemetry
        reports as the decoder's params: aliases resolved, nothing unvalidated)."""
        default = LookaheadConfig()
        return {k: v for k, v in self.as_dict().items() if v != getattr(default, k)}


def json_schema() -> dict[str, Any]:
    """JSON schema of a ``lookahead`` config dict (types, ranges, choices, defaults; no unknown keys),
    generated from the dataclass and ``LIMITS``/``CHOICES`` -- the chart's schema embeds it."""
    props: dict[str, Any] = {}
    for f in fields(LookaheadConfig):
        base, optional = _field_type(f)
        kind: Any = {"bool": "boolean", "float": "number", "str": "string"}.get(base, "integer")
        if optional:
            kind = [kind, "null"]
        prop: dict[str, Any] = {"type": kind, "default": f.default}
        if f.name in LIMITS:
            lo, hi = LIMITS[f.name]
            prop["minimum"] = lo
            if hi is not None:
                prop["exclusiveMaximum" if f.name in EXCLUSIVE_HI else "maximum"] = hi
        if f.name in CHOICES:
            prop["enum"] = list(CHOICES[f.name])
        props[f.name] = prop
    for short, long in ALIASES.items():
        props[short] = {k: v for k, v in props[long].items() if k != "default"} | {"description": f"alias of {long}"}
    return {"type": "object", "additionalProperties": False, "properties": props}
