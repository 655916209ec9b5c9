"""The paper's tables, as Markdown (to read) and CSV rows (every number, unformatted).

- communication savings (paper Table 4): every baseline (Accordion, Dense, static) against every
  GraVAC setting: floats, wire bytes, modelled and wall seconds to the same target, and their
  ratios (baseline / GraVAC: > 1 means GraVAC sent less or finished sooner);
- static compression (paper Table 2): final metric, mean of the last k evaluations, its
  difference to the target and the speedup of time to target over Top-k 10x, one row per setting;
- direct vs multi-level compression times (paper Table 3), from the micro-benchmark CSV.

Replicas of a setting: every figure of merit is the mean over seeds with a 95% confidence interval
(plots/stats.py; to-target figures over the replicas that reached the target, with how many did),
and each setting gets a verdict against its baselines (plots/merit.py). Speedup and saving cells
are ratios of means. When a baseline never reached the target, its whole run is a lower bound of
what it would have needed, so the ratio is reported as a lower bound ("≥"); when the GraVAC side
never reached it, there is no ratio ("not reached").
"""
from __future__ import annotations

import math

from plots.bench import timed_on
from plots.labels import fmt_delta, fmt_metric, fmt_num, METRIC_SHORT
from plots.merit import (LAST_K, ToTarget, against_baselines, baselines, merit, merit_columns, merit_row,
                         mean_of as _mean, sd_of as _sd, to_target, verdict_columns, verdict_row, verdict_texts,
                         verdicts)
from plots.settings import Context, Group
from plots.stats import CI_SENTENCE, VERDICT_SENTENCE

FIELDS = {"floats": "floats sent", "wire": "wire bytes", "model_s": "modelled s", "wall_s": "wall s",
          "step": "steps"}


def ratio(base: ToTarget, other: ToTarget, f: str) -> tuple[float, str, str]:
    """(base / other, kind, note); kind is "exact", "lower_bound" or "" (no ratio)."""
    if not other.reached:
        return math.nan, "", f"{other.group.label} did not reach the target"
    o = other.mean(f)
    if base.reached:
        b = base.mean(f)
        return (b / o if o > 0 else math.nan), "exact", ""
    b = base.total_mean(f)
    if math.isfinite(b) and o > 0:
        return b / o, "lower_bound", f"{base.group.label} did not reach the target: lower bound from its whole run"
    return math.nan, "", f"{base.group.label} did not reach the target"


def ratio_cell(value: float, kind: str) -> str:
    if kind == "exact" and math.isfinite(value):
        return f"{value:.3g}x"
    if kind == "lower_bound":
        return f"≥ {value:.3g}x (baseline not reached)"
    return "not reached"


