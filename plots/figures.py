"""The paper's figures, one function per figure, each returning a matplotlib Figure.

Sized for a paper column (3.5 in wide, text ≥ 7 pt), legends below the axes so they never hide
data. Replicas of a setting are drawn as their mean with a shaded 95% confidence band of the mean
over seeds (plots/stats.py's bootstrap, the tables' CI), as the subtitle says. A function that lacks
the data it needs raises `Skip(reason)`; the command reports the reason and carries on.
"""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from plots.labels import metric_scale, network_text, styles  # noqa: E402
from plots.settings import Context, Group  # noqa: E402
from plots.draw import (  # noqa: E402, F401 (Skip, setup_style: figures.Skip, figures.setup_style)
    auto_window, _band_note, _curve, _draw_series, _eval_points, _from_zero, _iteration_axis, _join,
    _legend, legend_plan, _legend_size, _matrix, _metric_axis, _new, Series, setup_style, Skip,
    smooth, _step_series, _target_line, _time_series, _title
)


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


from plots.figures_more import (_bars_note, cf_figure, ci_bars, gravac_gain_figure, multilevel_figure,  # noqa: E402, F401
                                UNIT_NAMES, level_unit, levels_figure, sent_cf_series, tcomp_figure)
