"""Reading the compression micro-benchmark CSV (bench/compress_bench.py) for paper Table 3.

The reader is tolerant of column names, because the benchmark and this script evolve separately:
- long form: one row per measurement with a column telling direct from multi-level (any text
  column whose values contain "direct" and "multi"), a time column (`*_s`, `*_ms`, `time`,
  `seconds`, `median`, `mean`), a compressor column and a model/size column;
- wide form: a time column whose name contains "direct" and one containing "multi".
Repeated measurements of one (model, compressor, CF) are summarised by their median (and kept, as
`direct_all` / `multi_all`, for the figure's error bars). When the needed columns are missing,
`multilevel_rows` raises `BenchFormatError` with what was found.
"""
from __future__ import annotations

import csv
import math
import statistics

from plots.labels import compressor_label

ENTITY = ("model", "size", "numel", "elements", "n", "tensor", "shape", "params", "parameters")
COMPRESSOR = ("compressor", "name", "algorithm")
CF = ("final_cf", "cf_total", "target_cf", "total_cf", "cf")
TIME_PREF = ("median_s", "time_s", "mean_s", "seconds", "sec", "s", "median", "mean", "time",
             "median_ms", "time_ms", "mean_ms", "ms")


class BenchFormatError(ValueError):
    """The CSV lacks the columns the table needs."""


def read_csv(path: str) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = [r for r in reader]
        return [c for c in (reader.fieldnames or [])], rows


def _float(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _find(cols: list[str], names: tuple) -> str | None:
    low = {c.lower().strip(): c for c in cols}
    return next((low[n] for n in names if n in low), None)


def _time_scale(col: str) -> float:
    return 1e-3 if col.lower().endswith("ms") else 1e-6 if col.lower().endswith("us") else 1.0


def _numeric(rows: list[dict], col: str) -> bool:
    vals = [_float(r.get(col)) for r in rows]
    return bool(vals) and sum(math.isfinite(v) for v in vals) >= max(1, len(vals) // 2)


def multilevel_rows(path: str) -> list[dict]:
    """[{model, compressor, label, cf, direct_s, multilevel_s, speedup, device, threads}] from the
    benchmark CSV; `label` is the compressor's display name, as in every other figure and table."""
    cols, rows = read_csv(path)
    if "kind" in cols:  # bench/compress_bench.py: per-compressor rows and multi-level rows in one file
        rows = [r for r in rows if r.get("kind") == "multilevel"] or rows
    if not rows:
        raise BenchFormatError(f"{path} has no data rows")
    entity, comp, cf = _find(cols, ENTITY), _find(cols, COMPRESSOR), _find(cols, CF)
    if comp is None:
        raise BenchFormatError(f"no compressor column in {path} (columns: {', '.join(cols)})")
    out = _pair(cols, rows, path, entity, comp, cf)
    if not out and cf is not None:     # direct and multi-level rows may name the CF differently
        out = _pair(cols, rows, path, entity, comp, None)
    if not out:
        raise BenchFormatError(f"{path}: no (model, compressor) has both a direct and a multi-level time")
    return out


def _where(rows: list[dict]) -> dict:
    """What the times were measured on: the CSV's device column, else a CPU (bench/compress_bench.py
    times CPU tensors and has no device option), and its torch thread counts when recorded."""
    devices = sorted({str(r["device"]) for r in rows if r.get("device")}) or ["CPU"]
    threads = sorted({int(_float(r.get("threads"))) for r in rows if math.isfinite(_float(r.get("threads")))})
    return {"device": "/".join(devices), "threads": "/".join(map(str, threads))}


def timed_on(rows: list[dict]) -> str:
    """Where multilevel_rows' times were measured, as the table and the figure say it:
    "a CPU (2 threads)", or the CSV's device."""
    device, threads = rows[0].get("device") or "CPU", rows[0].get("threads")
    what = "a CPU" if str(device).upper() == "CPU" else str(device)
    return what + (f" ({threads} thread{'s' if str(threads) != '1' else ''})" if threads else "")


def _pair(cols, rows, path, entity, comp, cf) -> list[dict]:
    """Median direct and multi-level time per (entity, compressor[, CF])."""
    key = lambda r: (r.get(entity, "") if entity else "", r.get(comp, ""), _float(r.get(cf)) if cf else math.nan)
    wide_d = next((c for c in cols if "direct" in c.lower() and _numeric(rows, c)), None)
    wide_m = next((c for c in cols if "multi" in c.lower() and _numeric(rows, c)), None)
    acc: dict[tuple, dict[str, list[float]]] = {}
    if {"direct_repeats_s", "multilevel_repeats_s"} <= set(cols):   # compress_bench: every repeat
        for r in rows:
            d = acc.setdefault(key(r), {"direct": [], "multi": []})
            d["direct"] += [_float(v) for v in str(r["direct_repeats_s"]).split(";") if v]
            d["multi"] += [_float(v) for v in str(r["multilevel_repeats_s"]).split(";") if v]
    elif wide_d and wide_m:
        for r in rows:
            d = acc.setdefault(key(r), {"direct": [], "multi": []})
            d["direct"].append(_float(r[wide_d]) * _time_scale(wide_d))
            d["multi"].append(_float(r[wide_m]) * _time_scale(wide_m))
    else:
        mode = next((c for c in cols if any("direct" in str(r.get(c, "")).lower() for r in rows)
                     and any("multi" in str(r.get(c, "")).lower() for r in rows)), None)
        tcol = _find(cols, TIME_PREF) or next((c for c in cols if c.lower().endswith(("_s", "_ms")) and _numeric(rows, c)), None)
        if mode is None or tcol is None:
            raise BenchFormatError(
                f"{path} has no direct/multi-level rows (need a column with 'direct' and 'multi' values and a "
                f"time column, or columns named *direct* and *multi*; columns: {', '.join(cols)})")
        for r in rows:
            m = str(r.get(mode, "")).lower()
            kind = "direct" if "direct" in m else "multi" if "multi" in m else None
            if kind:
                acc.setdefault(key(r), {"direct": [], "multi": []})[kind].append(_float(r[tcol]) * _time_scale(tcol))
    second = {key(r): r for r in rows} if "recompress_s" in cols and "direct_high_s" in cols else {}
    out = []
    labels = {r[comp]: r["label"] for r in rows if r.get("label")}   # display names, when the CSV has them
    where = _where(rows)
    for (ent, c, f), d in acc.items():
        dv = [x for x in d["direct"] if math.isfinite(x)]
        mv = [x for x in d["multi"] if math.isfinite(x)]
        if not dv or not mv:
            continue
        ds, ms = statistics.median(dv), statistics.median(mv)
        row = {"model": ent or "-", "compressor": c, "label": compressor_label(c, labels.get(c)),
               "cf": f if math.isfinite(f) else "-", "direct_s": ds, "multilevel_s": ms,
               "speedup": ds / ms if ms > 0 else math.nan, "direct_all": dv, "multi_all": mv, **where}
        r2 = second.get((ent, c, f))
        if r2 is not None:  # the second level alone: C(g, final CF) vs recompressing the first payload
            row["high_s"], row["recompress_s"] = _float(r2["direct_high_s"]), _float(r2["recompress_s"])
        out.append(row)
    return out
