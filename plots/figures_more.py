"""The figures of GraVAC's own behaviour and of the comparison bars: gains, CF over steps,
T_compression, speed-up bars, multi-level compression (re-exported by plots/figures.py)."""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from plots.labels import METRIC_AXIS, compressor_label, fmt_cf, metric_scale  # noqa: E402
from plots.bench import timed_on  # noqa: E402
from plots.load import Run  # noqa: E402
from plots.settings import Context, Group  # noqa: E402
from plots.stats import estimate, ratio_estimate  # noqa: E402
from plots.draw import (  # noqa: E402
    auto_window, _band_note, _curve, _draw, _iteration_axis, _join, label_n, _legend, _markers,
    _matrix, _metric_axis, _new, _plain_log_y, Skip, smooth, _step_series, _target_line, _thin,
    _title
)


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
    return np.append(x[starts], len(cf)), np.append(eff, eff[-1]), f"CF sent per {w}-step block (dense ÷ floats sent)"


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


def layer_levels(run: Run) -> np.ndarray:
    """layers × steps matrix of the CF each layer used, from the levels a layer-wise method
    announces in steps.jsonl when they change (`lgreco_levels`), carried forward."""
    cols, cur = [], None
    for s in run.steps:
        cur = s.get("lgreco_levels", cur)
        cols.append(cur)
    first = next((c for c in cols if c), None)
    if first is None:
        raise Skip(f"{run.name}: no 'lgreco_levels' in steps.jsonl")
    return np.array([c if c else [np.nan] * len(first) for c in cols], dtype=float).T


#: What a level is called, per unit: the colour bar's "... of the layer" and the caption's "per ...".
UNIT_NAMES = {"cf": ("CF", "CF"), "bits": ("code width", "width"), "rank": ("rank", "rank")}


def level_unit(run: Run) -> str:
    """What a run's per-layer levels are: "cf", "bits" (a quantizer's code widths) or "rank"
    (PowerSGD's), from summary.json's `method_summary.level_unit`, else the setting's (config.yaml:
    a run still going), else "cf" (runs written before either said it chose only CFs)."""
    unit = ((run.summary or {}).get("method_summary") or {}).get("level_unit") or run.setting.get("level_unit")
    return str(unit) if unit else "cf"


def fmt_level(v: float, unit: str) -> str:
    """A level as the figures say it: "100x" (fmt_cf), "4-bit" or "rank 2"."""
    return f"{v:g}-bit" if unit == "bits" else f"rank {v:g}" if unit == "rank" else fmt_cf(v)


def _layer_sizes(g: Group) -> list | None:
    """Values per layer, from any replica's summary (the same model in every replica)."""
    for r in g.runs:
        sizes = ((r.summary or {}).get("method_summary") or {}).get("layer_sizes")
        if sizes:
            return sizes
    return None


def levels_figure(ctx: Context, g: Group):
    """The level (CF, code width in bits or PowerSGD rank) of every layer over the run (first
    replica) as a heat map, each row labelled with the layer's size, so that a reader sees where the
    floats go; the caption gives each level's share of parameter-steps over the replicas that record
    layer sizes. Layers outside the method's choice (recorded as null) stay blank."""
    runs = [r for r in g.runs if any("lgreco_levels" in s for s in r.steps)]
    if not runs:
        raise Skip(f"{g.label}: no 'lgreco_levels' in steps.jsonl")
    unit = level_unit(runs[0])
    m = layer_levels(runs[0])
    cfs = sorted({float(v) for v in m[np.isfinite(m)]})
    edges = np.log10([cfs[0] / 1.5, *[math.sqrt(a * b) for a, b in zip(cfs, cfs[1:])], cfs[-1] * 1.5])
    cmap = plt.get_cmap("viridis", len(cfs))
    fig, (ax,), _ = _new(0, height=max(2.2, 0.09 * m.shape[0] + 0.8))
    im = ax.imshow(np.log10(m), aspect="auto", interpolation="nearest", cmap=cmap, origin="upper",
                   norm=matplotlib.colors.BoundaryNorm(edges, cmap.N), extent=(0.5, m.shape[1] + 0.5, m.shape[0] - 0.5, -0.5))
    bar = fig.colorbar(im, ax=ax, ticks=[math.log10(c) for c in cfs], pad=0.01)
    bar.ax.set_yticklabels([fmt_level(c, unit) for c in cfs], fontsize=6)
    bar.set_label(f"{UNIT_NAMES.get(unit, (unit, unit))[0]} of the layer", fontsize=7)
    sizes = _layer_sizes(g)
    if sizes and len(sizes) == m.shape[0]:
        step = max(1, len(sizes) // 24)
        ax.set_yticks(range(0, len(sizes), step))
        ax.set_yticklabels([f"{i}: {sizes[i]:,}" for i in range(0, len(sizes), step)], fontsize=5)
        ax.set_ylabel("layer: values", fontsize=7)
    else:
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_ylabel("layer", fontsize=7)
    _iteration_axis(ax)
    ax.grid(False)
    _title(fig, label_n(g), _join(ctx.title, f"levels of {runs[0].name}", _shares_note(runs, sizes, unit)))
    return fig


def _shares_note(runs: list[Run], sizes: list | None, unit: str = "cf") -> str:
    """'parameter-steps per CF: 10x 12%, ...' (per width: '4-bit 12%'; per rank: 'rank 1 30%') over
    the replicas, or '' without layer sizes; layers without a level (null) are left out."""
    if not sizes:
        return ""
    weight: dict[float, float] = {}
    for r in runs:
        m = layer_levels(r)
        if m.shape[0] != len(sizes):
            continue
        for row, n in zip(m, sizes):
            for cf in row[np.isfinite(row)]:
                weight[float(cf)] = weight.get(float(cf), 0.0) + n
    total = sum(weight.values()) or 1.0
    what = UNIT_NAMES.get(unit, (unit, unit))[1]
    return f"parameter-steps per {what}: " + ", ".join(f"{fmt_level(c, unit)} {_pct(w / total)}"
                                                       for c, w in sorted(weight.items()))


def _pct(share: float) -> str:
    """A share as a whole percent, '<1%' when it would round to a misleading 0%."""
    return f"{share:.0%}" if share >= 0.005 or share == 0 else "<1%"
