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
from pathlib import Path

import numpy as np
import pytest

from plots import stats
from plots.stats import Censored, compare, compare_to_target, estimate, prob_improvement
from test_plots import write_run


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
    never = cens((50, False), (50, False), (50, False))     # whole runs of 50 s, longer than 20-22 s
    assert compare_to_target(never, ALL).verdict == "slower (never reached)"
    assert compare_to_target(ALL, never).verdict == "faster (baseline never reached)"
    assert compare_to_target(never, never).verdict == "not distinguishable (neither reached)"
    assert compare_to_target(cens((5, True), (6, True), (7, True)), never, "floats").verdict == \
        "fewer floats (baseline never reached)"
    assert never.text() == "0 of 3 reached"
    # runs of 5-7 s that never reached: each could still have reached at, say, 8 s, before 20 s
    short = cens((5, False), (6, False), (7, False))
    assert compare_to_target(short, ALL).verdict == "not distinguishable (censored)"
    assert compare_to_target(ALL, short).verdict == "not distinguishable (censored)"


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


# ------------------------------------------------------------------------------------------------
# tables: figures of merit and verdict columns on hand-made replicas

def verdict_runs(root: Path) -> Path:
    """Dense x3 (modelled 1 s/step, reaches 0.6 at step 6 = 6 s), Top-k 10x x3 (0.5 s/step; reaches
    at step 8 = 4 s, at step 6 = 3 s, never: whole run 5 s), Top-k 100x x3 (never)."""
    exp = root / "runs" / "fixture"
    for s, last in enumerate((0.85, 0.86, 0.87)):
        write_run(exp, f"dense-s{s}", "dense", "none", 100.0, [1000.0] * 10, [.2, .4, .6, .8, last], 1.0, 0.5, seed=s)
    for s, m in enumerate(([.1, .3, .5, .6, .7], [.1, .3, .6, .65, .7], [.1, .3, .5, .5, .55])):
        write_run(exp, f"topk10-s{s}", "static", "topk", 10.0, [100.0] * 10, m, 0.5, 0.4, seed=s)
    for s in range(3):
        write_run(exp, f"topk100-s{s}", "static", "topk", 100.0, [10.0] * 10, [.1, .2, .3, .4, .5 + s / 100], 0.3,
                  0.25, seed=s)
    return root / "runs"


@pytest.fixture
def verdict_ctx(tmp_path):
    from plots.load import find_runs, load_run
    from plots.settings import build_contexts
    (ctx,) = build_contexts([load_run(d) for d in find_runs([str(verdict_runs(tmp_path))])[0]])
    return ctx


