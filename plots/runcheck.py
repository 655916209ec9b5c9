"""Checks of a loaded run (plots/load.py): damaged step numbers and settings, and summary.json
cross-checked with the cumulative sums of steps.jsonl. `run` is a plots.load.Run (not imported
here: load imports this module)."""
from __future__ import annotations

import json
import math
from typing import Any


def _num(v: Any) -> float:
    """A float from a record value; None, strings and non-finite JSON become NaN."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    return math.nan


def _bad_step(records: list[dict], name: str) -> str | None:
    """Why a record's `step` is not a step number (absent is a gap, not damage), else None."""
    for i, r in enumerate(records):
        if "step" in r and not _whole(r["step"]):
            return f"{name} record {i + 1}: step={json.dumps(r['step'])} is not a step number"
    return None


def _whole(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 and v == int(v)


def _bad_setting(run) -> str | None:
    """Why the run's settings cannot be read (a number of the wrong kind in config.yaml or
    summary.json), else None; anything else its identity cannot be computed from, too."""
    for key, summary_key, whole in (("cluster.workers", "workers", True), ("compressor.cf", "cf", False),
                                    ("train.target", "target", False)):
        v = run._pick(key, summary_key)
        if v is not None and not (_whole(v) if whole else math.isfinite(_num(v)) and not isinstance(v, bool)):
            kind = "a whole number" if whole else "a number"
            return f"{key}={v!r} is not {kind} ({'config.yaml' if run.cfg(key) is not None else 'summary.json'})"
    try:        # what grouping runs into settings and contexts reads
        run.setting, run.model, run.dataset, run.workers, run.metric, run.network, run.totals(), run.eval_series()
    except Exception as e:  # noqa: BLE001 - a damaged run is reported, never raised
        return f"cannot be read ({type(e).__name__}: {e})"
    return None


def _cross_check(run) -> None:
    """Compare the cumulative sums of steps.jsonl with summary.json; note any disagreement."""
    s = run.summary
    if not s or not run.steps:
        return
    n = s.get("steps")
    if isinstance(n, int) and n != len(run.steps):
        run.problems.append(f"steps.jsonl has {len(run.steps)} of the {n} steps summary.json counts")
        return
    tot = run.totals()
    if tot is None:
        return
    model = "overlap_model_s" if run.model_key == "step_overlap_model_s" else "model_s"
    for key, mine in (("floats_sent", tot.floats), ("wire_bytes", tot.wire), ("step_wall_s", tot.wall_s),
                      (model, tot.model_s)):
        theirs = _num(s.get(key))
        if math.isfinite(theirs) and math.isfinite(mine) and not math.isclose(mine, theirs, rel_tol=1e-6, abs_tol=1e-9):
            run.notes.append(f"summary {key}={theirs:.6g} but steps.jsonl sums to {mine:.6g}")
    tr = s.get("target_reached")
    if isinstance(tr, dict) and run.target is not None:
        hit = run.first_hit(run.target)
        if hit is None or hit.step != tr.get("step"):
            run.notes.append(f"summary target_reached at step {tr.get('step')}, evals.jsonl says "
                             f"{'never' if hit is None else hit.step}")
