"""The gain probe's figure and table (issue 18): compression gain over iterations per CF, under the
paper's definition and the authors' code's, for the paper's models and the minis side by side.

    python plots/gains.py results/runs/gain_probe --curate results/reference/gain_probe
    python plots/gains.py results/reference/gain_probe/runs     # redraw from the committed copies

Reads static runs that recorded gains (`gain`, `gain_code_raw`, and with `method.probe_cfs` the
multi-level `probe_gain*` at larger CFs): one column per run (model x compressor), rows = paper
gain (raw per step) and code gain (raw per step; the code's smoothed value needs 25 samples).
"""
from __future__ import annotations

import io
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gravac.core.io import atomic_write  # noqa: E402
from plots.load import find_runs, load_run  # noqa: E402

ROWS = [("gain", "probe_gain", "paper gain  Σ‖C(g)‖² / Σ‖g‖²"),
        ("gain_code_raw", "probe_gain_code_raw", "code gain (raw)  Σ_l‖C(g+e)_l‖ / Σ_l‖g_l‖")]
MODEL_ORDER = ["resnet101", "vgg16", "lstm", "resnet_mini", "vgg_mini", "lstm_mini"]


def series(run) -> dict[float, dict[str, list[float]]]:
    """{CF: {record key: per-step values}} for the sent CF and every probe CF."""
    cf = float(run.summary["cf"])
    out: dict[float, dict[str, list[float]]] = {cf: {k: [] for k, _, _ in ROWS}}
    for r in run.steps:
        for key, probe_key, _ in ROWS:
            out[cf][key].append(float(r[key]))
            for pcf, v in (r.get(probe_key) or {}).items():
                out.setdefault(float(pcf), {k: [] for k, _, _ in ROWS})[key].append(float(v))
    return out


def title(run) -> str:
    exp = run.summary.get("experiment") or ""
    mini = exp if exp.startswith("mini_") else ""
    return (f"{run.summary['model']}" + (f" ({mini})" if mini else "") + f", {run.setting['label']}, "
            f"N={run.summary['workers']}, {len(run.steps)} steps")


def load(root: str) -> list:
    """Completed-or-not static runs under `root` that recorded gains, in model order."""
    runs = [load_run(p) for p in find_runs([root])[0]]
    runs = [r for r in runs if r.summary and r.steps and not r.damage and "gain_code_raw" in r.steps[0]]
    key = lambda r: (MODEL_ORDER.index(r.summary["model"]) if r.summary["model"] in MODEL_ORDER else 99,  # noqa: E731
                     r.summary["compressor"])
    return sorted(runs, key=key)


def figure(runs: list, path: Path) -> None:
    cols = len(runs)
    fig, axes = plt.subplots(len(ROWS), cols, figsize=(2.6 * cols, 2.4 * len(ROWS)), squeeze=False, sharey="row")
    for j, run in enumerate(runs):
        data = series(run)
        for i, (key, _, name) in enumerate(ROWS):
            ax = axes[i][j]
            for cf in sorted(data):
                ys = data[cf][key]
                ax.plot(range(len(ys)), ys, lw=0.8, label=f"{cf:g}x")
            ax.axhline(1.0, color="0.6", lw=0.6, ls=":")
            ax.set_xlabel("iteration", fontsize=7)
            ax.tick_params(labelsize=6)
            if j == 0:
                ax.set_ylabel(name, fontsize=7)
            if i == 0:
                ax.set_title(title(run), fontsize=6.5)
    axes[0][0].legend(fontsize=6, title="CF", title_fontsize=6)
    fig.suptitle("Compression gain over iterations (static 10x with error feedback; larger CFs by "
                 "multi-level recompression)", fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    atomic_write(path, buf.getvalue())


def _q(xs: list[float]) -> str:
    if not xs:
        return "-"
    xs = sorted(xs)
    return f"{statistics.median(xs):.2f} [{xs[0]:.2f}-{xs[-1]:.2f}]"


def table(runs: list) -> str:
    """Median [min-max] of each gain per CF over the second half of each run (after warm-up)."""
    cfs = sorted({cf for r in runs for cf in series(r)})
    head = "| run | gain | " + " | ".join(f"{cf:g}x" for cf in cfs) + " |"
    lines = ["Median [min-max] over the second half of each run's steps.", "", head,
             "|" + "---|" * (2 + len(cfs))]
    for r in runs:
        data = series(r)
        for key, label in (("gain", "paper"), ("gain_code_raw", "code (raw)")):
            cells = []
            for cf in cfs:
                ys = data.get(cf, {}).get(key, [])
                cells.append(_q(ys[len(ys) // 2:]))
            lines.append(f"| {title(r)} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def curate(runs: list, out: Path) -> list:
    """Copy the runs (small files + gzipped steps, as bench/reference.py does) to OUT/runs/, swapped
    in one rename, and return them loaded from the copies."""
    import shutil
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from reference import copy_run
    tmp = out.with_name(out.name + ".new")
    shutil.rmtree(tmp, ignore_errors=True)
    for r in runs:
        copy_run(r, str(tmp / "runs" / f"{r.summary['model']}-{r.summary['compressor']}{r.summary['cf']:g}"
                                          f"-n{r.summary['workers']}-{len(r.steps)}steps"))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return load(str(out / "runs"))


def main(argv: list[str]) -> int:
    import argparse
    p = argparse.ArgumentParser(description="Draw the gain probe's figure and table.")
    p.add_argument("root", nargs="?", default="results/reference/gain_probe/runs", help="folder of runs")
    p.add_argument("--curate", default=None, help="first copy the runs here (e.g. results/reference/gain_probe)")
    a = p.parse_args(argv)
    root = a.root
    runs = load(root)
    if not runs:
        print(f"error: no static runs with gain records under {root}: run them with method=static "
              "method.probe_cfs=[20,40,160,1000] (REPRODUCING.md, gain probe)", file=sys.stderr)
        return 2
    out = Path(root).parent if Path(root).name == "runs" else Path(root)   # beside a curated runs/ folder
    if a.curate:
        out = Path(a.curate)
        runs = curate(runs, out)
    figure(runs, out / "gains.png")
    atomic_write(out / "gains.md", "# Gain probe\n\n" + table(runs))
    print(f"wrote {out / 'gains.png'} and {out / 'gains.md'} ({len(runs)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
