"""Compare runs or settings side by side: `python -m plots.compare PATH [PATH ...]`.

Each PATH is a run folder or a folder of runs. Runs that differ only in their seed are replicas of
one setting; each setting gets a row with its figures of merit (mean and 95% CI over replicas, n)
and its verdicts against the baseline: the setting of the first run under the first PATH, or
`--baseline LABEL`. Runs of different models, datasets, metrics, cluster sizes or networks are
compared only within their own group (a "context"), since their times and metrics are not
comparable. `--out DIR` also writes the table as CSV and one overlay figure per context (metric
vs modelled time, mean curve and 95% band over replicas).

Example: `python -m plots.compare results/reference/mini_vgg/runs/dense-s* results/reference/mini_vgg/runs/top-k-10x-s*`
"""
from __future__ import annotations

import argparse
import math
import os
import sys

from plots.labels import fmt_delta, fmt_num
from plots.load import find_runs, load_runs, skipped_lines
from plots.merit import LAST_K, Merit, merit, verdicts
from plots.settings import Context, Group, build_contexts, merged_note

COLUMNS = ["context", "setting", "n", "final", "last_k_mean", "floats_per_worker", "floats_vs_baseline",
           "wire_MB_per_worker", "reached", "steps_to_target", "model_s_to_target", "wall_s_to_target",
           "metric_vs_baseline", "time_vs_baseline"]


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m plots.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+", help="run folders, or folders holding runs")
    p.add_argument("--baseline", default=None, help="label of the setting the others are compared with "
                   "(default: the setting of the first run under the first path)")
    p.add_argument("--target", type=float, default=None, help="target metric (default: the runs' train.target; "
                   "an accuracy above 1 is read as a percentage)")
    p.add_argument("--last-k", type=int, default=LAST_K, help=f"evaluations in the last-k mean (default {LAST_K})")
    p.add_argument("--out", default=None, help="also write compare.csv and the overlay figure(s) into this folder")
    args = p.parse_args(argv)
    if args.last_k < 1:
        p.error("--last-k must be at least 1")
    return args


def pick_baseline(ctx: Context, first_run: str | None, label: str | None) -> Group:
    """The context's baseline group: `label` when it names one, else the group of `first_run`, else
    Dense, else the first group."""
    if label is not None:
        return ctx.find(label) or ctx.groups[0]
    by_run = next((g for g in ctx.groups if any(os.path.realpath(r.path) == first_run for r in g.runs)), None)
    return by_run or next((g for g in ctx.groups if g.method == "dense"), ctx.groups[0])


def rows_for(ctx: Context, base: Group, k: int) -> list[dict]:
    """One row per setting of the context, the baseline first."""
    merits = {g: merit(g, ctx.target, k) for g in ctx.groups}
    b = merits[base]
    out = []
    for g in [base] + [g for g in ctx.groups if g is not base]:
        m = merits[g]
        out.append(_row(ctx, m, None if g is base else verdicts(m, b, ctx.higher_is_better, ctx.target is not None), b))
    return out


def _row(ctx: Context, m: Merit, v, b: Merit) -> dict:
    metric = lambda x: f"{100 * x:.2f}" if ctx.metric in ("top1", "top5") and math.isfinite(x) else fmt_num(x)  # noqa: E731
    wire = [t.wire for t in (r.totals() for r in m.group.runs) if t is not None]
    ratio = m.floats.point / b.floats.point if b.floats.point else math.nan
    return {
        "context": ctx.title, "setting": m.group.label, "n": m.group.n,
        "final": m.final.text(metric), "last_k_mean": m.last_k.text(metric),
        "floats_per_worker": m.floats.text(fmt_num), "floats_vs_baseline": f"{ratio:.3g}x" if math.isfinite(ratio) else "—",
        "wire_MB_per_worker": fmt_num(sum(wire) / len(wire) / 1e6) if wire else "—",
        "reached": m.to.reached_text() if ctx.target is not None else "no target",
        "steps_to_target": m.to.cell("step"), "model_s_to_target": m.to.cell("model_s"),
        "wall_s_to_target": m.to.cell("wall_s"),
        "metric_vs_baseline": "baseline" if v is None else v.metric.text(lambda x: fmt_delta(x, ctx.metric)),
        "time_vs_baseline": "baseline" if v is None else v.time.text(),
    }


def print_table(ctx: Context, rows: list[dict], k: int) -> None:
    target = "none" if ctx.target is None else f"{ctx.target:g}"
    print(f"\n{ctx.title} ({ctx.metric}, target {target}; mean [95% CI] over replicas; time vs baseline = the "
          "baseline's modelled seconds to target / this setting's, below 1 is slower)")
    if ctx.target_note:
        print(f"note: {ctx.target_note}")
    if ctx.merged_keys:
        print(f"note: {merged_note(ctx)}")
    heads = {"final": f"final {ctx.metric}", "last_k_mean": f"last-{k} mean",
             "metric_vs_baseline": f"last-{k} vs baseline", "model_s_to_target": "modelled s to target"}
    cols = [c for c in COLUMNS if c != "context"]
    for r in rows:
        print(f"- {r['setting']} (n={r['n']})")
        for c in cols[2:]:
            print(f"    {heads.get(c, c.replace('_', ' ')):24} {r[c]}")


def main(argv=None) -> int:
    args = parse_args(argv)
    run_dirs, _, missing = find_runs(args.paths)
    for m in missing:
        print(f"not found: {m}")
    if not run_dirs:
        print(f"error: no runs found in {', '.join(args.paths)} (a run folder holds steps.jsonl or summary.json)",
              file=sys.stderr)
        return 2
    runs, left_out = load_runs(run_dirs)
    for line in skipped_lines(left_out):
        print(line)
    if not runs:
        print("error: none of the runs could be read (see above)", file=sys.stderr)
        return 2
    contexts = build_contexts(runs, args.target)
    labels = {g.label for c in contexts for g in c.groups}
    if args.baseline is not None and args.baseline not in labels:
        print(f"error: no setting is labelled {args.baseline!r}; settings: {', '.join(sorted(labels))}", file=sys.stderr)
        return 2
    first = os.path.realpath(run_dirs[0])
    table = []
    for ctx in contexts:
        base = pick_baseline(ctx, first, args.baseline if ctx.find(args.baseline or "") else None)
        rows = rows_for(ctx, base, args.last_k)
        print_table(ctx, rows, args.last_k)
        table += rows
    if len(contexts) > 1:
        print(f"\n{len(contexts)} contexts: settings are compared only within their own (model, dataset, metric, "
              "workers, network)")
    if args.out:
        return _write(args.out, contexts, table)
    return 0


def _write(folder: str, contexts: list[Context], table: list[dict]) -> int:
    """compare.md / compare.csv and one overlay figure per context, written atomically into `folder`."""
    from plots import figures
    from plots.output import OutputError, Outputs
    from plots.tables import md_table
    try:
        out = Outputs(folder, ("png",))
    except OutputError as e:
        print(f"error: {e}: give --out a folder you can write to", file=sys.stderr)
        return 2
    out.table("compare", md_table(COLUMNS, [[str(r[c]) for c in COLUMNS] for r in table]) + "\n", table, COLUMNS,
              "the comparison table")
    figures.setup_style()
    for ctx in contexts:
        stem = "compare" + (f"__{ctx.slug}" if len(contexts) > 1 else "")
        out.figure(figures.time_to_accuracy_figure(ctx, "model"), stem, f"metric vs modelled time ({ctx.title})")
    print(f"wrote {', '.join(files for files, _ in out.made)} in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
