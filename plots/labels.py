"""Names, number formats and line styles shared by every figure and table.

Labels say method, compressor and CF ("Dense", "Top-k 10x", "GraVAC ε=0.7 (dgc)",
"Accordion (randomk 1.5x/1000x)"), as each run's method wrote them into its summary (so plots know
no method by name). When two settings of one context would get the same label,
the config keys in which they differ are appended ("…, policy=geometric"), so no two lines or
rows are ever indistinguishable. Colours, dashes and markers are fixed per group within a context,
so a setting looks the same in every figure, and no two settings of a context look alike.
"""
from __future__ import annotations

import math
from typing import Any

METRIC_AXIS = {"top1": "Top-1 accuracy (%)", "top5": "Top-5 accuracy (%)", "perplexity": "Perplexity"}
METRIC_SHORT = {"top1": "top-1", "top5": "top-5", "perplexity": "perplexity"}


def fmt_cf(cf: Any) -> str:
    """10.0 -> "10x", 1.5 -> "1.5x"."""
    try:
        return f"{float(cf):g}x"
    except (TypeError, ValueError):
        return "?x"


def base_label(run) -> str:
    """Label of a run's setting, as its method stated it in summary.json (`setting.label`)."""
    return str(run.setting.get("label", run.method))


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return "[" + ",".join(_short(v) for v in value) + "]"
    return str(value)


def assign_labels(groups: list) -> None:
    """Set `g.label` for every group; settings sharing a base label get their differing keys."""
    by_base: dict[str, list] = {}
    for g in groups:
        by_base.setdefault(base_label(g.first), []).append(g)
    for base, same in by_base.items():
        if len(same) == 1:
            same[0].label = base
            continue
        keys = sorted({k for g in same for k in g.settings})
        differing = [k for k in keys if len({repr(g.settings.get(k)) for g in same}) > 1]
        leaves = [k.rsplit(".", 1)[-1] for k in differing]
        names = [leaf if leaves.count(leaf) == 1 else k for k, leaf in zip(differing, leaves)]
        for g in same:
            extra = ", ".join(f"{n}={_short(g.settings.get(k))}" for n, k in zip(names, differing))
            g.label = f"{base}, {extra}" if extra else base
        seen: dict[str, int] = {}
        for g in same:  # still equal (e.g. no config): tell them apart by run folder
            seen[g.label] = seen.get(g.label, 0) + 1
        for g in same:
            if seen[g.label] > 1:
                g.label = f"{g.label} [{g.first.name}]"


# ---------------------------------------------------------------------------------------------
# number formats

def fmt_num(x: float, digits: int = 3) -> str:
    """Compact number: 4.17e11, 9380, 0.0123."""
    if x is None or not math.isfinite(x):
        return "—"
    if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3):
        mant, exp = f"{x:.{digits - 1}e}".split("e")
        return f"{mant}e{int(exp)}"
    if abs(x) >= 10 ** digits:
        return f"{x:.0f}"
    return f"{x:.{digits}g}"


def fmt_metric(x: float, metric: str) -> str:
    """Accuracy as a percentage, perplexity as is."""
    if x is None or not math.isfinite(x):
        return "—"
    return f"{100 * x:.2f}%" if metric in ("top1", "top5") else f"{x:.2f}"


def fmt_delta(x: float, metric: str) -> str:
    """A metric difference: percentage points for accuracy."""
    if x is None or not math.isfinite(x):
        return "—"
    return f"{100 * x:+.2f} pp" if metric in ("top1", "top5") else f"{x:+.2f}"


def metric_scale(metric: str) -> float:
    """Factor from the stored metric to the plotted one (fractions -> percent)."""
    return 100.0 if metric in ("top1", "top5") else 1.0


def network_text(runs: list) -> str:
    """The network model's parameters in one line (ranges when calibrated per run); the network's
    name is in every figure's title."""
    nets = [r.network for r in runs if r.network]
    if not nets:
        return "network model: unknown (no summary/config)"
    if not nets[0].get("enabled", True):
        return "network model off (modelled time = measured)"

    def rng(key: str, unit: str) -> str:
        vals = sorted({round(float(n[key]), 6) for n in nets if isinstance(n.get(key), (int, float))})
        if not vals:
            return f"? {unit}"
        return f"{vals[0]:.3g} {unit}" if len(vals) == 1 else f"{vals[0]:.3g}–{vals[-1]:.3g} {unit}"

    workers = sorted({r.workers for r in runs if r.workers})
    w = f", N={workers[0]}" if len(workers) == 1 else ""
    profiles = sorted({str(n.get("collectives", "ideal")) for n in nets})   # runs before issue 37 were ideal
    model = "ring α-β model" if profiles == ["ideal"] else f"collectives {' + '.join(profiles)}"
    return f"{model}, α={rng('latency_us', 'µs')}, β={rng('bandwidth_gbps', 'Gbit/s')}{w}"


