"""``ThroughputArbiter``: measured throughput picks the layout, the loser is re-tried, idle gaps ignored."""

from __future__ import annotations

import pytest

from vllm_lookahead.core.arbiter import ThroughputArbiter

pytestmark = pytest.mark.unit


def run(arb: ThroughputArbiter, steps: int, cost: dict[str, tuple[int, float]]) -> list[str]:
    """Drive the arbiter with a fixed (tokens, seconds) per step for each layout."""
    chosen = []
    for _ in range(steps):
        mode = arb.choose()
        chosen.append(mode)
        arb.observe(mode, *cost[mode])
    return chosen


@pytest.mark.parametrize("faster", ["chain", "wide"])
def test_the_faster_layout_wins_and_the_other_is_retried(faster):
    slow = "wide" if faster == "chain" else "chain"
    arb = ThroughputArbiter(("chain", "wide"), explore_every=64, explore_steps=4, warmup_steps=8)
    # equal tokens per step, different step time: a compute-bound CPU (chain faster) or a GPU (2d faster)
    chosen = run(arb, 8 + 8 + 640, {faster: (2, 0.004), slow: (2, 0.006)})
    steady = chosen[16:]
    assert steady.count(slow) == pytest.approx(len(steady) * 4 / 64, abs=4)  # only the re-tries
    assert arb.tokens_per_s[faster] > arb.tokens_per_s[slow]


def test_a_change_in_costs_flips_the_choice():
    arb = ThroughputArbiter(("chain", "wide"), explore_every=16, explore_steps=4, warmup_steps=4)
    run(arb, 200, {"chain": (2, 0.004), "wide": (3, 0.008)})
    assert arb.choose() == "chain"
    chosen = run(arb, 400, {"chain": (2, 0.004), "wide": (3, 0.003)})  # rows became cheap
    assert chosen[-40:].count("wide") > 30


def test_a_retried_layout_is_measured_afresh_not_by_its_warm_up():
    """The bias found in issue 14's k=8 runs: every layout is first measured in the warm-up, when the
    output memory is empty and acceptance low; the incumbent's figure then follows the better
    conditions step by step, the loser's stays at its warm-up value.  Here the loser ("wide") is the
    faster one once acceptance has grown; re-tried 2 steps in 64, it must win at its first re-try --
    blended into its warm-up figure by the EMA it took ~6 re-tries (~380 steps)."""
    arb = ThroughputArbiter(("chain", "wide"), explore_every=64, explore_steps=2, warmup_steps=8)
    run(arb, 16, {"chain": (20, 0.010), "wide": (16, 0.009)})  # cold: chain 2000, strict 1778 tokens/s
    assert arb.choose() == "chain"
    chosen = run(arb, 140, {"chain": (30, 0.010), "wide": (28, 0.008)})  # warm: 3000 vs 3500 tokens/s
    first_retry = chosen.index("wide")
    assert first_retry < 66
    assert chosen[first_retry + 2 :].count("chain") <= 2  # switched at once, chain only re-tried since
    assert arb.tokens_per_s["wide"] == pytest.approx(3500)


def test_the_first_steps_of_an_estimate_weigh_alike():
    """During the warm-up an estimate is the plain mean of its steps, not an EMA anchored on the first
    (with decay 0.9 the first of 8 steps kept 43% of the weight)."""
    arb = ThroughputArbiter(("chain",), warmup_steps=8)
    for tokens in (10, 2, 2, 2, 2, 2, 2, 2):
        arb.observe("chain", tokens, 0.01)
    assert arb.tokens_per_s["chain"] == pytest.approx(300)  # mean of 1000 and seven 200s


def test_idle_gaps_are_not_steps():
    arb = ThroughputArbiter(("chain",), warmup_steps=2)
    for _ in range(4):
        arb.observe("chain", 2, 0.004)
    arb.observe("chain", 2, 5.0)  # the engine waited for the next generate() call
    assert arb.step_s["chain"] == pytest.approx(0.004)
    arb.observe("chain", 0, 0.004)  # nothing committed (all prefill chunks): no information
    assert arb.samples["chain"] == 4


def test_off_wins_when_no_draft_layout_pays_and_losers_are_retried_in_turn():
    arb = ThroughputArbiter(("chain", "wide", "off"), explore_every=32, explore_steps=2, warmup_steps=4)
    # a busy batch on a compute-bound CPU: plain decoding serves the most tokens per second
    chosen = run(arb, 12 + 640, {"off": (32, 0.009), "chain": (60, 0.020), "wide": (64, 0.040)})
    steady = chosen[12:]
    assert steady.count("off") > 0.85 * len(steady)
    assert steady.count("chain") > 0 and steady.count("wide") > 0  # both still re-tried
    for modes in ((), ("chain", "chain")):
        with pytest.raises(ValueError, match="distinct names"):
            ThroughputArbiter(modes)


def test_a_decisive_loser_is_retried_ever_more_rarely_and_a_close_one_as_before():
    """Back-off (the drafter's busy-batch guard): "off" at half of drafting's tokens/s is re-tried after 64,
    128, 256, 512, 512 ... steps and its warm-up ends after 4 steps; a loser within ``decisive`` keeps
    its re-try every 64 steps."""
    arb = ThroughputArbiter(("chain", "off"), explore_every=64, explore_steps=2, warmup_steps=8, max_explore_every=512)
    chosen = run(arb, 2000, {"chain": (60, 0.020), "off": (32, 0.0213)})  # 3000 vs 1500 tokens/s
    assert chosen[:8].count("off") == 4 and chosen[8:16].count("off") == 0  # decided after 4 steps each
    retries = [i for i in range(8, len(chosen)) if chosen[i] == "off" and chosen[i - 1] != "off"]
    gaps = [b - a for a, b in zip(retries, retries[1:])]
    assert gaps[:3] == pytest.approx([128, 256, 512], abs=4) and all(g == pytest.approx(512, abs=4) for g in gaps[3:])
    assert arb.summary()["off"]["retry_every_steps"] == 512

    close = ThroughputArbiter(("chain", "off"), explore_every=64, explore_steps=2, warmup_steps=8, max_explore_every=512)
    chosen = run(close, 2000, {"chain": (60, 0.020), "off": (32, 0.0120)})  # 3000 vs 2667 tokens/s
    assert chosen[:16].count("off") == 8  # the full warm-up: not decided early
    assert chosen[16:].count("off") == pytest.approx(len(chosen[16:]) * 2 / 64, abs=4)


def test_a_backed_off_loser_that_becomes_faster_still_wins():
    """Backing off delays noticing a change (up to ``max_explore_every`` steps) but never prevents it."""
    arb = ThroughputArbiter(("chain", "off"), explore_every=64, explore_steps=2, warmup_steps=8, max_explore_every=512)
    run(arb, 1200, {"chain": (60, 0.020), "off": (32, 0.0213)})
    assert arb.choose() == "chain"
    chosen = run(arb, 1200, {"chain": (60, 0.020), "off": (32, 0.008)})  # drafting stopped paying: 4000 tokens/s
    first = chosen.index("off")
    assert first <= 512 and chosen[first + 2 :].count("chain") <= len(chosen) * 2 / 64 + 4