def test_static_table_gives_each_setting_its_cis_and_verdicts(verdict_ctx):
    """Last-3 means: Dense 0.75, 0.7533, 0.7567; Top-k 10x 0.6, 0.65, 0.5167 (all below Dense's:
    fact (2), worse, P 0). Modelled s to target: Dense 6, 6, 6; Top-k 10x 4, 3 and a miss with whole
    run 5: looks faster (every resampled ratio 6 / [3..5] > 1) but has a miss, so 'censored'."""
    from plots.tables import static_table
    text, rows, _ = static_table([verdict_ctx], "Top-k 10x")
    r = {x["setting"]: x for x in rows}
    top = r["Top-k 10x"]
    assert top["last_k"] == 3 and top["last_k_metric_n"] == 3
    assert top["last_k_metric_mean"] == pytest.approx((0.6 + 0.65 + (0.5 + 0.5 + 0.55) / 3) / 3)
    assert (top["last_k_metric_lo"], top["last_k_metric_hi"]) == (pytest.approx(1.55 / 3), pytest.approx(0.65))
    assert top["model_s_to_target_mean"] == pytest.approx(3.5) and top["model_s_to_target_n"] == 2
    assert top["reached"] == 2 and top["floats_per_worker_mean"] == pytest.approx(1000)
    assert top["vs_dense_baseline"] == "Dense"
    assert (top["vs_dense_metric_verdict"], top["vs_dense_metric_p_improve"]) == ("worse", 0.0)
    assert top["vs_dense_metric_diff_hi"] < 0
    assert top["vs_dense_time_verdict"] == "not distinguishable (censored)" and top["vs_dense_time_ratio_lo"] > 1
    assert "vs_reference_metric_verdict" not in top              # it is the reference
    dense = r["Dense"]
    assert (dense["vs_reference_metric_verdict"], dense["vs_reference_metric_p_improve"]) == ("better", 1.0)
    # Dense slower than Top-k 10x's lower bounds, but Top-k's miss may be far longer: censored
    assert dense["vs_reference_time_verdict"] == "not distinguishable (censored)"
    never = r["Top-k 100x"]       # never reached, but its whole runs (3 s) are shorter than Dense's 6 s
    assert never["vs_dense_time_verdict"] == "not distinguishable (censored)" and never["reached"] == 0
    assert never["vs_reference_time_verdict"] == "not distinguishable (censored)"
    md = text.split("\n")
    line = next(x for x in md if x.startswith("| Top-k 10x |")).split(" | ")
    head = next(x for x in md if x.startswith("| Setting |")).split(" | ")
    cell = dict(zip(head, line))
    assert cell["Reached"] == "2 of 3" and cell["Modelled s to target"] == "3.5 [3, 4] (mean of the 2 that reached)"
    assert cell["vs Dense: last-3 mean"].startswith("worse (-") and "P 0.00" in cell["vs Dense: last-3 mean"]
    assert cell["vs Dense: modelled s to target"].startswith("not distinguishable (censored) (")
    assert stats.CI_SENTENCE in text and stats.VERDICT_SENTENCE in text


def test_last_k_is_configurable(verdict_ctx):
    from plots.tables import static_table
    _, rows, _ = static_table([verdict_ctx], "Top-k 10x", last_k=1)
    top = next(x for x in rows if x["setting"] == "Top-k 10x")
    assert top["last_k"] == 1 and top["last_k_metric_mean"] == pytest.approx((0.7 + 0.7 + 0.55) / 3)


def test_savings_table_has_gravacs_verdicts(tmp_path):
    from plots.load import find_runs, load_run
    from plots.settings import build_contexts
    from plots.tables import SAVINGS_COLUMNS, savings_table
    runs = verdict_runs(tmp_path)
    for s in range(3):   # GraVAC: 0.6 s/step, reaches at step 6 = 3.6 s; last-3 mean 0.7 + s/100
        write_run(runs / "fixture", f"gravac-s{s}", "gravac", "dgc", 100.0, [100.0] * 4 + [10.0] * 6,
                  [.2, .5, .6, .7, .8 + 3 * s / 100], 0.6, 0.3, seed=s)
    (ctx,) = build_contexts([load_run(d) for d in find_runs([str(runs)])[0]])
    text, rows, _ = savings_table([ctx])
    row = next(r for r in rows if r["baseline"] == "Dense")
    assert set(row) <= set(SAVINGS_COLUMNS)
    assert row["gravac_vs_baseline_time_verdict"] == "faster"          # 3.6 s vs 6 s in every seed
    assert row["gravac_vs_baseline_time_ratio"] == pytest.approx(6 / 3.6)
    assert row["gravac_vs_baseline_metric_verdict"] == "worse"         # 0.70-0.72 vs 0.75-0.757
    assert "faster (1.67x [1.67x, 1.67x], P 1.00)" in text


# ------------------------------------------------------------------------------------------------
# figures: the band is the CI over replicas, bars carry error bars

def _band_at(ax, x: float) -> set[float]:
    """The y values of the shaded band's vertices at x."""
    (poly,) = ax.collections
    v = poly.get_paths()[0].vertices
    return {round(float(y), 9) for xx, y in v if xx == x}


