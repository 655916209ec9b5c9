"""Estimates and comparisons over seed replicas: the statistics behind every table's CI and verdict.

Confidence intervals are percentile bootstraps (scipy.stats.bootstrap, 10 000 resamples, a fixed
seed so that tables regenerate byte-identically); BCa is not used because it degenerates at n = 3.
A comparison never ranks a setting run with one seed. Times to target of replicas that missed the
target are right-censored (their true time is more than their whole run) and are handled so that
the censoring cannot overturn a verdict (`compare_to_target`): even a setting that never reached
the target is called slower only if its whole runs were already longer than the baseline's times.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

LEVEL = 0.95
RESAMPLES = 10_000
SEED = 35
NOT_TESTED = "one seed: not tested"
SAME = "not distinguishable at 95%"
CENSORED = "not distinguishable (censored)"
WORDS = {"metric": ("better", "worse"), "time": ("faster", "slower"), "floats": ("fewer floats", "more floats")}

CI_SENTENCE = ("95% CI: percentile bootstrap of the mean over seeds (scipy.stats.bootstrap, 10 000 resamples, "
               "fixed seed); one seed has no CI.")
VERDICT_SENTENCE = ("Verdict: a two-sample bootstrap 95% CI of the difference of means (metrics) or of the ratio "
                    "baseline / setting (times) over seeds; 'better'/'faster' only when it excludes 0 (1), "
                    "'one seed: not tested' when either side has one seed; P = probability of improvement "
                    "(Mann-Whitney U / (n·m), ties half); times of replicas that missed the target count as "
                    "their whole run, and a verdict they could overturn reads 'not distinguishable (censored)'.")


def finite(values) -> np.ndarray:
    """The finite values of a sequence (None and NaN dropped), as floats."""
    a = np.array([np.nan if v is None else v for v in values], dtype=float)
    return a[np.isfinite(a)]


def iqm(values) -> float:
    """Interquartile mean (mean of the middle 50%), rliable's robust point estimate."""
    v = finite(values)
    return float(sps.trim_mean(v, 0.25)) if len(v) else math.nan


def _iqm_axis(x, axis=-1):
    return sps.trim_mean(x, 0.25, axis=axis)


def _boot(samples: tuple, statistic) -> tuple[float, float]:
    """Percentile-bootstrap 95% CI of `statistic` over independent samples (seeds)."""
    r = sps.bootstrap(samples, statistic, n_resamples=RESAMPLES, method="percentile", paired=False,
                      confidence_level=LEVEL, random_state=SEED, vectorized=True)
    return float(r.confidence_interval.low), float(r.confidence_interval.high)


@dataclass(frozen=True)
class Estimate:
    """A point estimate over n replicas with its 95% CI (NaN bounds when n < 2)."""
    point: float
    lo: float
    hi: float
    n: int

    @property
    def has_ci(self) -> bool:
        return self.n > 1 and math.isfinite(self.lo)

    def text(self, fmt=lambda x: f"{x:.3g}") -> str:
        """"61.2 [55.0, 63.1]" (one seed: the value alone; none: "—")."""
        if not self.n:
            return "—"
        return fmt(self.point) + (f" [{fmt(self.lo)}, {fmt(self.hi)}]" if self.has_ci else "")


def estimate(values, statistic: str = "mean") -> Estimate:
    """Mean (or IQM) of the finite values with a percentile-bootstrap 95% CI; no CI for one value."""
    v = finite(values)
    if not len(v):
        return Estimate(math.nan, math.nan, math.nan, 0)
    fn = np.mean if statistic == "mean" else _iqm_axis
    point = float(fn(v))
    if len(v) == 1:
        return Estimate(point, math.nan, math.nan, 1)
    return Estimate(point, *_boot((v,), fn), len(v))


def column_mean(matrix: np.ndarray) -> np.ndarray:
    """Mean of each column of a replicas x points matrix, ignoring NaN (NaN where a column has none)."""
    m = np.asarray(matrix, dtype=float)
    ok = np.isfinite(m)
    count = ok.sum(axis=0)
    return np.where(count > 0, np.where(ok, m, 0.0).sum(axis=0) / np.maximum(count, 1), np.nan)


