"""The paper's figures, one function per figure, each returning a matplotlib Figure.

Sized for a paper column (3.5 in wide, text ≥ 7 pt), legends below the axes so they never hide
data. Replicas of a setting are drawn as their mean with a shaded 95% confidence band of the mean
over seeds (plots/stats.py's bootstrap, the tables' CI), as the subtitle says. A function that lacks
the data it needs raises `Skip(reason)`; the command reports the reason and carries on.
"""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

from plots.labels import (METRIC_AXIS, compressor_label, fmt_cf, metric_scale,  # noqa: E402
                          network_text, styles)
from plots.bench import timed_on  # noqa: E402
from plots.load import Run  # noqa: E402
from plots.settings import Context, Group  # noqa: E402
from plots.stats import band, estimate, ratio_estimate  # noqa: E402

WIDTH = 3.5
MAX_POINTS = 3000   # longer series are thinned for drawing (after smoothing)


class Skip(Exception):
    """A figure cannot be made from the data at hand; the message says why."""


def setup_style() -> None:
    plt.rcParams.update({
        "font.size": 7.5, "axes.titlesize": 7.5, "axes.labelsize": 8, "xtick.labelsize": 7,
        "ytick.labelsize": 7, "legend.fontsize": 7, "lines.linewidth": 1.2, "axes.grid": True,
        "grid.alpha": 0.3, "grid.linewidth": 0.5, "axes.linewidth": 0.6, "legend.handlelength": 2.2,
        "pdf.fonttype": 42, "savefig.dpi": 200,
    })


# ----------------------------------------------------------------------------------------------
# helpers

def _new(n_legend: int, height: float = 2.2, nrows: int = 1, sharex: bool = True, label_len: int = 20):
    """A column-wide figure with room below for a legend of `n_legend` entries."""
    ncol = 1 if label_len > 30 else 2
    h = height * nrows ** 0.8 + 0.16 * math.ceil(n_legend / ncol) + 0.35
    fig, axes = plt.subplots(nrows, 1, figsize=(WIDTH, h), sharex=sharex, layout="constrained", squeeze=False)
    return fig, list(axes[:, 0]), ncol


def _legend(fig, handles, labels, ncol: int) -> None:
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncol=ncol, frameon=False,
                   columnspacing=1.0, handletextpad=0.5, borderaxespad=0.2)


def _title(fig, title: str, subtitle: str = "") -> None:
    text = "\n".join(textwrap.wrap(title, 62) + textwrap.wrap(subtitle, 70))
    fig.suptitle(text, fontsize=7, linespacing=1.25)


def _matrix(arrays: list[np.ndarray]) -> np.ndarray:
    n = max((len(a) for a in arrays), default=0)
    m = np.full((len(arrays), n), np.nan)
    for i, a in enumerate(arrays):
        m[i, :len(a)] = a
    return m


def _curve(m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(iteration, mean, CI low, CI high) of a replicas x steps matrix, thinned for drawing first
    so the bootstrap runs only at drawn points; the band is the 95% CI of the mean over seeds."""
    idx = _thin_index(m.shape[1])
    return (idx + 1.0, *band(m[:, idx]))


def _band_note(groups: list[Group]) -> str:
    """The subtitle's word on the shading, when some setting has several seeds."""
    return "shaded: 95% CI of the mean over seeds (bootstrap)" if any(g.n > 1 for g in groups) else ""


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def smooth(x: np.ndarray, w: int) -> np.ndarray:
    """Trailing moving average over `w` points, ignoring NaN (NaN where the window has none)."""
    if w <= 1 or len(x) == 0:
        return x
    ok = np.isfinite(x)
    c = np.concatenate([[0.0], np.cumsum(np.where(ok, x, 0.0))])
    k = np.concatenate([[0], np.cumsum(ok)])
    i = np.arange(1, len(x) + 1)
    lo = np.maximum(0, i - w)
    cnt = k[i] - k[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cnt > 0, (c[i] - c[lo]) / np.maximum(cnt, 1), np.nan)


def auto_window(n: int, requested: int) -> int:
    """The smoothing window: `requested` if > 0, else ~1/50 of the series (1 for short ones)."""
    return requested if requested > 0 else max(1, n // 50)


def _thin_index(n: int) -> np.ndarray:
    """Indices of at most MAX_POINTS evenly spread points of a series of n (all of a short one)."""
    if n <= MAX_POINTS:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, MAX_POINTS).astype(int))


