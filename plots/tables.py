"""The paper's tables, as Markdown (to read) and CSV rows (every number, unformatted).

- communication savings (paper Table 4): every baseline (Accordion, Dense, static) against every
  GraVAC setting: floats, wire bytes, modelled and wall seconds to the same target, and their
  ratios (baseline / GraVAC: > 1 means GraVAC sent less or finished sooner);
- static compression (paper Table 2): final metric, its difference to the target and the
  speedup of time to target over Top-k 10x, one row per setting;
- direct vs multi-level compression times (paper Table 3), from the micro-benchmark CSV.

Replicas of a setting: values are the mean (± sample standard deviation) over the replicas that
reached the target; ratios are ratios of those means. When a baseline never reached the target,
its whole run is a lower bound of what it would have needed, so the ratio is reported as a lower
bound ("≥"); when the GraVAC side never reached it, there is no ratio ("not reached").
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from plots.bench import timed_on
from plots.labels import fmt_delta, fmt_metric, fmt_num, METRIC_SHORT
from plots.load import Hit
from plots.settings import Context, Group

FIELDS = {"floats": "floats sent", "wire": "wire bytes", "model_s": "modelled s", "wall_s": "wall s",
          "step": "steps"}


# ----------------------------------------------------------------------------------------------
# per-group statistics

def _mean(v: list[float]) -> float:
    v = [x for x in v if math.isfinite(x)]
    return statistics.fmean(v) if v else math.nan


def _sd(v: list[float]) -> float:
    v = [x for x in v if math.isfinite(x)]
    return statistics.stdev(v) if len(v) > 1 else math.nan


@dataclass
class ToTarget:
    """A setting's cumulative figures at the target, over its replicas."""
    group: Group
    hits: list[Hit] = field(default_factory=list)       # replicas that reached the target
    totals: list[Hit] = field(default_factory=list)     # every replica's whole run

    @property
    def n(self) -> int:
        return self.group.n

    @property
    def reached(self) -> int:
        return len(self.hits)

    def values(self, f: str) -> list[float]:
        return [float(getattr(h, f)) for h in self.hits]

    def mean(self, f: str) -> float:
        return _mean(self.values(f))

    def sd(self, f: str) -> float:
        return _sd(self.values(f))

    def total_mean(self, f: str) -> float:
        return _mean([float(getattr(h, f)) for h in self.totals])

    def cell(self, f: str, fmt=fmt_num) -> str:
        """"4.17e11", "4.17e11 ± 2e9 (2/3 reached)" or "not reached (whole run 1.2e9)"."""
        if not self.reached:
            tot = self.total_mean(f)
            return "not reached" + (f" (whole run {fmt(tot)})" if math.isfinite(tot) else "")
        s = fmt(self.mean(f))
        if self.reached > 1 and math.isfinite(self.sd(f)):
            s += f" ± {fmt(self.sd(f))}"
        if self.reached < self.n:
            s += f" ({self.reached}/{self.n} reached)"
        return s


def to_target(group: Group, target: float | None) -> ToTarget:
    out = ToTarget(group)
    for run in group.runs:
        tot = run.totals()
        if tot is not None:
            out.totals.append(tot)
        hit = run.first_hit(target)
        if hit is not None:
            out.hits.append(hit)
    return out


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
                   "baseline_wall_s", "gravac_wall_s", "wall_speedup", "wall_speedup_kind", "note"]

_BASELINE_ORDER = {"accordion": 0, "dense": 1, "static": 2}


def savings_pairs(ctx: Context) -> list[tuple[Group, Group]]:
    """(baseline, GraVAC) pairs: Accordion first, then Dense, then every static setting."""
    gravacs = [g for g in ctx.groups if g.method == "gravac"]
    bases = sorted((g for g in ctx.groups if g.method != "gravac"), key=lambda g: _BASELINE_ORDER.get(g.method, 3))
    return [(b, g) for b in bases for g in gravacs]


def savings_table(contexts: list[Context]) -> tuple[str, list[dict], list[str]]:
    """(markdown, csv rows, reasons a context had no table)."""
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
        for base, grav in pairs:
            b, g = to_target(base, ctx.target), to_target(grav, ctx.target)
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
            rows.append(row)
            md_rows.append([base.label, grav.label, b.cell("floats"), g.cell("floats"), cells["comm_saving"],
                            cells["wire_saving"], cells["model_speedup"], cells["wall_speedup"]])
        md.append(_heading(ctx) + "\n\n" + md_table(
            ["Baseline", "GraVAC", "Floats to target (baseline)", "Floats to target (GraVAC)",
             "Comm. saving", "Wire-bytes saving", "Speedup (modelled)", "Speedup (wall)"], md_rows))
    text = ("# Communication savings to the same target (paper Table 4)\n\n"
            "Floats sent per worker until the first evaluation that reaches the target; savings and "
            "speedups are baseline / GraVAC (> 1: GraVAC sent less or was faster). Replicas: mean ± sd "
            "over the replicas that reached the target.\n\n" + "\n\n".join(md) + "\n")
    return text, rows, why_not


