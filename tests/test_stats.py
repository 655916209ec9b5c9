"""plots/stats.py and the CIs and verdicts built on it (plots/merit.py, the tables, the figures'
bands), checked against values worked out by hand in the comments.

Two facts the hand computations use. (1) A percentile bootstrap of the mean of n values puts
probability 1/n^n on the resample made only of the smallest value; for n = 2 (1/4) and n = 3
(1/27 = 3.7%) that is more than the 2.5% tail, so the 95% CI is exactly [min, max]; for n = 5
(1/3125) it is narrower. (2) A setting whose every replica beats every baseline replica has every
resampled difference of means on that side too, so the CI excludes 0 whatever the resamples.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from plots import stats
from plots.stats import Censored, compare, compare_to_target, estimate, prob_improvement


# ------------------------------------------------------------------------------------------------
# estimate

def test_estimate_at_three_seeds_is_the_mean_and_the_replica_range():
    e = estimate([0.550, 0.611, 0.615])          # vgg_mini's three Top-k 10x seeds
    assert e.point == pytest.approx((0.550 + 0.611 + 0.615) / 3) and e.n == 3
    assert (e.lo, e.hi) == (0.550, 0.615)         # fact (1)
    assert e.text(lambda x: f"{100 * x:.1f}%") == "59.2% [55.0%, 61.5%]"


def test_estimate_matches_the_exact_bootstrap_distribution_at_n4():
    """Independent check: every one of the 4^4 resamples enumerated, its 2.5% and 97.5% quantiles
    against scipy's 10 000 random resamples (within one step of the distribution, 0.25)."""
    v = [0.0, 1.0, 2.0, 10.0]
    means = sorted(sum(c) / 4 for c in itertools.product(v, repeat=4))
    lo, hi = np.percentile(means, [2.5, 97.5])
    e = estimate(v)
    assert abs(e.lo - lo) <= 0.25 and abs(e.hi - hi) <= 0.25
    assert min(v) < e.lo and e.hi < max(v)


def test_one_seed_has_no_ci_and_none_is_a_dash():
    e = estimate([0.7])
    assert (e.point, e.n, e.has_ci) == (0.7, 1, False) and e.text() == "0.7"
    assert estimate([None, math.nan]).n == 0 and estimate([]).text() == "—"


def test_iqm_is_the_mean_of_the_middle_half():
    assert stats.iqm([1, 2, 3, 4, 100, 5, 6, 7]) == pytest.approx((3 + 4 + 5 + 6) / 4)   # 2 cut at each end
    assert estimate([1, 2, 3, 4, 100, 5, 6, 7], "iqm").point == pytest.approx(4.5)


def test_the_ci_is_seeded_so_it_repeats():
    v = [0.1, 0.4, 0.35, 0.2, 0.9]
    assert estimate(v) == estimate(v) and compare(v, [0.3, 0.5, 0.2]) == compare(v, [0.3, 0.5, 0.2])


# ------------------------------------------------------------------------------------------------
# compare

def test_means_differ_but_the_ci_holds_zero_not_distinguishable():
    """Setting [1, 2, 3] (mean 2) vs baseline [0, 1, 2] (mean 1). A resampled difference is
    1 + (S − B)/3 with S, B sums of three draws from {0, 1, 2}, counts 1 3 6 7 6 3 1 (of 27) for
    0..6. It is ≤ 0 when B − S ≥ 3: (1·17 + 3·10 + 6·4 + 7·1) / 729 = 78/729 = 10.7% > 2.5%, so
    the CI's lower end is below 0."""
    counts = dict(zip(range(7), [1, 3, 6, 7, 6, 3, 1]))
    p_le0 = sum(counts[s] * counts[b] for s in counts for b in counts if b - s >= 3) / 729
    assert p_le0 == pytest.approx(78 / 729)
    c = compare([1.0, 2.0, 3.0], [0.0, 1.0, 2.0])
    assert c.point == pytest.approx(1.0) and c.lo < 0 < c.hi
    assert c.verdict == "not distinguishable at 95%"
    assert c.p_improve == pytest.approx((1 + 0.5 + 0) / 9 + (1 + 1 + 0.5) / 9 + 3 / 9)   # hand count: 7/9


def test_clear_separation_is_better_or_worse():
    c = compare([0.70, 0.71, 0.72], [0.60, 0.61, 0.62])     # fact (2): every difference in [0.08, 0.12]
    assert (c.verdict, c.kind, c.p_improve) == ("better", "difference", 1.0)
    assert 0.08 - 1e-12 <= c.lo < c.point < c.hi <= 0.12 + 1e-12
    assert compare([0.60, 0.61, 0.62], [0.70, 0.71, 0.72]).verdict == "worse"
    ppl = compare([200.0, 201.0, 202.0], [250.0, 251.0, 252.0], higher_is_better=False)   # perplexity
    assert (ppl.verdict, ppl.p_improve) == ("better", 1.0) and ppl.hi <= -48
    assert c.text() == f"better (+0.1 [{c.lo:+.3g}, {c.hi:+.3g}], P 1.00)"