def _thin(*arrays: np.ndarray):
    idx = _thin_index(len(arrays[0]))
    return tuple(a[idx] for a in arrays)


def _markevery(n: int, phase: float):
    """Every point of a short series; ~8 markers on a long one, starting at `phase` (0..1) of the
    spacing, so the markers of neighbouring curves do not sit on each other."""
    if n <= 15:
        return None
    step = max(1, n // 8)
    return (int(step * phase), step)


def _draw(ax, x, mean, lo, hi, n: int, style: dict, label: str, drawstyle: str = "default", phase: float = 0.0):
    x, mean, lo, hi = _thin(x, mean, lo, hi)
    if style.get("marker"):
        style = dict(style, markevery=_markevery(len(x), phase))
    line, = ax.plot(x, mean, label=label, drawstyle=drawstyle, **style)
    if n > 1:
        ax.fill_between(x, lo, hi, color=style.get("color"), alpha=0.18, linewidth=0,
                        step="post" if drawstyle.startswith("steps") else None)
    return line


def label_n(g: Group) -> str:
    return g.label + (f" (n={g.n})" if g.n > 1 else "")


@dataclass(eq=False)
class Series:
    """One setting's curve in a figure: its points, the 95% CI band over its replicas, its legend text."""
    group: Group
    x: np.ndarray
    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray

    @property
    def label(self) -> str:
        return label_n(self.group)


def _same_points(a: Series, b: Series) -> bool:
    return (a.x.shape == b.x.shape and a.mean.shape == b.mean.shape and np.array_equal(a.x, b.x)
            and np.allclose(a.mean, b.mean, rtol=1e-9, atol=0.0, equal_nan=True))


def identical_to(series: list[Series]) -> list[int | None]:
    """For each series, the index of the first earlier series with the same points (None when it
    has none): drawn as they are, such curves would hide each other."""
    out: list[int | None] = []
    for i, s in enumerate(series):
        out.append(next((j for j in range(i) if out[j] is None and _same_points(series[j], s)), None))
    return out


def legend_labels(series: list[Series], same: list[int | None]) -> list[str]:
    """Legend texts; a curve identical to an earlier one says which, on a second line."""
    def note(name: str) -> str:
        return f"\n(identical to {name})" if len(name) <= 16 else f"\n(identical to\n{name})"
    return [s.label + (note(series[j].group.label) if j is not None else "") for s, j in zip(series, same)]


def _overlay(style: dict, under: dict, k: int, m: int) -> dict:
    """Style of the k-th (1..m) of m curves identical to an earlier one: dashes that take turns
    with the earlier line (each shows in its own stretch of every period, the earlier one in the
    last) and hollow, larger markers around the earlier curve's."""
    width = under.get("linewidth", 1.2)
    dash = 4.0
    period = dash * (m + 1)
    return dict(style, linewidth=width, linestyle=((period - (k - 1) * dash) % period, (dash, period - dash)),
                fillstyle="none", markersize=style.get("markersize", 3.2) + 1.2 * k)


def legend_plan(series: list[Series]) -> tuple[list[int | None], list[str]]:
    """Which earlier series each one repeats, and the legend texts: worked out once per figure,
    before drawing, because the figure is sized around its legend."""
    same = identical_to(series)
    return same, legend_labels(series, same)


def _draw_series(ax, series: list[Series], st: dict, plan: tuple[list[int | None], list[str]],
                 drawstyle: str = "default") -> tuple[list, list]:
    """Draw every series in its group's style; curves identical to an earlier one (`plan`, from
    legend_plan) go over it with `_overlay`'s style and a legend text that says so. Returns
    (handles, labels)."""
    same, labels = plan
    handles = []
    for i, (s, j) in enumerate(zip(series, same)):
        style = st[s.group]
        if j is not None:
            twins = [t for t, b in enumerate(same) if b == j]
            style = _overlay(style, st[series[j].group], twins.index(i) + 1, len(twins))
        line = _draw(ax, s.x, s.mean, s.lo, s.hi, s.group.n, style, labels[i], drawstyle, phase=(i * 0.382) % 1.0)
        handles.append(line if j is None else _legend_proxy(line))
    return handles, labels


def _legend_proxy(line) -> Line2D:
    """A legend sample of an overlaid curve: its colour and hollow marker on a plain dashed line
    (its own dash offset can leave the short sample blank)."""
    return Line2D([], [], color=line.get_color(), linewidth=line.get_linewidth(), linestyle=(0, (2.0, 1.2)),
                  marker=line.get_marker(), fillstyle="none", markersize=line.get_markersize())


def _legend_size(labels: list[str]) -> tuple[int, int]:
    """(lines, longest line) of legend texts, for sizing the figure around its legend."""
    lines = [x for text in labels for x in text.split("\n")]
    return len(lines), max((len(x) for x in lines), default=10)


def _target_line(ax, ctx: Context, handles: list, labels: list) -> None:
    if ctx.target is not None:
        h = ax.axhline(ctx.target * metric_scale(ctx.metric), color="0.35", linestyle=":", linewidth=0.9)
        handles.append(h)
        labels.append("target")


def _from_zero(ax) -> None:
    """An x axis (iterations, time, floats) that starts at a 0 tick, so runs are read from their start."""
    ax.set_xlim(left=0)


def _iteration_axis(ax) -> None:
    """At most ~5 ticks on an iteration axis from 0, thousands as "5k" so labels never collide."""
    ax.set_xlabel("Iteration")
    _from_zero(ax)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
    lo, hi = ax.get_xlim()
    if max(abs(lo), abs(hi)) >= 10000:
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1000:g}k" if v else "0"))


