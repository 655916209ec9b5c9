"""Drawing helpers every figure of plots/figures.py shares: sizes, legends, titles, confidence
bands, smoothing and thinning, series that coincide, axes."""
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

from plots.labels import METRIC_AXIS, metric_scale  # noqa: E402
from plots.load import Run  # noqa: E402
from plots.settings import Context, Group  # noqa: E402
from plots.stats import band, column_mean  # noqa: E402

WIDTH = 3.5
MAX_POINTS = 3000   # longer series are thinned for drawing (after smoothing)
LEGEND_CHARS = 40   # legend texts are wrapped at this many characters: one column of them fits the width
TWO_COLUMNS = 24    # ... and two columns when no line is longer than this
BAND_POINTS = 200   # a CI band is bootstrapped at this many points at most and drawn straight between them


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
    """A column-wide figure with room below for a legend of `n_legend` lines (two columns when
    no line is longer than TWO_COLUMNS characters), the axes never shorter than the legend."""
    ncol = 2 if label_len <= TWO_COLUMNS else 1
    legend = 0.16 * math.ceil(n_legend / ncol)
    h = max(height * nrows ** 0.8, legend + 0.9) + legend + 0.35
    fig, axes = plt.subplots(nrows, 1, figsize=(WIDTH, h), sharex=sharex, layout="constrained", squeeze=False)
    return fig, list(axes[:, 0]), ncol


def _legend(fig, handles, labels, ncol: int) -> None:
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncol=ncol, frameon=False,
                   columnspacing=1.0, handletextpad=0.5, borderaxespad=0.2)


def _title(fig, title: str, subtitle: str = "") -> None:
    text = "\n".join(textwrap.wrap(title, 62) + textwrap.wrap(subtitle, 62))   # 62 characters fit the width
    fig.suptitle(text, fontsize=7, linespacing=1.25)


def _matrix(arrays: list[np.ndarray]) -> np.ndarray:
    n = max((len(a) for a in arrays), default=0)
    m = np.full((len(arrays), n), np.nan)
    for i, a in enumerate(arrays):
        m[i, :len(a)] = a
    return m


def _curve(m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(iteration, mean, CI low, CI high) of a replicas x steps matrix, thinned for drawing; the
    band is the 95% CI of the mean over seeds, bootstrapped at BAND_POINTS points and interpolated
    between them (a 10 000-resample bootstrap at each of 800 steps took most of a figure's time)."""
    idx = _thin_index(m.shape[1])
    at = _thin_index(m.shape[1], BAND_POINTS)
    _, lo, hi = band(m[:, at])
    if len(at) == len(idx):
        return idx + 1.0, column_mean(m[:, idx]), lo, hi
    return idx + 1.0, column_mean(m[:, idx]), np.interp(idx, at, lo), np.interp(idx, at, hi)


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


def _thin_index(n: int, points: int = MAX_POINTS) -> np.ndarray:
    """Indices of at most `points` evenly spread points of a series of n (all of a short one), the
    first and last included."""
    if n <= points:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, points).astype(int))


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
    """Legend texts, wrapped at LEGEND_CHARS so the legend stays within the column; a curve
    identical to an earlier one says which, on a second line."""
    def note(name: str) -> str:
        one = f"(same curve as {name})"
        return f"\n{one}" if len(one) <= LEGEND_CHARS else f"\n(same curve as\n{_wrap(name)})"
    return [_wrap(s.label) + (note(series[j].group.label) if j is not None else "") for s, j in zip(series, same)]


def _wrap(text: str) -> str:
    return "\n".join(textwrap.wrap(text, LEGEND_CHARS, break_long_words=False)) or text


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
