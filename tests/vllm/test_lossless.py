"""Proof of losslessness on real vLLM (CPU, trained demo model, float32).

Greedy: outputs with lookahead equal outputs without it, token for token, at batch sizes 1, 8 and 32,
with prefix caching on and under forced preemption.  n > 1 (sampling only in vLLM) is checked for
per-child drafting, not identity: near-greedy sampling is not greedy even without speculation.  Sampling (T=1): the samples are scored under
the model without speculation (PIT per position and excess log-prob, exact nulls), with a positive
control (T=1.3) that the same test must reject, so the test is shown to have power.  The benchmark (benchmarks/lossless.py) runs the same
checks on 200+ prompts and adds the bfloat16 match rate next to its A/A baseline.
"""

from __future__ import annotations

import gc

import pytest
from lossless_support import generate_in_chunks, heldout_prompts, likelihood_pvalues, sample_run

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MAX_TOKENS = 48
BATCH_SIZES = (1, 8, 32)
# the default drafter, and the same with no floor (every candidate token drafted: the most drafts to verify)
LOOKAHEAD_SPECS = ("lookahead:k=4", "lookahead:k=4,chain_min_p=0.0,chain_busy_min_p=0.0")


@pytest.fixture(scope="module")
def greedy_runs(engine_factory):
    """Token ids per decoder and batch size, plus lookahead's spec-decode counters."""
    from vllm import SamplingParams

    from vllm_lookahead.vllm.proposer import PROFILE

    prompts = heldout_prompts()
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    runs: dict[str, dict] = {}
    for spec in ("none", *LOOKAHEAD_SPECS):
        llm = engine_factory(spec)
        runs[spec] = {}
        for bs in BATCH_SIZES:
            outs = generate_in_chunks(llm, prompts, bs, sp)
            runs[spec][bs] = [list(o.outputs[0].token_ids) for o in outs]
            runs[spec][f"metrics{bs}"] = [o.outputs[0].spec_decode_metrics for o in outs]
            # the drafter's own account so far: verifications it learnt from (acceptance table)
            drafter = PROFILE.drafter if spec != "none" else None
            runs[spec][f"learnt{bs}"] = sum(drafter.table.evaluated) if drafter is not None else 0.0
        # prefix caching: the same prompts again hit the cache
        runs[spec]["cached"] = [list(o.outputs[0].token_ids) for o in generate_in_chunks(llm, prompts, 8, sp)]
        # n > 1 (vLLM allows it only when sampling): each child is its own request id for the drafter
        multi = llm.generate(prompts[:4], SamplingParams(temperature=0.8, max_tokens=MAX_TOKENS, n=2),
                             use_tqdm=False)
        runs[spec]["n2"] = [[(list(c.token_ids), c.spec_decode_metrics) for c in o.outputs] for o in multi]
        del llm
        gc.collect()
    return prompts, runs


@pytest.mark.parametrize("spec", LOOKAHEAD_SPECS)
@pytest.mark.parametrize("bs", BATCH_SIZES)
def test_greedy_float32_identical(greedy_runs, bs, spec):
    prompts, runs = greedy_runs
    base, cand = runs["none"][bs], runs[spec][bs]
    mismatched = [i for i, (a, b) in enumerate(zip(base, cand)) if a != b]
    assert not mismatched, f"{len(mismatched)}/{len(prompts)} outputs differ at batch {bs}: {mismatched}"
    assert all(len(t) > 0 for t in cand)


@pytest.mark.parametrize("spec", LOOKAHEAD_SPECS)
def test_lookahead_really_speculated(greedy_runs, spec):
    """Exactness would be vacuous if no draft were ever proposed or accepted."""
    _, runs = greedy_runs
    drafted = accepted = 0
    for m in runs[spec]["metrics1"]:
        d = m.to_dict()
        drafted += d["num_draft_tokens"]
        accepted += d["num_accepted_draft_tokens"]
    assert drafted > 0 and accepted > 0.2 * drafted, (drafted, accepted)


def test_verification_outcomes_reach_the_drafter_at_every_batch_size(greedy_runs):
    """The proposer passes each row's verified draft count (not the target argmax, which the drafter does
    not need): without it the acceptance table would stop learning."""
    _, runs = greedy_runs
    learnt = [runs["lookahead:k=4"][f"learnt{bs}"] for bs in BATCH_SIZES]
    assert learnt[0] > 0 and learnt[1] > learnt[0] and learnt[2] > learnt[1], learnt


def test_prefix_caching(greedy_runs):
    _, runs = greedy_runs
    assert runs["lookahead:k=4"]["cached"] == runs["none"][1]