def _markers(n_points: int) -> dict:
    """Markers at evaluations only when there are few of them."""
    return dict(marker="o", markersize=2.5) if n_points <= 15 else {}


# ----------------------------------------------------------------------------------------------
# 1. cumulative floats (or wire bytes) vs iterations

def cumulative_figure(ctx: Context, key: str = "floats_sent", what: str = "floats sent"):
    """Cumulative `key` per worker vs iterations; log scale when the settings span decades;
    a dot where each setting first reached the target."""
    groups = [g for g in ctx.groups if any(r.has_column(key) for r in g.runs)]
    if not groups:
        raise Skip(f"no run has '{key}' in steps.jsonl")
    st = styles(ctx.groups)
    mats = {g: _matrix([r.cumulative(key) for r in g.runs]) for g in groups}
    series = [Series(g, *_curve(m)) for g, m in mats.items()]
    plan = legend_plan(series)
    n_lines, longest = _legend_size(plan[1])
    fig, (ax,), ncol = _new(n_lines + 1, label_len=longest)
    handles, labels = _draw_series(ax, series, st, plan)
    finals = [v for m in mats.values() for row in m if np.isfinite(row).any()
              for v in [np.nanmax(row)] if math.isfinite(v) and v > 0]
    for g in groups:
        hits = [r.first_hit(ctx.target) for r in g.runs]
        hits = [h for h in hits if h is not None and math.isfinite(h.floats)]
        if hits:
            val = np.mean([h.floats if key == "floats_sent" else h.wire for h in hits])
            ax.plot([np.mean([h.step for h in hits])], [val], "*", color=st[g]["color"], markersize=6,
                    markeredgecolor="black", markeredgewidth=0.4, zorder=5)
    if finals and max(finals) / min(finals) > 20:
        ax.set_yscale("log")
    _iteration_axis(ax)
    ax.set_ylabel(f"Cumulative {what}\nper worker" + (" (bytes)" if key == "wire_bytes" else " (elements)"))
    if ctx.target is not None:
        handles.append(Line2D([], [], marker="*", linestyle="", color="0.6", markersize=6,
                              markeredgecolor="black", markeredgewidth=0.4))
        labels.append("target reached")
    _title(fig, ctx.title, _band_note(groups))
    _legend(fig, handles, labels, ncol)
    return fig


