"""bench/buildup.py's figures: how the union of the workers' selections builds up with N
(buildup.png) and MiCRO's and ExDyna's density and imbalance over steps (tracking.png)."""
from __future__ import annotations

from pathlib import Path

METHODS = ("topk", "topk_split", "topk_shared", "micro", "exdyna")
LABELS = {"topk": "Top-k, k = K per worker", "topk_split": "Top-k, k = K/N per worker",
          "topk_shared": "Top-k, rank 0's indices", "micro": "MiCRO", "exdyna": "ExDyna"}


def figure(summary: list[dict], out: Path) -> None:
    """buildup.png: union / K, bytes sent and received per worker, modelled communication against N, per family."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fams = sorted({r["family"] for r in summary})
    cols = [("union_over_k", "union / K"), ("wire_bytes", "bytes sent per worker"),
            ("recv_bytes", "bytes received per worker"), ("comm_model_s", "modelled comm s / step")]
    fig, axes = plt.subplots(len(fams), len(cols), figsize=(4 * len(cols), 3 * len(fams)), squeeze=False)
    for i, fam in enumerate(fams):
        for j, (col, title) in enumerate(cols):
            ax = axes[i][j]
            for m in METHODS:
                pts = sorted((r["workers"], r[col]) for r in summary if r["family"] == fam and r["method"] == m)
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=LABELS[m])
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("workers N")
            ax.set_title(f"{fam}: {title}", fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "buildup.png", dpi=110)
    plt.close(fig)


def tracking_figure(tracking: list[dict], out: Path) -> None:
    """tracking.png: density and imbalance of MiCRO and ExDyna over the tracking steps."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fams = sorted({r["family"] for r in tracking})
    fig, axes = plt.subplots(len(fams), 2, figsize=(10, 3 * len(fams)), squeeze=False)
    for i, fam in enumerate(fams):
        for m in ("micro", "exdyna"):
            sel = [r for r in tracking if r["family"] == fam and r["method"] == m]
            if not sel:
                continue
            axes[i][0].plot([r["step"] for r in sel], [r["density"] for r in sel], label=LABELS[m])
            axes[i][1].plot([r["step"] for r in sel], [r["imbalance"] for r in sel], label=LABELS[m])
            axes[i][0].axhline(sel[0]["density_target"], color="gray", ls="--", lw=0.8)
        axes[i][0].set_title(f"{fam}: global density (dashed: asked)", fontsize=9)
        axes[i][1].set_title(f"{fam}: load imbalance max_k·N/K − 1", fontsize=9)
        axes[i][0].set_yscale("log")
        for ax in axes[i]:
            ax.set_xlabel("step")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "tracking.png", dpi=110)
    plt.close(fig)