def test_figure_band_is_the_ci_of_the_mean_over_seeds(tmp_path):
    """Five seeds at 0.1 ... 0.9 at step 4: the band there is estimate()'s CI (in percent), not the
    min-max range (n = 5: fact (1))."""
    from plots import figures
    from plots.load import find_runs, load_run
    from plots.settings import build_contexts
    exp = tmp_path / "runs"
    at4 = [0.1, 0.2, 0.3, 0.4, 0.9]
    for s, v in enumerate(at4):
        write_run(exp, f"topk-s{s}", "static", "topk", 10.0, [100.0] * 10, [.1, v, .5, .6, .7], 0.5, 0.4, seed=s)
    (ctx,) = build_contexts([load_run(d) for d in find_runs([str(exp)])[0]])
    fig = figures.metric_vs_steps_figure(ctx)
    e = estimate(at4)
    assert _band_at(fig.axes[0], 4.0) == {round(100 * e.lo, 9), round(100 * e.hi, 9)}
    assert 10 < 100 * e.lo and 100 * e.hi < 90                    # narrower than min-max
    assert "95% CI of the mean over seeds" in fig._suptitle.get_text()
    fig = figures.time_to_accuracy_figure(ctx, "model")             # the same band on the time axis
    assert _band_at(fig.axes[0], 2.0) == {round(100 * e.lo, 9), round(100 * e.hi, 9)}


def test_band_of_a_matrix_skips_missing_values():
    m = np.array([[1.0, 2.0, np.nan], [3.0, 4.0, 5.0], [5.0, 6.0, np.nan]])
    mean, lo, hi = stats.band(m)
    assert list(mean) == [3.0, 4.0, 5.0]
    assert (lo[0], hi[0]) == (1.0, 5.0) and (lo[1], hi[1]) == (2.0, 6.0)    # n = 3: [min, max]
    assert math.isnan(lo[2]) and math.isnan(hi[2])                        # one value: no band


def _bars(ax):
    from matplotlib.container import BarContainer
    (bars,) = [c for c in ax.containers if isinstance(c, BarContainer)]
    return bars


def test_bars_carry_ci_error_bars():
    import matplotlib.pyplot as plt
    from plots.figures import ci_bars
    fig, ax = plt.subplots()
    samples = [[1.0, 2.0, 3.0, 4.0, 10.0], [5.0]]
    ests = ci_bars(ax, [0, 1], samples, ["C0", "C1"], 0.6)
    bars = _bars(ax)
    assert [b.get_height() for b in bars] == [4.0, 5.0]
    segs = bars.errorbar.lines[2][0].get_segments()
    assert [tuple(s[:, 1]) for s in segs] == [pytest.approx((ests[0].lo, ests[0].hi)), (5.0, 5.0)]  # none for one value
    assert ests[0] == estimate(samples[0])
    plt.close(fig)


def test_multilevel_bars_get_error_bars_from_repeated_timings(tmp_path):
    from plots import bench, figures
    csv = tmp_path / "bench.csv"
    rows = ["model,compressor,cf,mode,time_s"]
    for t in (0.020, 0.022, 0.018):
        rows += [f"resnet101,topk,1000,direct,{t}", f"resnet101,topk,1000,multilevel,{t / 2}"]
    csv.write_text("\n".join(rows) + "\n")
    (row,) = bench.multilevel_rows(str(csv))
    assert row["speedup"] == pytest.approx(2.0) and sorted(row["direct_all"]) == [0.018, 0.02, 0.022]
    fig = figures.multilevel_figure([row])
    bars = _bars(fig.axes[0])
    assert bars.errorbar is not None and "error bars: 95% CI" in fig._suptitle.get_text()
    one = dict(row, direct_all=[0.02], multi_all=[0.01])
    assert "no error bars" in figures.multilevel_figure([one])._suptitle.get_text()