# ----------------------------------------------------------------------------------------------
# 5. time to accuracy

def _eval_points(run: Run, time_key: str) -> dict[int, tuple[float, float]]:
    """{steps done at eval: (cumulative time, metric)} for evaluations with a known time;
    time_key "model" is the run's own modelled time (serial or overlapped, Run.model_key)."""
    out = {}
    key = run.model_key if time_key == "model" else time_key
    cum = run.cumulative(key) if run.steps else np.array([])
    for s, m in zip(*run.eval_series()):
        if 0 < s <= len(cum) and int(run.steps[s - 1].get("step", s - 1)) == s - 1 and math.isfinite(cum[s - 1]):
            out[int(s)] = (float(cum[s - 1]), float(m))
    return out


def _plain_log_y(ax) -> None:
    """Log y axis labelled 20, 50, 100 instead of 2×10¹; minor labels (2, 3, 5 of a decade) when it
    spans less than two decades, so a perplexity axis has more than one label."""
    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    few = lo > 0 and hi / lo < 100
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(
        lambda v, _: f"{v:g}" if few and f"{v:.1e}"[0] in "235" else ""))


def _metric_axis(ax, ctx: Context) -> None:
    ax.set_ylabel(METRIC_AXIS.get(ctx.metric, ctx.metric))
    if ctx.metric == "perplexity":
        _plain_log_y(ax)


def _time_series(g: Group, time_key: str, scale: float) -> Series:
    """A setting's metric at each evaluation (mean and 95% CI over seeds) against its mean cumulative
    time there."""
    pts = [_eval_points(r, time_key) for r in g.runs]
    steps = sorted({s for p in pts for s in p})
    t = np.array([np.mean([p[s][0] for p in pts if s in p]) for s in steps])
    return Series(g, t, *band(_eval_matrix([{s: v[1] * scale for s, v in p.items()} for p in pts], steps)))


def _step_series(g: Group, scale: float) -> Series:
    """A setting's metric at each evaluation against the iteration (mean and 95% CI over seeds)."""
    per_run = [dict(zip(*r.eval_series())) for r in g.runs]
    steps = sorted({int(s) for p in per_run for s in p})
    return Series(g, np.array(steps, dtype=float), *band(_eval_matrix(
        [{s: v * scale for s, v in p.items()} for p in per_run], steps)))


def _eval_matrix(per_run: list[dict], steps: list[int]) -> np.ndarray:
    """Replicas x evaluation steps, NaN where a replica has no evaluation at a step."""
    return np.array([[p.get(s, np.nan) for s in steps] for p in per_run], dtype=float).reshape(len(per_run), len(steps))


def time_to_accuracy_figure(ctx: Context, time_key: str):
    """Metric vs cumulative step time (wall: step_wall_s; "model": each run's modelled time) at
    each evaluation."""
    modelled = time_key == "model"
    st = styles(ctx.groups)
    groups = [g for g in ctx.groups if any(_eval_points(r, time_key) for r in g.runs)]
    if not groups:
        raise Skip(f"no run has evaluations with '{time_key}' step times")
    series = [_time_series(g, time_key, metric_scale(ctx.metric)) for g in groups]
    plan = legend_plan(series)
    n_lines, longest = _legend_size(plan[1])
    fig, (ax,), ncol = _new(n_lines + 1, label_len=longest)
    handles, labels = _draw_series(ax, series, st, plan)
    _target_line(ax, ctx, handles, labels)
    _metric_axis(ax, ctx)
    ax.set_xlabel("Modelled cluster time (s)" if modelled else "Wall time, measured steps (s)")
    _from_zero(ax)
    if modelled:
        overlap = {r.model_key == "step_overlap_model_s" for r in ctx.runs}
        how = ("communication overlapped with backward as DDP does" if overlap == {True} else
               "compute + compression + modelled comm." if overlap == {False} else
               "overlapped (runs with a clock) or serial (older runs)")
        sub = network_text(ctx.runs) + f"; time = {how}"
    else:
        backends = sorted({str((r.summary or {}).get("backend") or r.cfg("cluster.backend", "?")) for r in ctx.runs})
        sub = f"time = compute + compression + measured comm. (backend {', '.join(backends)})"
    _title(fig, ctx.title, _join(sub, _band_note(groups)))
    _legend(fig, handles, labels, ncol)
    return fig