# ----------------------------------------------------------------------------------------------
# static compression (paper Table 2)

STATIC_COLUMNS = ["context", "metric", "target", "setting", "method", "compressor", "cf", "runs", "reached",
                  "final_metric", "final_metric_sd", "best_metric", "delta_to_target", "steps_to_target",
                  "floats_to_target", "model_s_to_target", "wall_s_to_target", "reference",
                  "speedup_model", "speedup_model_kind", "speedup_wall", "speedup_wall_kind", "mean_cf", "note"]


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


def static_table(contexts: list[Context], reference: str) -> tuple[str, list[dict], list[str]]:
    """(markdown, csv rows, notes): one row per setting, speedups over the `reference` setting."""
    md, rows, notes = [], [], []
    for ctx in contexts:
        if not ctx.groups:
            continue
        ref_group = ctx.find(reference)
        ref = to_target(ref_group, ctx.target) if ref_group and ctx.target is not None else None
        if ctx.target is None:
            notes.append(f"{ctx.title}: no target, so no difference to target and no speedups (pass --target)")
        elif ref_group is None:
            notes.append(f"{ctx.title}: no '{reference}' run, so no speedups (choose one with --reference)")
        md_rows = []
        for grp in ctx.groups:
            if not any(r.steps or r.evals for r in grp.runs):
                notes.append(f"{ctx.title}: {grp.label} has no steps and no evaluations (left out)")
                continue
            t = to_target(grp, ctx.target)
            finals = [r.final_metric() for r in grp.runs]
            bests = [r.best_metric() for r in grp.runs]
            fm, fsd = _mean(finals), _sd(finals)
            delta = fm - ctx.target if ctx.target is not None else math.nan
            row = {"context": ctx.title, "metric": ctx.metric, "target": ctx.target, "setting": grp.label,
                   "method": grp.method, "compressor": grp.first.compressor, "cf": grp.first.cf,
                   "runs": grp.n, "reached": t.reached,
                   "final_metric": fm if math.isfinite(fm) else None,
                   "final_metric_sd": fsd if math.isfinite(fsd) else None,
                   "best_metric": _mean(bests) if math.isfinite(_mean(bests)) else None,
                   "delta_to_target": delta if math.isfinite(delta) else None,
                   "steps_to_target": t.mean("step") if t.reached else None,
                   "floats_to_target": t.mean("floats") if t.reached else None,
                   "model_s_to_target": t.mean("model_s") if t.reached else None,
                   "wall_s_to_target": t.mean("wall_s") if t.reached else None,
                   "reference": reference if ref is not None else None}
            sp, row_notes = {}, []
            for col, f in (("speedup_model", "model_s"), ("speedup_wall", "wall_s")):
                if ref is None:
                    v, kind, note = math.nan, "", ""
                    sp[col] = "—"
                else:
                    v, kind, note = ratio(ref, t, f)
                    sp[col] = ratio_cell(v, kind).replace("baseline", reference)
                row[col] = v if math.isfinite(v) else None
                row[f"{col}_kind"] = kind
                if note and note not in row_notes:
                    row_notes.append(note)
            row["note"] = "; ".join(row_notes)
            mc = mean_cf(grp)
            row["mean_cf"] = mc if math.isfinite(mc) else None
            rows.append(row)
            final = fmt_metric(fm, ctx.metric)
            if grp.n > 1 and math.isfinite(fsd):
                final += f" ± {fmt_delta(fsd, ctx.metric).lstrip('+')}"
            md_rows.append([grp.label, _cf_text(grp), str(grp.n), final, fmt_delta(delta, ctx.metric),
                            t.cell("step", lambda x: f"{x:.0f}"), t.cell("model_s"), sp["speedup_model"],
                            t.cell("wall_s"), sp["speedup_wall"], f"{mc:.3g}x" if math.isfinite(mc) else "—"])
        if not md_rows:
            continue
        md.append(_heading(ctx) + "\n\n" + md_table(
            ["Setting", "CF", "Runs", f"Final {METRIC_SHORT.get(ctx.metric, ctx.metric)}", "Δ to target",
             "Steps to target", "Modelled s to target", f"Speedup vs {reference} (modelled)",
             "Wall s to target", f"Speedup vs {reference} (wall)", "Mean CF sent"], md_rows))
    text = (f"# Static compression vs GraVAC (paper Table 2)\n\n"
            f"Final metric (last evaluation), its difference to the target (accuracy in percentage points; "
            f"for perplexity lower is better), time to the target and the speedup over {reference} "
            f"({reference}'s time / this setting's time; > 1 is faster). Mean CF sent = dense elements "
            f"of all steps / floats sent.\n\n" + "\n\n".join(md) + "\n")
    return text, rows, notes


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