def band(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and 95% CI (as `estimate`) of each column of a replicas x points matrix, ignoring NaN;
    the bounds are NaN where a column has fewer than two values."""
    m = np.asarray(matrix, dtype=float)
    ok = np.isfinite(m)
    count = ok.sum(axis=0)
    mean = column_mean(m)
    lo, hi = np.full(m.shape[1], np.nan), np.full(m.shape[1], np.nan)
    for pattern in {tuple(c) for c in ok.T[count > 1]}:   # columns with the same replicas present
        cols = np.flatnonzero((ok.T == pattern).all(axis=1))
        rows = np.flatnonzero(pattern)
        r = sps.bootstrap((m[np.ix_(rows, cols)],), np.mean, axis=0, n_resamples=RESAMPLES, method="percentile",
                          confidence_level=LEVEL, random_state=SEED, vectorized=True, batch=1000)
        lo[cols], hi[cols] = r.confidence_interval.low, r.confidence_interval.high
    return mean, lo, hi


def ratio_estimate(num, den, statistic=np.mean) -> Estimate:
    """statistic(num) / statistic(den) with a two-sample percentile-bootstrap 95% CI (n = the smaller
    sample; no CI unless both have two values), e.g. a speedup over repeated timings."""
    a, b = finite(num), finite(den)
    if not len(a) or not len(b):
        return Estimate(math.nan, math.nan, math.nan, 0)
    point = float(statistic(a) / statistic(b))
    n = min(len(a), len(b))
    if n < 2:
        return Estimate(point, math.nan, math.nan, n)
    return Estimate(point, *_boot((a, b), lambda x, y, axis=-1: statistic(x, axis=axis) / statistic(y, axis=axis)), n)


def prob_improvement(setting, baseline, higher_is_better: bool) -> float:
    """P(a random replica of `setting` beats one of `baseline`), ties half: Mann-Whitney U / (n·m)."""
    s, b = finite(setting), finite(baseline)
    u = sps.mannwhitneyu(s, b).statistic if higher_is_better else sps.mannwhitneyu(b, s).statistic
    return float(u) / (len(s) * len(b))


@dataclass(frozen=True)
class Comparison:
    """A setting against a baseline: effect (setting − baseline, or baseline / setting for costs),
    its 95% CI, the probability of improvement and the verdict."""
    kind: str               # "difference" or "ratio"
    point: float
    lo: float
    hi: float
    p_improve: float | None
    verdict: str
    n: int                  # replicas of the setting
    m: int                  # replicas of the baseline

    def text(self, fmt=None) -> str:
        """"better (+2.1 [+0.5, +3.3], P 0.89)"; a one-seed or never-reached verdict alone."""
        if not math.isfinite(self.lo):
            return self.verdict
        if fmt is None:
            fmt = (lambda x: f"{x:.3g}x") if self.kind == "ratio" else (lambda x: f"{x:+.3g}")
        p = f", P {self.p_improve:.2f}" if self.p_improve is not None else ""
        return f"{self.verdict} ({fmt(self.point)} [{fmt(self.lo)}, {fmt(self.hi)}]{p})"


def _diff(a, b, axis=-1):
    return np.mean(a, axis=axis) - np.mean(b, axis=axis)


def _ratio(a, b, axis=-1):
    """baseline / setting for (setting, baseline) samples; a non-positive mean gives inf or NaN."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.mean(b, axis=axis) / np.mean(a, axis=axis)


def _untested(kind: str, n: int, m: int, verdict: str = NOT_TESTED) -> Comparison:
    return Comparison(kind, math.nan, math.nan, math.nan, None, verdict, n, m)


def compare(setting, baseline, higher_is_better: bool = True, cost: str | None = None) -> Comparison:
    """A setting's replicas against a baseline's: the CI of the difference of means (a metric,
    `cost` None) or of the ratio baseline / setting (`cost` "time" or "floats": lower is better),
    a two-sample bootstrap over seeds; the verdict names a side only when the CI excludes 0 (1)."""
    s, b = finite(setting), finite(baseline)
    kind = "difference" if cost is None else "ratio"
    if len(s) < 2 or len(b) < 2:
        return _untested(kind, len(s), len(b))
    stat = _diff if cost is None else _ratio
    lo, hi = _boot((s, b), stat)
    point = float(stat(s, b))
    null = 0.0 if cost is None else 1.0
    good, bad = WORDS[cost or "metric"]
    up = cost is not None or higher_is_better          # is a larger effect an improvement?
    verdict = SAME if lo <= null <= hi or not (math.isfinite(lo) and math.isfinite(hi)) else (
        good if (lo > null) == up else bad)
    return Comparison(kind, point, lo, hi, prob_improvement(s, b, higher_is_better if cost is None else False),
                      verdict, len(s), len(b))


@dataclass(frozen=True)
class Censored:
    """Times to target of a setting's replicas: `values[i]` is the time at the target when
    `reached[i]`, else the replica's whole run (a lower bound of its time)."""
    values: tuple[float, ...]
    reached: tuple[bool, ...]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def k(self) -> int:
        return sum(self.reached)

    def text(self) -> str:
        return f"{self.k} of {self.n} reached"


def compare_to_target(setting: Censored, baseline: Censored, cost: str = "time") -> Comparison:
    """`compare` for right-censored times to target. All reached: the ratio CI. Otherwise whole
    runs stand in for the missed times (lower bounds) and a verdict stands only if longer missed
    times could not overturn it: the side with misses must come out the slower one. A side that
    never reached while the other always did is named so ("slower (never reached)")."""
    good, bad = WORDS[cost]
    if setting.n < 2 or baseline.n < 2:
        return _untested("ratio", setting.n, baseline.n)
    if setting.k == setting.n and baseline.k == baseline.n:
        return compare(setting.values, baseline.values, cost=cost)
    if setting.k == 0 and baseline.k == 0:
        return _untested("ratio", setting.n, baseline.n, "not distinguishable (neither reached)")
    c = compare(setting.values, baseline.values, cost=cost)
    stands = (c.verdict == good and setting.k == setting.n) or (c.verdict == bad and baseline.k == baseline.n)
    verdict = c.verdict if stands else CENSORED
    if stands and (setting.k == 0 or baseline.k == 0):
        verdict += " (never reached)" if setting.k == 0 else " (baseline never reached)"
    return Comparison(c.kind, c.point, c.lo, c.hi, None, verdict, c.n, c.m)