def metric_vs_steps_figure(ctx: Context):
    """Metric vs iterations at each evaluation."""
    st = styles(ctx.groups)
    groups = [g for g in ctx.groups if any(len(r.eval_series()[0]) for r in g.runs)]
    if not groups:
        raise Skip("no run has evaluations")
    series = [_step_series(g, metric_scale(ctx.metric)) for g in groups]
    plan = legend_plan(series)
    n_lines, longest = _legend_size(plan[1])
    fig, (ax,), ncol = _new(n_lines + 1, label_len=longest)
    handles, labels = _draw_series(ax, series, st, plan)
    _target_line(ax, ctx, handles, labels)
    _metric_axis(ax, ctx)
    _iteration_axis(ax)
    _title(fig, ctx.title, _band_note(groups))
    _legend(fig, handles, labels, ncol)
    return fig


# ----------------------------------------------------------------------------------------------
# 4. compression gain

def _gain_series(g: Group, window: int) -> Series:
    m = _matrix([smooth(r.column("gain"), window) for r in g.runs])
    return Series(g, *_curve(m))


def static_gain_figure(ctx: Context, window: int = 0):
    """Compression gain ||C(g)||²/||g||² over iterations, one panel per compressor, one line per CF."""
    groups = [g for g in ctx.groups if g.method == "static" and any(r.has_column("gain") for r in g.runs)]
    if not groups:
        raise Skip("no static run records 'gain'")
    comps = list(dict.fromkeys(g.first.compressor for g in groups))
    st = styles(ctx.groups)
    n_steps = max(len(r.steps) for g in groups for r in g.runs)
    w = auto_window(n_steps, window)
    panels = {c: [_gain_series(g, w) for g in groups if g.first.compressor == c] for c in comps}
    plans = {c: legend_plan(ps) for c, ps in panels.items()}
    n_lines, longest = _legend_size([t for _, texts in plans.values() for t in texts])
    fig, axes, ncol = _new(n_lines, height=1.5 if len(comps) > 1 else 2.2, nrows=len(comps), label_len=longest)
    handles, labels = [], []
    for ax, comp in zip(axes, comps):
        h, lab = _draw_series(ax, panels[comp], st, plans[comp])
        handles += h
        labels += lab
        first = next(g for g in groups if g.first.compressor == comp).first
        ax.set_ylabel(f"Gain ({first.setting.get('compressor_label', comp)})")
        ax.set_ylim(bottom=0)
    _iteration_axis(axes[-1])
    what = "compression gain ||C(g)||²/||g||²" + (f", moving average of {w} steps" if w > 1 else "")
    _title(fig, f"{ctx.title}", _join(what, _band_note(groups)))
    _legend(fig, handles, labels, ncol)
    return fig