def test_n2_children_are_drafted_for_independently(greedy_runs):
    _, runs = greedy_runs
    children = [c for group in runs["lookahead:k=4"]["n2"] for c in group]
    assert len(children) == 8 and all(ids for ids, _ in children)
    assert sum(m.to_dict()["num_draft_tokens"] for _, m in children) > 0


def test_greedy_identical_under_preemption(engine_factory):
    """A KV cache too small for the batch forces vLLM to preempt and recompute requests; lookahead's
    per-request state (keyed by request id) must survive that without changing any output."""
    from vllm import SamplingParams

    prompts = heldout_prompts()
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    outputs = {}
    preempted = {}
    for spec in ("none", "lookahead:k=4"):
        # 20 blocks x 32 tokens = 640 cached tokens for 32 requests of ~100-400 tokens each
        llm = engine_factory(spec, max_model_len=512, extra={"num_gpu_blocks_override": 20, "block_size": 32})
        outs = llm.generate(prompts, sp, use_tqdm=False)
        outputs[spec] = [list(o.outputs[0].token_ids) for o in outs]
        preempted[spec] = sum(getattr(o.metrics, "num_preemptions", 0) or 0 for o in outs)
        del llm
        gc.collect()
    assert outputs["none"] == outputs["lookahead:k=4"]
    assert preempted["lookahead:k=4"] > 0, "the tiny KV cache did not force any preemption"


def test_sampling_distribution_unchanged(engine_factory):
    """T=1: lookahead's samples follow the model's own distribution, token by token.  500 samples of one
    prompt (5 tokens each) are scored under the model without speculation (the release gate's scorer,
    ``gate.inprocess_scoring.score_runs``): the randomized PIT of the tokens at positions 1-4 (position 0 comes
    from prefill, before any draft) must be uniform (Anderson-Darling per position) and the excess
    log-prob (sampled token's log-prob minus its expectation under the sampler's distribution) must
    have mean 0 -- both exact nulls under correct sampling, Bonferroni over the 5 tests at 0.01.
    Positive control: T=1.3 samples without lookahead, scored as if T=1, must be rejected.

    Why not a two-sample chi-square against a `none` sample (the earlier form of this test): its verdict
    hangs on one baseline sample.  The one it used (seed 1234) is atypical at position 2: 12 A/A `none`
    samples against it gave p < 0.01 three times, once p = 0.0019 (below the test's 0.0033), while
    the same 12 against each other never went below 0.05 (66 pairs;
    ``benchmarks/results/t1_sampling_diag.json``); the one-sample test has no baseline sample to be
    unlucky with.  Power, checked by running this test body on the gate's faulty decoders: the original
    vLLM CPU expand kernel (vllm_lookahead/vllm/fixes.py) fails it at PIT p < 1e-36 at every position,
    a draft temperature x0.9 (T>0-only fault) on the excess test at p = 6e-6."""
    from vllm import SamplingParams

    from vllm_lookahead.gate.inprocess_scoring import score_runs

    prompt = "    def test_repeat(self):\n        self.assertEqual(x, 1)\n        self.assertEqual(y, 2)\n        self.assertEqual("
    n = 500
    runs = []
    llm = engine_factory("lookahead:k=4,measured_floor=false", seed=99)  # drafts whatever the timing
    outs = llm.generate([prompt] * n, SamplingParams(temperature=1.0, max_tokens=5), use_tqdm=False)
    drafted = sum(o.outputs[0].spec_decode_metrics.to_dict()["num_draft_tokens"] for o in outs)
    runs.append(sample_run("lookahead", outs, 1.0))
    del llm
    gc.collect()
    assert drafted > 0, "lookahead proposed no drafts at T=1: the test would be vacuous"
    scorer = engine_factory("none", seed=7)  # prefix caching on: the shared prompt is computed once
    outs = scorer.generate([prompt] * n, SamplingParams(temperature=1.3, max_tokens=5), use_tqdm=False)
    runs.append(sample_run("control T=1.3", outs, 1.0))  # drawn at 1.3, judged as if at 1.0
    score_runs(scorer, runs)
    del scorer
    gc.collect()

    def pvalues(run) -> dict[str, float]:  # positions 1-4 (0 comes from prefill) and the excess test
        return {k: p for k, p in likelihood_pvalues(run).items() if k != "pit_pos0"}

    alpha = 0.01 / 5
    same, control = pvalues(runs[0]), pvalues(runs[1])
    assert min(same.values()) > alpha, f"lookahead changed the sampling distribution: p={same}"
    assert min(control.values()) < alpha, f"the test could not tell T=1.0 from T=1.3 (no power): p={control}"