# ---------------------------------------------------------------------------------------------
# styles

_COMPRESSOR_COLORS = {"topk": "#1f77b4", "dgc": "#2ca02c", "redsync": "#ff7f0e", "randomk": "#8c564b"}
# Colours of the other methods' settings (MergeComp, COVAP, ...), in order; enough that the eight
# arms of a MergeComp grid get eight colours (markers alone told the 7th and 8th apart before).
_OTHER = ["#17becf", "#bcbd22", "#7f7f7f", "#e377c2", "#1a55b0", "#6b8e23", "#8c6d31", "#393b79",
          "#9c9ede", "#e7ba52"]
_ACCORDION = "#9467bd"
_GRAVAC = ["#d62728", "#b5179e", "#ff5a36", "#7b0828"]
_DASHES = [(6, 2), (2.5, 1.5), (1, 1.2), (6, 1.5, 1, 1.5), (3, 1, 1, 1)]
_MARKERS = ["o", "s", "^", "v", "D", "P", "X", "<", ">", "h", "p", "d"]   # "*" marks "target reached"


def _shade(color: str, rank: int, count: int) -> tuple:
    """`color` from darker (rank 0) to lighter (last rank), so CFs of one compressor read as a family."""
    from matplotlib.colors import to_rgb
    rgb = to_rgb(color)
    if count <= 1:
        return rgb
    t = rank / (count - 1)                      # 0 .. 1
    if t < 0.5:
        f = 0.65 + 0.7 * t                      # darken towards 0.65
        return tuple(c * f for c in rgb)
    f = (t - 0.5) * 0.9                         # lighten towards 45 % white
    return tuple(c + (1 - c) * f for c in rgb)


def styles(groups: list) -> dict:
    """{group: matplotlib kwargs}. Dense black; GraVAC red family, solid and thicker; Accordion
    purple dash-dot; static: one hue per compressor, darker and longer dashes for lower CFs."""
    out: dict = {}
    families: dict[str, list] = {}
    for g in groups:
        if g.method == "static":
            families.setdefault(g.first.compressor, []).append(g)
    other = 0
    for comp, members in families.items():
        members.sort(key=lambda g: (g.first.cf or 0, g.label))
        base = _COMPRESSOR_COLORS.get(comp)
        if base is None:
            base, other = _OTHER[other % len(_OTHER)], other + 1
        for r, g in enumerate(members):
            out[g] = dict(color=_shade(base, r, len(members)), linestyle=(0, _DASHES[r % len(_DASHES)]),
                          linewidth=1.2)
    grav = [g for g in groups if g.method == "gravac"]
    acc = [g for g in groups if g.method == "accordion"]
    for j, g in enumerate(grav):
        out[g] = dict(color=_GRAVAC[j % len(_GRAVAC)], linestyle="-", linewidth=1.6)
    for j, g in enumerate(acc):
        out[g] = dict(color=_shade(_ACCORDION, j, len(acc)), linestyle="-.", linewidth=1.2)
    for g in groups:
        if g not in out:
            if g.method == "dense":
                out[g] = dict(color="black", linestyle="-", linewidth=1.2)
            else:
                out[g] = dict(color=_OTHER[other % len(_OTHER)], linestyle=":", linewidth=1.2)
                other += 1
    _add_markers(groups, out)
    return out


def _add_markers(groups: list, out: dict) -> None:
    """Give every group a marker so that no two groups share colour, dash and marker: colours of
    one family can be close (a dark shade reads as black), and a marker tells them apart."""
    from matplotlib.colors import to_hex
    used = set()
    for i, g in enumerate(groups):
        base = (to_hex(out[g]["color"]), repr(out[g]["linestyle"]))
        combos = [(_MARKERS[(i + j) % len(_MARKERS)], fill) for fill in ("full", "none")
                  for j in range(len(_MARKERS))]
        marker, fill = next((c for c in combos if base + c not in used), combos[0])
        used.add(base + (marker, fill))
        out[g].update(marker=marker, fillstyle=fill, markersize=3.2)


def compressor_label(name: str, fallback: str | None = None) -> str:
    """Display name of a compressor, as its registration states it ("topk" -> "Top-k"); a variant
    named "<registered>_<how>" (the benchmark's "topk_torch") reads "Top-k (torch)". Names the
    registry does not know keep `fallback` (e.g. a CSV's label column) or the name itself."""
    try:
        from compressors import COMPRESSORS
    except ImportError:             # plots used without the library: the CSV's own names
        return fallback or name
    if name in COMPRESSORS:
        return COMPRESSORS[name].label
    head, _, how = name.partition("_")
    if how and head in COMPRESSORS:
        return f"{COMPRESSORS[head].label} ({how})"
    return fallback or name