def gravac_gain_figure(ctx: Context, g: Group, window: int = 0):
    """GraVAC's smoothed gains δ_min (at cf_min) and δ_c (at the candidate CF) and threshold ε."""
    runs = [r for r in g.runs if r.has_column("delta_min")]
    if not runs:
        raise Skip(f"{g.label}: no 'delta_min' in steps.jsonl")
    n_steps = max(len(r.steps) for r in runs)
    w = auto_window(n_steps, window) if window > 0 else 1   # δ are already EWMA-smoothed
    fig, (ax,), ncol = _new(3, label_len=24)
    handles, labels = [], []
    for key, color, text in (("delta_min", "#1f77b4", "δ_min (at cf_min)"), ("delta_c", "#d62728", "δ_c (at cf_min·cs)")):
        x, mean, lo, hi = _curve(_matrix([smooth(r.column(key), w) for r in runs]))
        handles.append(_draw(ax, x, mean, lo, hi, len(runs), dict(color=color), text))
        labels.append(text)
    eps = g.first.cfg("method.epsilon")
    if isinstance(eps, (int, float)):
        handles.append(ax.axhline(eps, color="0.3", linestyle=":", linewidth=0.9))
        labels.append(f"ε = {eps:g}")
    ax.set_ylim(bottom=0)
    _iteration_axis(ax)
    ax.set_ylabel("Compression gain (EWMA)")
    _title(fig, label_n(g), _join(ctx.title, _band_note([g])))
    _legend(fig, handles, labels, ncol)
    return fig