def _finite_or_none(x: float) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def md_table(headers: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(out)


def _target_text(ctx: Context) -> str:
    if ctx.target is None:
        return "no target"
    return f"target {METRIC_SHORT.get(ctx.metric, ctx.metric)} {fmt_metric(ctx.target, ctx.metric)}"


def _heading(ctx: Context) -> str:
    lines = [f"### {ctx.title}: {_target_text(ctx)}"]
    if ctx.target_note:
        lines.append(f"\n_{ctx.target_note}_")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# communication savings (paper Table 4)

SAVINGS_COLUMNS = ["context", "metric", "target", "baseline", "gravac", "baseline_runs", "baseline_reached",
                   "gravac_runs", "gravac_reached",
                   "baseline_step", "gravac_step",
                   "baseline_floats", "baseline_floats_sd", "gravac_floats", "gravac_floats_sd",
                   "comm_saving", "comm_saving_kind",
                   "baseline_wire_bytes", "gravac_wire_bytes", "wire_saving", "wire_saving_kind",
                   "baseline_model_s", "gravac_model_s", "model_speedup", "model_speedup_kind",
                   "baseline_wall_s", "gravac_wall_s", "wall_speedup", "wall_speedup_kind", "note",
                   "last_k", "baseline_last_k_metric", "gravac_last_k_metric", *verdict_columns("gravac_vs_baseline")]

_BASELINE_ORDER = {"accordion": 0, "dense": 1, "static": 2}


def savings_pairs(ctx: Context) -> list[tuple[Group, Group]]:
    """(baseline, GraVAC) pairs: Accordion first, then Dense, then every static setting."""
    gravacs = [g for g in ctx.groups if g.method == "gravac"]
    bases = sorted((g for g in ctx.groups if g.method != "gravac"), key=lambda g: _BASELINE_ORDER.get(g.method, 3))
    return [(b, g) for b in bases for g in gravacs]


def savings_table(contexts: list[Context], last_k: int = LAST_K) -> tuple[str, list[dict], list[str]]:
    """(markdown, csv rows, reasons a context had no table); each row also has GraVAC's verdicts
    against the baseline (mean of the last `last_k` evaluations, modelled s to target)."""
    md, rows, why_not = [], [], []
    for ctx in contexts:
        pairs = savings_pairs(ctx)
        if not pairs:
            kinds = {g.method for g in ctx.groups}
            why_not.append(f"{ctx.title}: needs a GraVAC run and a baseline (have: {', '.join(sorted(kinds))})")
            continue
        if ctx.target is None:
            why_not.append(f"{ctx.title}: no target (train.target is 0 in the configs; pass --target)")
            continue
        md_rows = []
        merits = {grp: merit(grp, ctx.target, last_k) for grp in {x for pair in pairs for x in pair}}
        for base, grav in pairs:
            b, g = merits[base].to, merits[grav].to
            verdict = verdicts(merits[grav], merits[base], ctx.higher_is_better, True)
            row = {"context": ctx.title, "metric": ctx.metric, "target": ctx.target, "baseline": base.label,
                   "gravac": grav.label, "baseline_runs": b.n, "baseline_reached": b.reached,
                   "gravac_runs": g.n, "gravac_reached": g.reached}
            notes = []
            for side, s in (("baseline", b), ("gravac", g)):
                row[f"{side}_step"] = s.mean("step") if s.reached else None
                row[f"{side}_floats"] = s.mean("floats") if s.reached else None
                row[f"{side}_floats_sd"] = s.sd("floats") if s.reached > 1 else None
                row[f"{side}_wire_bytes"] = s.mean("wire") if s.reached else None
                row[f"{side}_model_s"] = s.mean("model_s") if s.reached else None
                row[f"{side}_wall_s"] = s.mean("wall_s") if s.reached else None
            cells = {}
            for col, f in (("comm_saving", "floats"), ("wire_saving", "wire"), ("model_speedup", "model_s"),
                           ("wall_speedup", "wall_s")):
                v, kind, note = ratio(b, g, f)
                row[col] = v if math.isfinite(v) else None
                row[f"{col}_kind"] = kind
                cells[col] = ratio_cell(v, kind)
                if note and note not in notes:
                    notes.append(note)
            row["note"] = "; ".join(notes)
            row.update({"last_k": last_k, "baseline_last_k_metric": _finite_or_none(merits[base].last_k.point),
                        "gravac_last_k_metric": _finite_or_none(merits[grav].last_k.point),
                        **verdict_row("gravac_vs_baseline", verdict)})
            rows.append(row)
            md_rows.append([base.label, grav.label, f"{b.reached_text()} / {g.reached_text()}", b.cell("floats"),
                            g.cell("floats"), cells["comm_saving"], cells["wire_saving"], cells["model_speedup"],
                            cells["wall_speedup"], *verdict_texts(verdict, ctx.metric)])
        md.append(_heading(ctx) + "\n\n" + md_table(
            ["Baseline", "GraVAC", "Reached (baseline / GraVAC)", "Floats to target (baseline)",
             "Floats to target (GraVAC)", "Comm. saving", "Wire-bytes saving", "Speedup (modelled)", "Speedup (wall)",
             f"GraVAC vs baseline: last-{last_k} mean", "GraVAC vs baseline: modelled s to target"], md_rows))
    text = ("# Communication savings to the same target (paper Table 4)\n\n"
            "Floats sent per worker until the first evaluation that reaches the target; savings and "
            "speedups are baseline / GraVAC of the means over seeds (> 1: GraVAC sent less or was faster). "
            f"Replicas: mean [95% CI] over the replicas that reached the target. {CI_SENTENCE} "
            f"{VERDICT_SENTENCE}\n\n" + "\n\n".join(md) + "\n")
    return text, rows, why_not


# ----------------------------------------------------------------------------------------------
# static compression (paper Table 2)

STATIC_COLUMNS = ["context", "metric", "target", "setting", "method", "compressor", "cf", "runs", "reached",
                  "final_metric", "final_metric_sd", "best_metric", "delta_to_target", "steps_to_target",
                  "floats_to_target", "model_s_to_target", "wall_s_to_target", "reference",
                  "speedup_model", "speedup_model_kind", "speedup_wall", "speedup_wall_kind", "mean_cf", "note",
                  *merit_columns(), *verdict_columns("vs_dense"), *verdict_columns("vs_reference")]


def mean_cf(group: Group) -> float:
    """Average CF over a setting's runs: dense elements of all steps / floats sent."""
    vals = []
    for run in group.runs:
        floats, cf = run.column("floats_sent"), run.column("cf")
        ok = [(f, c) for f, c in zip(floats, cf) if math.isfinite(f) and math.isfinite(c) and f > 0]
        if ok:
            dense = sum(f * c for f, c in ok)
            vals.append(dense / sum(f for f, _ in ok))
    return _mean(vals)


def _cf_text(group: Group) -> str:
    """The CFs a setting uses, as its method states them (summary `setting.cf_text`)."""
    return str(group.first.setting.get("cf_text", "?"))


def static_table(contexts: list[Context], reference: str, last_k: int = LAST_K) -> tuple[str, list[dict], list[str]]:
    """(markdown, csv rows, notes): one row per setting, speedups over the `reference` setting,
    verdicts against Dense and `reference`."""
    md, rows, notes = [], [], []
    for ctx in (c for c in contexts if c.groups):
        md_rows, bases = [], baselines(ctx, reference)
        if ctx.target is None:
            notes.append(f"{ctx.title}: no target, so no difference to target and no speedups (pass --target)")
        elif ctx.find(reference) is None:
            notes.append(f"{ctx.title}: no '{reference}' run, so no speedups (choose one with --reference)")
        merits = {g: merit(g, ctx.target, last_k) for g in ctx.groups}
        for grp in ctx.groups:
            if not any(r.steps or r.evals for r in grp.runs):
                notes.append(f"{ctx.title}: {grp.label} has no steps and no evaluations (left out)")
                continue
            row, cells = _static_row(ctx, merits[grp], reference)
            for b, v in against_baselines(ctx, merits, grp, reference):
                row.update(verdict_row("vs_dense" if b.method == "dense" else "vs_reference", v))
                cells += verdict_texts(v, ctx.metric)
            rows.append(row)
            md_rows.append(cells)
        if md_rows:
            md.append(_heading(ctx) + "\n\n" + md_table(_static_header(ctx, reference, last_k, bases), md_rows))
    text = (f"# Static compression vs GraVAC (paper Table 2)\n\n"
            f"Final metric (last evaluation), mean of the last {last_k} evaluations, the final metric's difference "
            f"to the target (accuracy in percentage points; for perplexity lower is better), time to the target "
            f"and the speedup over {reference} ({reference}'s mean time / this setting's; > 1 is faster). "
            f"Mean CF sent = dense elements of all steps / floats sent. Values are mean [95% CI] over seeds. "
            f"{CI_SENTENCE} {VERDICT_SENTENCE}\n\n" + "\n\n".join(md) + "\n")
    return text, rows, notes


def _static_header(ctx: Context, reference: str, last_k: int, bases: list[Group]) -> list[str]:
    short = METRIC_SHORT.get(ctx.metric, ctx.metric)
    head = ["Setting", "CF", "Runs", f"Final {short}", f"Last-{last_k} mean", "Δ to target", "Reached",
            "Steps to target", "Modelled s to target", f"Speedup vs {reference} (modelled)", "Wall s to target",
            f"Speedup vs {reference} (wall)", "Floats sent per worker", "Mean CF sent"]
    for b in bases:
        head += [f"vs {b.label}: last-{last_k} mean", f"vs {b.label}: modelled s to target"]
    return head


def _static_row(ctx: Context, m, reference: str) -> tuple[dict, list[str]]:
    """One setting's CSV row (without verdicts) and its Markdown cells."""
    grp, t = m.group, m.to
    ref_group = ctx.find(reference)
    ref = to_target(ref_group, ctx.target) if ref_group and ctx.target is not None else None
    finals = [r.final_metric() for r in grp.runs]
    fm, bm = _mean(finals), _mean([r.best_metric() for r in grp.runs])
    delta = fm - ctx.target if ctx.target is not None else math.nan
    row = {"context": ctx.title, "metric": ctx.metric, "target": ctx.target, "setting": grp.label,
           "method": grp.method, "compressor": grp.first.compressor, "cf": grp.first.cf, "runs": grp.n,
           "reached": t.reached, "final_metric": _finite_or_none(fm), "final_metric_sd": _finite_or_none(_sd(finals)),
           "best_metric": _finite_or_none(bm), "delta_to_target": _finite_or_none(delta),
           **{f"{name}_to_target": t.mean(f) if t.reached else None
              for name, f in (("steps", "step"), ("floats", "floats"), ("model_s", "model_s"), ("wall_s", "wall_s"))},
           "reference": reference if ref is not None else None, **merit_row(m)}
    sp, row_notes = {}, []
    for col, f in (("speedup_model", "model_s"), ("speedup_wall", "wall_s")):
        v, kind, note = ratio(ref, t, f) if ref is not None else (math.nan, "", "")
        sp[col] = ratio_cell(v, kind).replace("baseline", reference) if ref is not None else "—"
        row[col], row[f"{col}_kind"] = _finite_or_none(v), kind
        if note and note not in row_notes:
            row_notes.append(note)
    row["note"] = "; ".join(row_notes)
    row["mean_cf"] = _finite_or_none(mean_cf(grp))
    pct = lambda x: fmt_metric(x, ctx.metric)  # noqa: E731
    cells = [grp.label, _cf_text(grp), str(grp.n), m.final.text(pct), m.last_k.text(pct), fmt_delta(delta, ctx.metric),
             t.reached_text(), t.cell("step", lambda x: f"{x:.0f}"), t.cell("model_s"), sp["speedup_model"],
             t.cell("wall_s"), sp["speedup_wall"], m.floats.text(fmt_num),
             f"{row['mean_cf']:.3g}x" if row["mean_cf"] is not None else "—"]
    return row, cells


# ----------------------------------------------------------------------------------------------
# direct vs multi-level compression (paper Table 3)

MULTILEVEL_COLUMNS = ["model", "compressor", "label", "cf", "direct_s", "multilevel_s", "speedup", "device", "threads"]


def multilevel_table(rows: list[dict], source: str) -> str:
    """Markdown from bench.multilevel_rows() output: both levels, and the second level alone."""
    speed = lambda a, b: f"{a / b:.3g}x" if b > 0 and math.isfinite(a / b) else "—"  # noqa: E731
    second = all("recompress_s" in r for r in rows)
    md_rows = []
    for r in rows:
        row = [str(r["model"]), str(r.get("label") or r["compressor"]), f"{r['cf']:g}x" if isinstance(r["cf"], float) else str(r["cf"]),
               fmt_num(r["direct_s"] * 1e3), fmt_num(r["multilevel_s"] * 1e3), speed(r["direct_s"], r["multilevel_s"])]
        if second:
            row += [fmt_num(r["high_s"] * 1e3), fmt_num(r["recompress_s"] * 1e3), speed(r["high_s"], r["recompress_s"])]
        md_rows.append(row)
    head = ["Model / size", "Compressor", "Final CF", "Direct (ms)", "Multi-level (ms)", "Speedup"]
    text = ("Direct: the gradient compressed at both CFs GraVAC needs, C(g, first CF) + C(g, final CF). "
            "Multi-level: C(g, first CF), then that payload compressed further (GraVAC's g_c = C(g_min, cs)). "
            "Speedup = direct / multi-level.")
    if second:
        head += ["C(g, final CF) (ms)", "Recompress (ms)", "Second level speedup"]
        text += (" The last three columns compare the second level alone: compressing the full gradient to "
                 "the final CF vs recompressing the first level's payload.")
    return (f"# Direct vs multi-level compression (paper Table 3)\n\nFrom `{source}`, timed on {timed_on(rows)}. "
            f"{text}\n\n"
            + md_table(head, md_rows) + "\n")

# ----------------------------------------------------------------------------------------------
# iteration time and scaling factor (MergeComp's comparison), for contexts with scheduler runs

ITERATION_COLUMNS = ["context", "setting", "method", "compressor", "cf", "runs", "steps", "window",
                     "iteration_s", "exposed_comm_s", "single_worker_s", "scaling_factor", "partition", "chosen_at"]


def steady_window(run) -> tuple[int, int]:
    """Steps [a, b) of a run's steady state: after the step a search chose its partition (`chosen`),
    else the last quarter of the run."""
    n = len(run.steps)
    chosen = [i for i, r in enumerate(run.steps) if "chosen" in r]
    return (chosen[-1] + 1 if chosen and chosen[-1] + 1 < n else max(0, n - max(1, n // 4))), n


def iteration_row(ctx: Context, grp: Group) -> dict:
    """Mean steady-state iteration time on the run's clock and the scaling factor
    t_1 / t_N (plots/scaling.py's definition, the papers': single-worker time / iteration time)."""
    its, exp, single, windows = [], [], [], []
    for run in grp.runs:
        a, b = steady_window(run)
        its.append(float(run.column(run.model_key)[a:b].mean()))
        exp.append(float(run.column("exposed_comm_model_s")[a:b].mean()))
        single.append(float(run.single_worker_s()[a:b].mean()))
        windows.append(f"{a}-{b - 1}")
    last = grp.first.steps[-1] if grp.first.steps else {}
    chosen = [r["step"] for r in grp.first.steps if "chosen" in r]
    it, sw = _mean(its), _mean(single)
    return {"context": ctx.title, "setting": grp.label, "method": grp.method, "compressor": grp.first.compressor,
            "cf": grp.first.cf, "runs": grp.n, "steps": len(grp.first.steps), "window": ", ".join(windows),
            "iteration_s": it, "exposed_comm_s": _mean(exp), "single_worker_s": sw,
            "scaling_factor": sw / it if it > 0 else None,
            "partition": " ".join(map(str, last.get("partition", []))), "chosen_at": chosen[-1] if chosen else None}


def iteration_table(contexts: list[Context]) -> tuple[str, list[dict]]:
    """(markdown, csv rows) for every context holding runs that record a `partition`."""
    md, rows = [], []
    for ctx in contexts:
        if not any(r.has_column("partition") for g in ctx.groups for r in g.runs):
            continue
        part = [iteration_row(ctx, g) for g in ctx.groups if any(r.steps for r in g.runs)]
        rows += part
        md.append(f"### {ctx.title}\n\n" + md_table(
            ["Setting", "Runs", "Steady steps", "Iteration (ms)", "Exposed comm (ms)", "Scaling factor (%)",
             "Partition (cuts, backward order)", "Chosen at step"],
            [[r["setting"], str(r["runs"]), r["window"], f"{r['iteration_s'] * 1e3:.2f}",
              f"{r['exposed_comm_s'] * 1e3:.2f}",
              f"{100 * r['scaling_factor']:.1f}" if r["scaling_factor"] is not None else "—",
              r["partition"] or "—", "—" if r["chosen_at"] is None else str(r["chosen_at"])] for r in part]))
    text = ("# Iteration time and scaling factor\n\nSteady-state iteration time on the run's clock (mean "
            "step_overlap_model_s, or step_model_s without overlap, over the steps after a search chose its "
            "partition, else the last quarter of the run), the communication it leaves exposed, and the scaling "
            "factor = cluster throughput / (N × single-worker throughput) = t_1 / t_N, single-worker step time "
            "(forward + backward + optimizer on the same clock, nothing sent) / iteration time; 100% is linear.\n\n" + "\n\n".join(md) + "\n")
    return text, rows
