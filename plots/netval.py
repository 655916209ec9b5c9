"""Figure of bench/netval.py: measured against predicted time, per collective, size and setting.

    python plots/netval.py results/netval.csv      # redraw results/netval.png from the CSV
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gravac.core.io import atomic_write  # noqa: E402

PANELS = [("allreduce", "all-reduce"), ("allgather", "all-gather (equal sizes)"),
          ("sparse_allgather", "sparse all-gather (counts, then padded)"), ("broadcast", "broadcast"),
          ("step", "whole steps: cluster=ddp (serial), torch DDP (overlap)")]


def _panel(kind: str) -> str:
    return "step" if kind.startswith("step_") or kind == "ddp_step" else kind


def _name(kind: str) -> str:
    return "torch DDP" if kind == "ddp_step" else kind[5:]


def _label(r: dict) -> str:
    delay = float(r["delay_ms"])
    return f"N={int(r['workers'])}, {float(r['rate_mbit']):g} Mbit/s" + (f", +{delay:g} ms" if delay else "")


def _predicted(r: dict) -> float:
    """The row's prediction: the fitted profile's when the row has one, else the ideal model's
    (a CSV from before the profiles calls it predicted_s)."""
    for key in ("predicted_fitted_s", "predicted_ideal_s", "predicted_s"):
        if r.get(key) not in (None, ""):
            return float(r[key])
    raise KeyError(f"row {r.get('kind')} has no prediction")


def draw(rows: list[dict], path: Path) -> None:
    """One log-log panel per collective and one of whole steps, measured against the prediction
    (fitted profile where fitted, else ideal), with y = x and the ±15% band."""
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.3 * len(PANELS), 4.2))
    for ax, (prefix, title) in zip(axes, PANELS):
        mine = [r for r in rows if _panel(str(r["kind"])) == prefix]
        for label in sorted({_label(r) for r in mine}):
            pts = [r for r in mine if _label(r) == label]
            ax.plot([_predicted(r) for r in pts], [float(r["measured_s"]) for r in pts],
                    "o" if prefix == "step" else ".-", label=label, alpha=0.8)
        if prefix == "step":
            for r in mine:
                ax.annotate(_name(str(r["kind"])), (_predicted(r), float(r["measured_s"])), fontsize=6)
        vals = [v for r in mine for v in (_predicted(r), float(r["measured_s"]))] or [1e-4, 1.0]
        lo, hi = min(vals) / 1.5, max(vals) * 1.5
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        ax.fill_between([lo, hi], [lo * 0.85, hi * 0.85], [lo * 1.15, hi * 1.15], color="0.85", zorder=0)
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
               xlabel="predicted (s): fitted profile, else ideal", ylabel="measured (s)")
        ax.set_title(title, fontsize=9)
        if mine:
            ax.legend(fontsize=6)
    fig.suptitle("Network model vs real gloo over tc-shaped veth links (grey: ±15%)", fontsize=10)
    fig.tight_layout()
    import io
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=130)
    plt.close(fig)
    atomic_write(path, buf.getvalue())


def main(argv: list[str]) -> int:
    src = Path(argv[0]) if argv else Path("results/netval.csv")
    if not src.is_file():
        print(f"error: {src} not found: run `python bench/netval.py` first", file=sys.stderr)
        return 2
    with open(src) as f:
        rows = list(csv.DictReader(f))
    draw(rows, src.with_suffix(".png"))
    print(f"wrote {src.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