def sent_cf_series(run: Run) -> tuple[np.ndarray, np.ndarray, str]:
    """(iteration, CF, legend text): the CF of every step, or, when it changes so often that a
    step line would be a solid block, the effective CF of blocks of steps (dense elements of the
    block / floats sent in it, the same average as the tables' "mean CF sent")."""
    cf, fl = run.column("cf"), run.column("floats_sent")
    x = np.arange(1, len(cf) + 1)
    changes = int(np.count_nonzero(np.diff(cf)))
    if changes <= max(20, 0.02 * len(cf)) or not np.isfinite(fl).any():
        x1, y1 = _thin(x, cf)
        return x1, y1, "CF sent"
    w = max(2, len(cf) // 100)
    starts = np.arange(0, len(cf), w)
    dense = np.where(np.isfinite(fl * cf), fl * cf, 0.0)
    sent = np.where(np.isfinite(fl), fl, 0.0)
    num, den = np.add.reduceat(dense, starts), np.add.reduceat(sent, starts)
    with np.errstate(invalid="ignore", divide="ignore"):
        eff = np.where(den > 0, num / den, np.nan)
    return np.append(x[starts], len(cf)), np.append(eff, eff[-1]), f"CF sent (effective per {w} steps)"


def cf_figure(ctx: Context, g: Group):
    """The CF an adaptive method sent over iterations (log scale) and, in a panel of its own below,
    the metric: on twin axes the metric's points sat on the CF axis's tick labels and read as CFs."""
    runs = [r for r in g.runs if r.has_column("cf")]
    if not runs:
        raise Skip(f"{g.label}: no 'cf' in steps.jsonl")
    fig, (ax, axm), ncol = _new(5, height=1.45, nrows=2, label_len=24)
    handles, labels = _cf_lines(ax, runs)
    _plain_log_y(ax)
    ax.set_ylabel("Compression factor (x)")
    h = _metric_line(axm, ctx, g)
    if h is not None:
        handles.append(h)
        labels.append(METRIC_AXIS.get(ctx.metric, ctx.metric).split(" (")[0])
    _target_line(axm, ctx, handles, labels)
    _metric_axis(axm, ctx)
    _iteration_axis(axm)
    ax.set_xlabel("")
    _title(fig, label_n(g), ctx.title)
    _legend(fig, handles, labels, ncol)
    return fig


def _cf_lines(ax, runs: list[Run]) -> tuple[list, list]:
    """The CF each replica sent (the first opaque) and, when recorded, GraVAC's cf_min and candidate."""
    handles, labels = [], []
    for i, r in enumerate(runs):
        x, y, text = sent_cf_series(r)
        h, = ax.plot(x, y, drawstyle="steps-post", color="#d62728", linewidth=1.3, alpha=1 if i == 0 else 0.5,
                     zorder=3)
        if i == 0:
            handles.append(h)
            labels.append(text + (f" ({len(runs)} replicas)" if len(runs) > 1 else ""))
    r0 = runs[0]
    for key, style, text in (("cf_min", dict(color="#1f77b4", linestyle="--"), "cf_min"),
                             ("cf_c", dict(color="#2ca02c", linestyle=":"), "candidate cf_min·cs")):
        if r0.has_column(key):
            x1, y1 = _thin(np.arange(1, len(r0.steps) + 1), r0.column(key))
            h, = ax.plot(x1, y1, drawstyle="steps-post", linewidth=0.9, zorder=4, **style)
            handles.append(h)
            labels.append(text)
    return handles, labels


def _metric_line(ax, ctx: Context, g: Group):
    """The setting's mean metric at each evaluation, or None when it has no evaluation."""
    s = _step_series(g, metric_scale(ctx.metric))
    if not len(s.x):
        return None
    h, = ax.plot(s.x, s.mean, color="0.2", linewidth=1.0, **_markers(len(s.x)))
    return h


def tcomp_figure(ctx: Context, g: Group):
    """GraVAC's T_compression (samples/s × gain) per candidate CF: evolution and final values."""
    runs = [r for r in g.runs if any(isinstance(s.get("t_compression"), dict) and s["t_compression"] for s in r.steps)]
    if not runs:
        raise Skip(f"{g.label}: no 't_compression' in steps.jsonl")
    keys = sorted({k for r in runs for s in r.steps if isinstance(s.get("t_compression"), dict)
                   for k in s["t_compression"]}, key=lambda k: float(k) if _isnum(k) else math.inf)
    cmap = plt.get_cmap("plasma")      # ordered by CF; stops short of plasma's pale yellow
    colors = {k: cmap(0.8 * i / max(1, len(keys) - 1)) for i, k in enumerate(keys)}
    names = {k: ("dense (1x)" if _isnum(k) and float(k) == 1 else fmt_cf(k) if _isnum(k) else k) for k in keys}
    fig, (ax, axb), ncol = _new(len(keys), height=1.6, nrows=2, sharex=False)
    handles, labels = [], []
    for k in keys:
        x, mean, lo, hi = _curve(_matrix([np.array([_tc(s, k) for s in r.steps]) for r in runs]))
        handles.append(_draw(ax, x, mean, lo, hi, len(runs), dict(color=colors[k]), names[k]))
        labels.append(names[k])
    _iteration_axis(ax)
    ax.set_ylabel("T_compression\n(samples/s)")
    finals = {k: [v for v in (_last_tc(r, k) for r in runs) if math.isfinite(v)] for k in keys}
    xs = [i for i, k in enumerate(keys) if finals[k]]
    ci_bars(axb, xs, [finals[keys[i]] for i in xs], [colors[keys[i]] for i in xs], 0.6)
    axb.set_xticks(range(len(keys)), [names[k] for k in keys])
    axb.set_xlabel("Compression factor")
    axb.set_ylabel("Final T_compression\n(samples/s)")
    axb.margins(y=0.18)
    axb.grid(axis="x", visible=False)
    _title(fig, label_n(g), _join(ctx.title, _band_note([g]) + (", bars: 95% CI" if g.n > 1 else "")))
    _legend(fig, handles, labels, min(4, len(keys)))
    return fig


def ci_bars(ax, xs: list[float], samples: list[list[float]], colors, width: float) -> list:
    """Bars at the mean of each sample with 95% CI error bars (none for one value), the mean
    written above each bar; returns the estimates drawn."""
    ests = [estimate(v) for v in samples]
    err = np.array([[e.point - e.lo, e.hi - e.point] if e.has_ci else [0.0, 0.0] for e in ests]).T.reshape(2, -1)
    ax.bar(xs, [e.point for e in ests], color=colors, width=width,
           yerr=err if any(e.has_ci for e in ests) else None, ecolor="0.15", capsize=2, error_kw={"linewidth": 0.8})
    for x, e in zip(xs, ests):
        top = e.hi if e.has_ci else e.point
        ax.annotate(f"{e.point:.0f}" if e.point >= 100 else f"{e.point:.3g}", (x, top), ha="center", va="bottom",
                    fontsize=7, xytext=(0, 1), textcoords="offset points")
    return ests


def _isnum(k) -> bool:
    try:
        float(k)
        return True
    except (TypeError, ValueError):
        return False


def _tc(step: dict, key: str) -> float:
    t = step.get("t_compression")
    v = t.get(key) if isinstance(t, dict) else None
    return float(v) if isinstance(v, (int, float)) else math.nan


def _last_tc(run: Run, key: str) -> float:
    for s in reversed(run.steps):
        if isinstance(s.get("t_compression"), dict) and s["t_compression"]:
            return _tc(s, key)
    return math.nan


# ----------------------------------------------------------------------------------------------
# 6. direct vs multi-level compression

def _wrap_label(text: str) -> str:
    """A bar name on two lines at its parenthesis ("Top-k" above "(torch)"), so neighbours never touch."""
    return text.replace(" (", "\n(", 1)


def _speedup_ci(row: dict):
    """The 95% CI of a benchmark row's speedup (median direct / median multi-level) over its repeated
    measurements; no CI when the CSV holds one time per case."""
    return ratio_estimate(row.get("direct_all", []), row.get("multi_all", []), np.median)


def _bars_note(rows: list[dict]) -> str:
    if any(_speedup_ci(r).has_ci for r in rows):
        return "error bars: 95% CI over the repeated measurements (bootstrap)"
    return "no error bars: the CSV holds one time per case (a median of its repeats), not each repeat"


def multilevel_figure(rows: list[dict]):
    """Speedup of multi-level over direct compression (direct time / multi-level time)."""
    if not rows:
        raise Skip("no direct/multi-level rows")
    models = list(dict.fromkeys(str(r["model"]) for r in rows))
    cats = list(dict.fromkeys((r["compressor"], r["cf"]) for r in rows))
    multi_cf = len({c for c, _ in cats}) < len(cats)
    fig, (ax,), ncol = _new(len(models), label_len=max(len(m) for m in models))
    width = 0.8 / len(models)
    cmap = plt.get_cmap("tab10")
    for j, model in enumerate(models):
        xs, ys, err = [], [], []
        for i, cat in enumerate(cats):
            r = next((r for r in rows if str(r["model"]) == model and (r["compressor"], r["cf"]) == cat), None)
            if r is not None and math.isfinite(r["speedup"]):
                xs.append(i - 0.4 + width * (j + 0.5))
                ys.append(r["speedup"])
                e = _speedup_ci(r)
                err.append([r["speedup"] - e.lo, e.hi - r["speedup"]] if e.has_ci else [0.0, 0.0])
        yerr = np.array(err, dtype=float).T.reshape(2, -1) if any(any(e) for e in err) else None
        ax.bar(xs, ys, width=width * 0.95, color=cmap(j % 10), label=model, yerr=yerr, ecolor="0.15", capsize=2,
               error_kw={"linewidth": 0.8})
    ax.axhline(1.0, color="0.3", linestyle=":", linewidth=0.9)
    names = {r["compressor"]: r.get("label") or compressor_label(r["compressor"]) for r in rows}
    ax.set_xticks(range(len(cats)), [_wrap_label(names[c]) + (f"\n{fmt_cf(cf)}" if multi_cf else "")
                                     for c, cf in cats])
    ax.set_ylabel("Speedup of multi-level\n(direct time / multi-level time)")
    ax.grid(axis="x", visible=False)
    cfs = sorted({cf for _, cf in cats if isinstance(cf, float)})
    _title(fig, f"Direct vs multi-level compression, timed on {timed_on(rows)}",
           _join(f"final CF {', '.join(fmt_cf(c) for c in cfs)}" if cfs and not multi_cf else "", _bars_note(rows)))
    h, lab = ax.get_legend_handles_labels()
    _legend(fig, h, lab, ncol if len(models) > 1 else 1)
    return fig