def test_costs_compare_as_a_ratio_baseline_over_setting():
    c = compare([10.0, 11.0, 12.0], [20.0, 21.0, 22.0], cost="time")   # every ratio in [20/12, 22/10]
    assert (c.verdict, c.kind, c.p_improve) == ("faster", "ratio", 1.0)
    assert 20 / 12 - 1e-12 <= c.lo and c.hi <= 2.2 + 1e-12 and c.point == pytest.approx(21 / 11)
    assert compare([20.0, 21.0, 22.0], [10.0, 11.0, 12.0], cost="time").verdict == "slower"
    assert compare([10.0, 11.0], [20.0, 21.0], cost="floats").verdict == "fewer floats"
    assert compare([20.0, 21.0], [10.0, 11.0], cost="floats").verdict == "more floats"


def test_one_seed_is_never_ranked():
    for s, b in (([0.9], [0.1, 0.2, 0.3]), ([0.9, 0.8], [0.1]), ([0.9], [0.1])):
        c = compare(s, b)
        assert c.verdict == "one seed: not tested" and c.p_improve is None and math.isnan(c.lo)
        assert c.text() == "one seed: not tested"
    assert compare([1.0], [5.0, 6.0], cost="time").verdict == "one seed: not tested"


def test_identical_replicas_are_not_distinguishable():
    c = compare([0.5, 0.5, 0.5], [0.5, 0.5, 0.5])
    assert (c.lo, c.hi, c.verdict, c.p_improve) == (0.0, 0.0, "not distinguishable at 95%", 0.5)


def test_probability_of_improvement_counts_pairs_and_half_ties():
    """[3, 4, 5] vs [1, 2, 3]: 3 beats 1 and 2 and ties 3 (2.5), 4 and 5 beat all three (6): 8.5 of 9."""
    assert prob_improvement([3, 4, 5], [1, 2, 3], True) == pytest.approx(8.5 / 9)
    assert prob_improvement([3, 4, 5], [1, 2, 3], False) == pytest.approx(0.5 / 9)   # lower is better
    assert prob_improvement([1, 1], [1, 1, 1], True) == 0.5


# ------------------------------------------------------------------------------------------------
# censored time to target

def cens(*pairs) -> Censored:
    """Censored((time or whole run, reached), ...)."""
    return Censored(tuple(float(v) for v, _ in pairs), tuple(r for _, r in pairs))


ALL = cens((20, True), (21, True), (22, True))


def test_all_reached_is_the_ratio_ci():
    s = cens((10, True), (11, True), (12, True))
    assert compare_to_target(s, ALL) == compare([10, 11, 12], [20, 21, 22], cost="time")
    assert compare_to_target(s, ALL).verdict == "faster" and s.text() == "3 of 3 reached"


def test_never_reached_against_always_reached():
    never = cens((50, False), (50, False), (50, False))
    assert compare_to_target(never, ALL).verdict == "slower (never reached)"
    assert compare_to_target(ALL, never).verdict == "faster (baseline never reached)"
    assert compare_to_target(never, never).verdict == "not distinguishable (neither reached)"
    assert compare_to_target(cens((5, True), (6, True), (7, True)), never, "floats").verdict == \
        "fewer floats (baseline never reached)"
    assert never.text() == "0 of 3 reached"


def test_mixed_censoring_stands_only_where_longer_misses_cannot_overturn_it():
    # the setting missed once and is slower even with its whole run (40) as its time: every
    # resampled ratio ≤ 22/30 < 1; a longer true time only makes it slower -> the verdict stands
    slow = cens((30, True), (31, True), (40, False))
    assert compare_to_target(slow, ALL).verdict == "slower" and slow.text() == "2 of 3 reached"
    # the setting missed once and looks faster (whole run 7): its true time may be far longer
    quick = cens((5, True), (6, True), (7, False))
    c = compare_to_target(quick, ALL)
    assert c.verdict == "not distinguishable (censored)" and c.lo > 1 and c.p_improve is None
    # the baseline missed once: a setting slower than its lower bounds may not be slower ...
    base_missed = cens((5, True), (6, True), (7, False))
    assert compare_to_target(ALL, base_missed).verdict == "not distinguishable (censored)"
    # ... but one faster than them is faster still against the longer true times
    assert compare_to_target(cens((1, True), (1.5, True), (2, True)), base_missed).verdict == "faster"
    # within the noise either way
    assert compare_to_target(cens((19, True), (23, True), (30, False)), ALL).verdict == "not distinguishable (censored)"


def test_one_seed_with_censoring_is_not_tested():
    assert compare_to_target(cens((5, False)), ALL).verdict == "one seed: not tested"
    assert compare_to_target(ALL, cens((5, True))).verdict == "one seed: not tested"
