"""Unit tests of the detectors: calibration (false-alarm rate on null data within budget) and power."""

import numpy as np
import pytest

from quality_sidecar.detectors import (
    BernoulliCUSUM,
    GaussianCUSUM,
    PairedExactMatch,
    finish_reason_test,
    first_divergence,
    holm,
    length_test,
    linear_mmd_test,
    rate_test,
    text_mmd_test,
)
from quality_sidecar.detectors.cusum import lindley

pytestmark = pytest.mark.unit


def test_lindley_matches_the_recursion():
    rng = np.random.default_rng(0)
    x = rng.normal(-0.1, 1, 500)
    s, ref = 3.0, []
    for v in x:
        s = max(0.0, s + v)
        ref.append(s)
    assert np.allclose(lindley(x, 3.0), ref)


@pytest.mark.parametrize("p0", [0.005, 0.03])
def test_bernoulli_cusum_false_alarm_rate_within_budget(p0):
    ert = 20_000
    c = BernoulliCUSUM("r", ert=ert, p0=p0, restart_after_alarm=True)
    n = 2_000_000
    c.update(np.random.default_rng(1).random(n) < p0)
    expected = n / ert
    # Within a factor 2 of the budget (simulation + extrapolation error), never far above it.
    assert c.alarms_ <= 2 * expected, (c.alarms_, expected)
    assert c.alarms_ >= expected / 4, "threshold far too conservative: calibration broken"


def test_gaussian_cusum_false_alarm_rate_and_power():
    rng = np.random.default_rng(2)
    ert = 20_000
    g = GaussianCUSUM("acc", ert=ert, direction="down", shift=0.5, restart_after_alarm=True).fit(rng.beta(6, 4, 5000))
    g.update(rng.beta(6, 4, 1_000_000))
    assert g.alarms_ <= 2 * 1_000_000 / ert
    g2 = GaussianCUSUM("acc", ert=1e6, direction="down").fit(rng.beta(6, 4, 2000))
    r = g2.update(rng.beta(6, 4, 3000) * 0.8)
    assert r.alarm and r.alarm_index < 300


def test_bernoulli_cusum_detects_a_rate_increase_and_latches():
    rng = np.random.default_rng(3)
    c = BernoulliCUSUM("refusal", ert=1e6, delta=0.02).fit(rng.random(2000) < 0.005)
    r = c.update(rng.random(4000) < 0.045)
    assert r.alarm and r.alarm_new and r.alarm_index < 1500
    r2 = c.update(rng.random(10) < 0.0)
    assert r2.alarm and not r2.alarm_new


def test_two_sample_tests_are_calibrated_under_the_null():
    rng = np.random.default_rng(4)
    ps = []
    for _ in range(200):
        a = rng.lognormal(4.5, 0.6, 300).astype(int)
        b = rng.lognormal(4.5, 0.6, 300).astype(int)
        ps.append(length_test(a, b).pvalue)
    assert np.mean(np.array(ps) < 0.05) <= 0.09
    shifted = length_test(rng.lognormal(4.5, 0.6, 500).astype(int), (rng.lognormal(4.5, 0.6, 500) * 1.25).astype(int))
    assert shifted.pvalue < 1e-3
    fisher_null = [rate_test(rng.random(500) < 0.02, rng.random(500) < 0.02).pvalue for _ in range(200)]
    assert np.mean(np.array(fisher_null) < 0.05) <= 0.07


def test_text_mmd_tests():
    rng = np.random.default_rng(5)
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]

    def texts(n, ws):
        return [" ".join(rng.choice(ws, 12)) for _ in range(n)]

    null = text_mmd_test(texts(80, words), texts(80, words), n_permutations=100)
    alt = text_mmd_test(texts(80, words), texts(80, words[:4] + ["loop"] * 4), n_permutations=100)
    assert null.pvalue > 0.01 and alt.pvalue <= 0.02
    lin_null = [linear_mmd_test(texts(200, words), texts(200, words)).pvalue for _ in range(15)]
    assert np.mean(np.array(lin_null) < 0.05) <= 0.2
    assert linear_mmd_test(texts(400, words), texts(400, ["loop", "loop", "x"])).pvalue < 1e-4


