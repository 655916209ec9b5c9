"""A setting's figures of merit over its seed replicas, and its verdicts against a baseline.

Figures of merit (each a point, a 95% CI and n, plots/stats.py): final metric, mean of the last k
evaluations (a headline less noisy than one evaluation), steps / floats / modelled seconds to the
target with how many replicas reached it, and floats sent per worker over the whole run. Verdicts
compare the last-k mean and the modelled seconds to target with a baseline's (Dense, or the
reference setting the static table compares with).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from plots.labels import fmt_delta, fmt_num
from plots.load import Hit, Run
from plots.settings import Context, Group
from plots.stats import Censored, Comparison, Estimate, compare, compare_to_target, estimate

LAST_K = 3


def mean_of(v: list[float]) -> float:
    v = [x for x in v if x is not None and math.isfinite(x)]
    return statistics.fmean(v) if v else math.nan


def sd_of(v: list[float]) -> float:
    v = [x for x in v if x is not None and math.isfinite(x)]
    return statistics.stdev(v) if len(v) > 1 else math.nan


# ----------------------------------------------------------------------------------------------
# to target

@dataclass
class ToTarget:
    """A setting's cumulative figures at the target, over its replicas."""
    group: Group
    hits: list[Hit] = field(default_factory=list)       # replicas that reached the target
    totals: list[Hit] = field(default_factory=list)     # every replica's whole run
    pairs: list[tuple[Hit | None, Hit]] = field(default_factory=list)   # (hit or None, whole run) per replica

    @property
    def n(self) -> int:
        return self.group.n

    @property
    def reached(self) -> int:
        return len(self.hits)

    def values(self, f: str) -> list[float]:
        return [float(getattr(h, f)) for h in self.hits]

    def mean(self, f: str) -> float:
        return mean_of(self.values(f))

    def sd(self, f: str) -> float:
        return sd_of(self.values(f))

    def estimate(self, f: str) -> Estimate:
        """Mean and 95% CI over the replicas that reached the target (say so where k < n)."""
        return estimate(self.values(f))

    def total_mean(self, f: str) -> float:
        return mean_of([float(getattr(h, f)) for h in self.totals])

    def censored(self, f: str) -> Censored:
        """Each replica's value at the target, or its whole run's (a lower bound) when it missed."""
        return Censored(tuple(float(getattr(h or tot, f)) for h, tot in self.pairs),
                        tuple(h is not None for h, _ in self.pairs))

    def reached_text(self) -> str:
        return f"{self.reached} of {self.n}"

    def cell(self, f: str, fmt=fmt_num) -> str:
        """"4.17e11 [4.1e11, 4.2e11]", "… (mean of the 2 that reached)" or "not reached (whole run 1.2e9)"."""
        if not self.reached:
            tot = self.total_mean(f)
            return "not reached" + (f" (whole run {fmt(tot)})" if math.isfinite(tot) else "")
        s = self.estimate(f).text(fmt)
        if self.reached < self.n:
            s += f" (mean of the {self.reached} that reached)" if self.reached > 1 else " (the 1 that reached)"
        return s


def to_target(group: Group, target: float | None) -> ToTarget:
    out = ToTarget(group)
    for run in group.runs:
        tot = run.totals()
        hit = run.first_hit(target)
        if tot is not None:
            out.totals.append(tot)
            out.pairs.append((hit, tot))
        if hit is not None:
            out.hits.append(hit)
    return out


# ----------------------------------------------------------------------------------------------
# figures of merit

def last_k_mean(run: Run, k: int = LAST_K) -> float:
    """Mean metric of the run's last k evaluations (all of them when it has fewer)."""
    _, m = run.eval_series()
    return float(m[-k:].mean()) if len(m) else math.nan


@dataclass
class Merit:
    """A setting's figures of merit over its replicas (see the module docstring)."""
    group: Group
    k: int
    final: Estimate
    last_k: Estimate
    floats: Estimate            # floats sent per worker, whole run
    to: ToTarget
    last_k_values: list[float]


def merit(group: Group, target: float | None, k: int = LAST_K) -> Merit:
    """The figures of merit of a setting's replicas at `target`, with last-k means over `k` evaluations."""
    last = [last_k_mean(r, k) for r in group.runs]
    return Merit(group, k, estimate([r.final_metric() for r in group.runs]), estimate(last),
                 estimate([t.floats for t in (r.totals() for r in group.runs) if t is not None]),
                 to_target(group, target), last)


