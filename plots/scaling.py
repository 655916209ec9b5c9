"""Iteration time and scaling factor across cluster sizes, from any runs' per-step records.

One row per (model, dataset, network, setting, N): the mean modelled iteration time (the run's
clock: step_overlap_model_s when it overlapped), its exposed communication and compression time,
the CF (parameters / mean floats sent), and the scaling factor t_1 / t_N = cluster throughput /
(N × single-worker throughput), the MergeComp and COVAP papers' definition, in % (100 = linear), where
t_1 = compute + optimizer on the same clock (`Run.single_worker_s`, shared with plots/tables.py). Step 0 is left out of every mean (a
method may profile there, as COVAP's drop_rate=auto).
"""
from __future__ import annotations

from plots.tables import md_table

COLUMNS = ["model", "dataset", "network", "setting", "workers", "runs", "iteration_ms", "single_worker_ms",
           "scaling_factor", "exposed_comm_ms", "compress_ms", "cf"]


def _steady(v) -> float:
    """Mean of per-step values without step 0 (unless it is the only one)."""
    return float((v[1:] if len(v) > 1 else v).mean())


def _mean(run, key: str) -> float:
    return _steady(run.column(key))


def _cf(run) -> float:
    """Parameters / mean floats sent per step (a mean of per-step CFs would let rare near-empty
    steps dominate)."""
    params = (run.summary or {}).get("parameters")
    floats = _mean(run, "floats_sent")
    return params / floats if params and floats else float("nan")


def row(run) -> dict:
    """The run's mean iteration time, single-worker time and what made the difference."""
    t = _mean(run, run.model_key)
    single = _steady(run.single_worker_s())
    net = run.network
    bw = f"{net.get('bandwidth_gbps', '?'):g} Gbit/s" if net.get("enabled", True) else "off"
    if run.cfg("network.buckets"):                  # DDP buckets by count instead of bucket_cap_mb
        bw += f", {run.cfg('network.buckets')} buckets"
    exposed = _mean(run, "exposed_comm_model_s") if run.has_column("exposed_comm_model_s") else float("nan")
    return {"model": run.model, "dataset": run.dataset, "network": bw, "setting": run.setting.get("label", run.method),
            "workers": run.workers, "runs": 1, "iteration_ms": 1e3 * t, "single_worker_ms": 1e3 * single,
            "exposed_comm_ms": 1e3 * exposed,
            "compress_ms": 1e3 * _mean(run, "compress_model_s"), "cf": _cf(run)}


def scaling_table(runs: list) -> tuple[str, list[dict]]:
    """Markdown and rows (replicas of a cell averaged); runs without modelled times are left out."""
    cells: dict[tuple, list[dict]] = {}
    for run in runs:
        if not (run.has_column("step_model_s") and run.has_column("compress_model_s") and len(run.steps)):
            continue
        r = row(run)
        cells.setdefault(tuple(r[k] for k in COLUMNS[:5]), []).append(r)
    rows = []
    for key in sorted(cells, key=lambda k: (k[0], k[2], k[3], k[4] or 0)):
        group = cells[key]
        avg = {k: sum(g[k] for g in group) / len(group) for k in COLUMNS[6:] if k != "scaling_factor"}
        avg["scaling_factor"] = avg["single_worker_ms"] / avg["iteration_ms"]    # of the means, as tables.py
        rows.append({**dict(zip(COLUMNS[:5], key)), "runs": len(group), **avg})
    body = [[r["model"], r["network"], r["setting"], str(r["workers"]), f"{r['iteration_ms']:.1f}",
             f"{100 * r['scaling_factor']:.1f}", f"{r['exposed_comm_ms']:.1f}", f"{r['compress_ms']:.2f}",
             f"{r['cf']:.3g}"] for r in rows]
    head = ["model", "network", "setting", "N", "iteration ms", "scaling factor t_1/t_N (%)", "exposed comm ms",
            "compress ms", "CF (params / mean floats)"]
    return md_table(head, body), rows