def test_holm():
    assert np.allclose(holm([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06])


def test_paired_exact_match_divergence_positions_against_the_measured_aa_rate():
    rng = np.random.default_rng(6)
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    det = PairedExactMatch(ert=1e6, block=200)
    ids = [list(rng.integers(0, 4096, 50)) for _ in range(3000)]
    r = det.update([(x, x) for x in ids], "replay")
    assert not r.alarm and r.extra["verdict"] == "pending"  # no A/A pairs yet: no verdict at all
    det.add_aa([False] * 1000, "replay")
    corrupt = [(x[:10] + [x[10] + 1] + x[11:], x) if rng.random() < 0.03 else (x, x) for x in ids]
    r = det.update(corrupt, "replay")
    assert r.alarm and r.extra["top_divergence_positions"][0][0] == 10


def _capped_lengths(rng, n):
    """Lengths like the issue-13 real streams: geometric stop times capped at max_tokens = 32, so
    ~86% of outputs are tied at the cap and the rest are tied integers too."""
    return np.minimum(rng.geometric(0.0047, n), 32)


def test_length_test_is_not_anti_conservative_with_ties_and_a_cap():
    """At alpha = 1e-3, unequal windows (600 baseline vs 1000 candidate, as ArmComparison allows),
    4,000 null rounds: the expected count is 4, and more than 12 has probability < 0.001 for a valid
    test.  scipy's Cramer-von Mises (the old length test) rejects in nearly every round here."""
    from scipy.stats import cramervonmises_2samp

    rng = np.random.default_rng(13)
    alpha, rounds = 1e-3, 4000
    hits = cvm_hits = 0
    for i in range(rounds):
        a, b = _capped_lengths(rng, 600), _capped_lengths(rng, 1000)
        hits += length_test(a, b).pvalue < alpha
        if i < 50:  # the old test, for contrast: a handful of rounds are enough to see it fail
            cvm_hits += cramervonmises_2samp(a, b).pvalue < alpha
    assert np.mean(_capped_lengths(rng, 10_000) == 32) > 0.8
    assert hits <= 12, f"{hits} false alarms in {rounds} rounds at alpha={alpha}"
    assert cvm_hits >= 40  # the check above is one that the old length test fails


def test_length_test_matches_scipy_and_has_power():
    from scipy.stats import mannwhitneyu

    rng = np.random.default_rng(14)
    a, b = _capped_lengths(rng, 700), _capped_lengths(rng, 900)
    ref = mannwhitneyu(a, b, use_continuity=False, method="asymptotic").pvalue
    assert abs(length_test(a, b).pvalue - ref) < 1e-12
    shorter = np.minimum(rng.geometric(0.008, 1000), 32)  # cap share 86% -> 77%
    assert length_test(_capped_lengths(rng, 1000), shorter).pvalue < 1e-5
    assert length_test([5, 5, 5], [5, 5, 5, 5]).pvalue == 1.0  # all tied: no evidence, no division by 0
    with pytest.raises(ValueError, match="method"):
        length_test(a, b, method="cvm")


def test_permutation_length_test_is_valid_at_005_and_detects_a_mean_shift():
    """Add-one Monte-Carlo permutation p-values are valid for any data; checked on capped, tied
    lengths with unequal sizes (300 null rounds at alpha 0.05: a valid test gives <= 27 with
    probability > 0.999)."""
    rng = np.random.default_rng(15)
    ps = [length_test(_capped_lengths(rng, 150), _capped_lengths(rng, 250), method="permutation",
                      n_permutations=199, seed=i).pvalue for i in range(300)]
    assert np.mean(np.array(ps) < 0.05) <= 27 / 300
    r = length_test(_capped_lengths(rng, 800), np.minimum(rng.geometric(0.01, 800), 32), method="permutation",
                    n_permutations=999)
    assert r.pvalue == 1 / 1000 and r.statistic < 0  # mean length fell; smallest possible p-value


def test_finish_reason_test_merges_sparse_categories_and_is_exact_on_two():
    rng = np.random.default_rng(16)
    reasons = np.array(["length", "stop", "abort", "error"])
    probs = [0.86, 0.138, 0.001, 0.001]
    ps = [finish_reason_test(rng.choice(reasons, 600, p=probs), rng.choice(reasons, 1000, p=probs)).pvalue
          for _ in range(400)]
    # Rare abort/error cells (expected < 5) are outside chi-square's approximation. Merged (Fisher on two
    # columns) the rate must stay at alpha; 400 rounds at 0.01 give <= 8 with probability > 0.999.
    assert np.mean(np.array(ps) < 0.01) <= 0.02
    r = finish_reason_test(["length"] * 90 + ["stop"] * 10, ["length"] * 70 + ["stop"] * 30)
    assert r.detail.startswith("Fisher") and r.pvalue < 1e-3