@dataclass
class Verdicts:
    """A setting against one baseline: last-k mean metric and modelled seconds to target."""
    baseline: str
    metric: Comparison
    time: Comparison


def verdicts(setting: Merit, base: Merit, higher_is_better: bool, has_target: bool) -> Verdicts:
    """The setting's last-k mean metric and modelled seconds to target (censored) against the baseline's."""
    metric = compare(setting.last_k_values, base.last_k_values, higher_is_better)
    if has_target:
        time = compare_to_target(setting.to.censored("model_s"), base.to.censored("model_s"))
    else:
        time = Comparison("ratio", math.nan, math.nan, math.nan, None, "no target", setting.to.n, base.to.n)
    return Verdicts(base.group.label, metric, time)


def baselines(ctx: Context, reference: str | None) -> list[Group]:
    """The groups a context's settings are judged against: Dense, then `reference` (e.g. Top-k 10x)."""
    out = [g for g in ctx.groups if g.method == "dense"][:1]
    ref = ctx.find(reference) if reference else None
    if ref is not None and ref not in out:
        out.append(ref)
    return out


def against_baselines(ctx: Context, merits: dict[Group, Merit], g: Group,
                      reference: str | None) -> list[tuple[Group, Verdicts | None]]:
    """(baseline, g's verdicts against it) for each of the context's baselines; None where g is it."""
    return [(b, None if b is g else verdicts(merits[g], merits[b], ctx.higher_is_better, ctx.target is not None))
            for b in baselines(ctx, reference)]


def verdict_texts(v: Verdicts | None, metric: str) -> list[str]:
    """Two Markdown cells: the last-k verdict (difference in the metric's units) and the time verdict
    ("baseline" twice in the baseline's own row)."""
    if v is None:
        return ["baseline", "baseline"]
    return [v.metric.text(lambda x: fmt_delta(x, metric)), v.time.text()]


def verdict_columns(prefix: str) -> list[str]:
    """CSV columns of `verdict_row`: the baseline, then effect, CI bounds, P and verdict for each test."""
    return [f"{prefix}_baseline"] + [f"{prefix}_{what}_{c}" for what, first in (("metric", "diff"), ("time", "ratio"))
                                     for c in (first, f"{first}_lo", f"{first}_hi", "p_improve", "verdict")]


def verdict_row(prefix: str, v: Verdicts | None) -> dict:
    """CSV cells of `verdict_columns(prefix)` (empty without a baseline)."""
    if v is None:
        return {}
    row = {f"{prefix}_baseline": v.baseline}
    for what, first, c in (("metric", "diff", v.metric), ("time", "ratio", v.time)):
        for col, x in ((first, c.point), (f"{first}_lo", c.lo), (f"{first}_hi", c.hi), ("p_improve", c.p_improve)):
            row[f"{prefix}_{what}_{col}"] = x if x is not None and math.isfinite(x) else None
        row[f"{prefix}_{what}_verdict"] = c.verdict
    return row


# the figures of merit by CSV name
MERIT_FIELDS = (("final_metric", lambda m: m.final), ("last_k_metric", lambda m: m.last_k),
                ("floats_per_worker", lambda m: m.floats), ("steps_to_target", lambda m: m.to.estimate("step")),
                ("floats_to_target", lambda m: m.to.estimate("floats")),
                ("model_s_to_target", lambda m: m.to.estimate("model_s")))


def merit_columns() -> list[str]:
    """CSV columns of `merit_row`: every figure of merit as point, CI bounds and n."""
    return ["last_k"] + [f"{name}_{c}" for name, _ in MERIT_FIELDS for c in ("mean", "lo", "hi", "n")]


def merit_row(m: Merit) -> dict:
    """CSV cells of `merit_columns()` for one setting."""
    row = {"last_k": m.k}
    for name, get in MERIT_FIELDS:
        e = get(m)
        for col, x in (("mean", e.point), ("lo", e.lo), ("hi", e.hi)):
            row[f"{name}_{col}"] = x if math.isfinite(x) else None
        row[f"{name}_n"] = e.n
    return row
