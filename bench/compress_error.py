"""Compression error at equal wire bytes on the mini families' real gradients: what one step loses.

For each family (conf/experiment/mini_*: its model, data and batch size), the model takes
--warmup dense SGD steps and --pool per-worker gradients are drawn at those weights (bench/buildup.py's
gradient_pool). Each pair "quantizer@c" compares the quantizer with Top-k at CF c, the study's
arms at the same wire bytes (Top-k sends a value and an index per kept element). Both run layer
by layer, as the study's runs (`compressor.granularity=layer`), on every gradient of the pool, and
the one-shot relative error ||C(g) - g||^2 / ||g||^2 is averaged over it. No error feedback: this is
the error a single step makes, which error feedback carries into later steps and an unbiased
quantizer leaves as variance, so it explains a training result only together with that. Also per
family: the share of ||g||^2 held by its largest d/c entries (1 minus it is Top-k's error were it to
select over the whole gradient).

    python bench/compress_error.py [--families mini_vgg,mini_resnet,mini_lstm] [--pool 8] [--warmup 100]
        [--pairs qsgd@8,quant:bits=4+bucket=1024@16,terngrad@32,efsignsgd@64] [--out results/reference/compress_error]

Writes errors.csv (a row per family and compressor) and summary.md (a row per family and pair).
"""
from __future__ import annotations

import argparse
import csv
import io
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.buildup import gradient_pool  # noqa: E402
from bench.compress_bench import _label, make  # noqa: E402
from gravac.core.errors import UserError  # noqa: E402
from gravac.core.io import atomic_write  # noqa: E402

PAIRS = "qsgd@8,quant:bits=4+bucket=1024@16,terngrad@32,efsignsgd@64"


def layerwise(comp, cf: float, g: torch.Tensor, sizes, seed: int = 1) -> tuple[torch.Tensor, int]:
    """(decoded C(g), wire bytes) with ``comp`` applied to each layer's slice of flat ``g`` alone."""
    out, wire, lo = torch.empty_like(g), 0, 0
    for i, n in enumerate(sizes):
        p = comp.compress(g[lo:lo + n], cf, seed=seed + i)
        out[lo:lo + n] = p.dense().reshape(-1)
        wire += p.wire_bytes()
        lo += n
    return out, wire


def relative_error(comp, cf: float, g: torch.Tensor, sizes, seed: int = 1) -> tuple[float, int]:
    """(||C(g) - g||^2 / ||g||^2, wire bytes) of one layer-wise compression of ``g``."""
    r, wire = layerwise(comp, cf, g, sizes, seed)
    g64 = g.double()
    return float((r.double() - g64).pow(2).sum() / g64.pow(2).sum()), wire


def energy_share(g: torch.Tensor, c: float) -> float:
    """The share of ||g||^2 held by the largest floor(d / c) entries of ``g`` by magnitude."""
    k = max(1, int(g.numel() // c))
    top = torch.topk(g.abs().double(), k, sorted=False).values
    return float(top.pow(2).sum() / g.double().pow(2).sum())


def parse_pairs(text: str) -> list[tuple[str, float]]:
    """'qsgd@8,terngrad@32' -> [('qsgd', 8.0), ('terngrad', 32.0)]: a quantizer and its Top-k CF."""
    pairs = []
    for item in filter(None, text.split(",")):
        spec, at, cf = item.rpartition("@")
        try:
            if not at or float(cf) <= 1:
                raise ValueError("no Top-k CF above 1 after '@'")
            make(spec)
        except (ValueError, KeyError, TypeError) as e:
            raise UserError(f"--pairs entry {item!r} must be <compressor>[:opt=v+...]@<Top-k CF above 1>, "
                            f"e.g. qsgd@8 or quant:bits=4+bucket=1024@16 ({e})") from None
        pairs.append((spec, float(cf)))
    return pairs


def family_rows(family: str, pairs, pool: int, warmup: int, seed: int) -> list[dict]:
    """Every compressor's mean error over the family's gradient pool, and the energy shares."""
    d, sizes, _, grads = gradient_pool(family, pool, warmup, seed)
    rows = []
    for spec, topk_cf in pairs:
        for name, comp, cf in ((spec, make(spec), 1.0), (f"topk@{topk_cf:g}", make("topk"), topk_cf)):
            errs = [relative_error(comp, cf, g, sizes, seed=1 + j * len(sizes)) for j, g in enumerate(grads)]
            rows.append(dict(family=family, numel=d, pair=spec, compressor=name, label=_label(name.split("@")[0]),
                             cf=cf, wire_bytes=round(statistics.fmean(w for _, w in errs)),
                             rel_error=statistics.fmean(e for e, _ in errs), rel_error_min=min(e for e, _ in errs),
                             rel_error_max=max(e for e, _ in errs), top_share=statistics.fmean(
                                 energy_share(g, topk_cf) for g in grads) if name.startswith("topk@") else "",
                             pool=len(grads), warmup=warmup))
    return rows


def summary_md(rows: list[dict], command: str) -> str:
    """One table row per family and pair: the two errors and the energy share."""
    lines = [f"# Compression error at equal wire bytes\n\nMade by `{command}`: the mean over the pool of "
             "||C(g) - g||^2 / ||g||^2, layer by layer, one step, no error feedback (bench/compress_error.py).\n",
             "| family | quantizer | its error | wire bytes | Top-k | its error | wire bytes | share of ‖g‖² in the largest d/CF |",
             "|---|---|---|---|---|---|---|---|"]
    for q, t in zip(rows[0::2], rows[1::2]):
        lines.append(f"| {q['family']} | {q['compressor']} | {q['rel_error']:.4f} | {q['wire_bytes']:,} | "
                     f"{t['cf']:g}x | {t['rel_error']:.4f} | {t['wire_bytes']:,} | {t['top_share']:.1%} |")
    return "\n".join(lines) + "\n"


def write(rows: list[dict], out: Path, command: str) -> None:
    """errors.csv and summary.md, each written whole (atomic_write)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(str(out / "errors.csv"), buf.getvalue())
    atomic_write(str(out / "summary.md"), summary_md(rows, command))


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", default="mini_vgg,mini_resnet,mini_lstm")
    ap.add_argument("--pairs", default=PAIRS, help="quantizer@Top-k CF, comma-separated")
    ap.add_argument("--pool", type=int, default=8, help="real per-worker gradients per family")
    ap.add_argument("--warmup", type=int, default=100, help="dense SGD steps before the pool is drawn")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="results/reference/compress_error")
    return ap.parse_args(argv)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    pairs = parse_pairs(args.pairs)
    torch.set_num_threads(args.threads)
    command = "python bench/compress_error.py " + " ".join(argv if argv is not None else sys.argv[1:])
    rows: list[dict] = []
    for fam in filter(None, args.families.split(",")):
        t0 = time.perf_counter()
        rows += family_rows(fam, pairs, args.pool, args.warmup, args.seed)
        write(rows, Path(args.out), command.strip())          # after every family: a long run keeps what it did
        print(f"{fam}: done in {time.perf_counter() - t0:.0f} s", flush=True)
    print(summary_md(rows, command.strip()))
    return rows


if __name__ == "__main__":
    try:
        main()
    except UserError as e:
        sys.exit(f"compress_error: {e}")
