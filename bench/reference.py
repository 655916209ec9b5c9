"""Curate a study's raw runs into results/reference/: small, committed, and enough to redraw every figure.

    python bench/reference.py [RAW ...] [--out results/reference] [--last-k 3]
                              [--experiments mini_vgg,mini_resnet,mini_lstm] [--bench results/compress_bench.csv]

For each study experiment, every completed run under RAW (default results/runs) is copied to
OUT/<experiment>/runs/<setting>-s<seed>/ (<context>--<setting>-s<seed> when the experiment spans
several cluster sizes or networks) with its config.yaml, command.txt, summary.json, evals.jsonl,
its full per-step record gzipped (steps.jsonl.gz: cumulative sums stay exact) and origin.txt (the
raw run folder's name, kept through re-curation; runs.csv's `run` column).
OUT/<experiment>/runs.csv gets one row per run, OUT/<experiment>/curves.csv every run downsampled
to every --every steps plus its evaluations, and OUT/summary.md one table per experiment (per
setting the mean [95% CI] over seeds and verdicts against Dense and Top-k 10x; the numbers
REPRODUCING.md quotes). Then plots/paper.py draws the figures and tables from the curated copies
(not the raw runs) into OUT/plots/, so what is committed redraws itself.
Incomplete and damaged runs (as plots/paper.py reads them) and older duplicates of a setting and
seed are listed and left out. OUT is
replaced in one rename at the end: an interrupted call leaves the previous reference intact. Folders
of OUT that belong to other studies (gain_probe/, gain_arms/, exdyna/, ...) are carried over as they are.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import io
import math
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from plots import paper  # noqa: E402
from plots.labels import fmt_metric, fmt_num  # noqa: E402
from plots.load import Run, find_runs, load_run  # noqa: E402
from plots.output import OutputError, make_folder  # noqa: E402
from plots.settings import Context, build_contexts, merged_note, relevant_settings  # noqa: E402
from plots.merit import LAST_K, against_baselines, baselines, last_k_mean, merit, verdict_texts  # noqa: E402
from plots.stats import CI_SENTENCE, VERDICT_SENTENCE, estimate  # noqa: E402
from plots.tables import ratio, ratio_cell  # noqa: E402

STUDY = ("mini_vgg", "mini_resnet", "mini_lstm")
COPIED = ("config.yaml", "command.txt", "summary.json", "evals.jsonl")
RUN_COLUMNS = ["experiment", "setting", "seed", "run", "method", "compressor", "cf", "epsilon", "policy", "steps",
               "metric", "final_metric", "best_metric", "target", "target_step", "floats_sent", "floats_to_target",
               "floats_vs_dense", "model_s", "model_s_to_target", "wall_s", "wall_s_to_target", "run_wall_s",
               "mean_gain", "cf_histogram", "last_k", "last_k_metric"]
CURVE_COLUMNS = ["experiment", "setting", "seed", "step", "loss", "cf", "floats_cum", "model_s_cum", "wall_s_cum",
                 "metric"]


def parse_args(argv):
    p = argparse.ArgumentParser(prog="bench/reference.py", description=__doc__.split("\n\n")[0])
    p.add_argument("raw", nargs="*", default=["results/runs"], help="folders holding the raw runs")
    p.add_argument("--out", default="results/reference")
    p.add_argument("--experiments", default=",".join(STUDY), help="experiment.name values to curate")
    p.add_argument("--bench", default="results/compress_bench.csv", help="compression benchmark CSV (Table 3)")
    p.add_argument("--every", type=int, default=10, help="curves.csv keeps every N-th step (default 10)")
    p.add_argument("--last-k", type=int, default=LAST_K,
                   help="headline metric: mean of each run's last K evaluations (default 3)")
    return p.parse_args(argv)


def select(raw: list[str], experiments: list[str]) -> tuple[dict[str, list[Run]], list[str]]:
    """Completed runs per experiment (newest of each setting+seed) and what was left out, with why."""
    dirs, _, missing = find_runs(raw)
    left = [f"{m}: does not exist" for m in missing]
    picked: dict[str, dict[tuple, Run]] = {e: {} for e in experiments}
    for d in sorted(dirs, key=lambda p: os.path.basename(os.path.normpath(p))):  # run ids start with the time
        run = load_run(d)                   # as plots/paper.py loads it: never raises, says what is damaged
        exp = run.cfg("experiment.name")
        if not isinstance(exp, str) or exp not in picked:
            continue
        if run.damage:
            left.append(f"{d}: damaged ({run.damage})")
            continue
        if run.status != "completed" or run.problems:
            left.append(f"{d}: incomplete ({'; '.join(run.problems) or run.status})")
            continue
        key = (repr(sorted(relevant_settings(run).items())), run.cfg("train.seed", 0))
        if key in picked[exp]:
            left.append(f"{picked[exp][key].path}: replaced by the newer run {d}")
        picked[exp][key] = run
    return {e: list(v.values()) for e, v in picked.items()}, left


def _num(x) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return ""
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def origin(run: Run) -> str:
    """The raw run folder's name: a curated copy keeps it in origin.txt, so a re-curation still
    names the run that produced the numbers."""
    path = os.path.join(run.path, "origin.txt")
    if os.path.exists(path):
        with open(path) as f:
            return f.read().strip() or run.name
    return run.name


def run_row(exp: str, setting: str, run: Run, target: float | None, k: int = LAST_K) -> dict:
    """One runs.csv row: what the run reached, what it sent and how long it took, totals and to target."""
    tot, hit = run.totals(), run.first_hit(target)
    params = (run.summary or {}).get("parameters")
    gains = [g for g in run.column("gain") if math.isfinite(g)] if run.has_column("gain") else []
    hist = (run.summary or {}).get("cf_histogram") or {}
    return {
        "experiment": exp, "setting": setting, "seed": run.cfg("train.seed", 0), "run": origin(run),
        "method": run.method, "compressor": run.compressor if run.method != "dense" else "none",
        "cf": _num(run.cf), "epsilon": _num(run.cfg("method.epsilon")) if run.method == "gravac" else "",
        "policy": run.cfg("method.policy") if run.method == "gravac" else "",
        "steps": len(run.steps), "metric": run.metric, "final_metric": _num(run.final_metric()),
        "best_metric": _num(run.best_metric()), "target": _num(target), "target_step": hit.step if hit else "",
        "floats_sent": _num(tot.floats), "floats_to_target": _num(hit.floats) if hit else "",
        "floats_vs_dense": _num(params * len(run.steps) / tot.floats) if params and tot.floats else "",
        "model_s": _num(tot.model_s), "model_s_to_target": _num(hit.model_s) if hit else "",
        "wall_s": _num(tot.wall_s), "wall_s_to_target": _num(hit.wall_s) if hit else "",
        "run_wall_s": _num((run.summary or {}).get("wall_s")),
        "mean_gain": _num(sum(gains) / len(gains)) if gains else "",
        "cf_histogram": ";".join(f"{c}:{v}" for c, v in hist.items()),
        "last_k": k, "last_k_metric": _num(last_k_mean(run, k)),
    }


def curve_rows(exp: str, setting: str, run: Run, every: int) -> list[dict]:
    """Every `every`-th step (bucket means of loss and CF, cumulative totals) plus each evaluation."""
    loss, cf = run.column("loss"), run.column("cf")
    floats, model, wall = (run.cumulative(k) for k in ("floats_sent", run.model_key, "step_wall_s"))
    evals = dict(zip(*(a.tolist() for a in run.eval_series())))
    rows, seed = [], run.cfg("train.seed", 0)
    for done in range(1, len(run.steps) + 1):
        if done % every and done not in evals and done != len(run.steps):
            continue
        lo = max(0, done - every)
        rows.append({"experiment": exp, "setting": setting, "seed": seed, "step": done,
                     "loss": _num(float(loss[lo:done].mean())), "cf": _num(float(cf[lo:done].mean())),
                     "floats_cum": _num(float(floats[done - 1])), "model_s_cum": _num(float(model[done - 1])),
                     "wall_s_cum": _num(float(wall[done - 1])), "metric": _num(evals.get(done))})
    return rows


def copy_run(run: Run, dest: str) -> None:
    """The run's small files as they are, and its per-step record gzipped (byte-stable: no mtime);
    a run curated before (only steps.jsonl.gz) is copied as it is. origin.txt names the raw run."""
    os.makedirs(dest)
    with open(os.path.join(dest, "origin.txt"), "w") as f:
        f.write(origin(run) + "\n")
    for name in COPIED:
        src = os.path.join(run.path, name)
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(dest, name))
    src = os.path.join(run.path, "steps.jsonl")
    if not os.path.exists(src):             # an already curated run: its gzipped record as it is
        shutil.copyfile(src + ".gz", os.path.join(dest, "steps.jsonl.gz"))
        return
    with open(src, "rb") as f, open(os.path.join(dest, "steps.jsonl.gz"), "wb") as out:
        with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=9, mtime=0, filename="") as gz:
            shutil.copyfileobj(f, gz)


def write_csv(path: str, rows: list[dict], columns: list[str]) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    with open(path, "w") as f:
        f.write(buf.getvalue())


REFERENCE = "Top-k 10x"


def summary_header(ctx: Context, k: int) -> list[str]:
    head = ["setting", "seeds", "final", f"last-{k} mean", "best", "reached", "target at step", "floats sent",
            "fewer floats than dense", "floats to target", "modelled s to target", f"speedup vs {REFERENCE}"]
    for b in baselines(ctx, REFERENCE):
        head += [f"vs {b.label}: last-{k} mean", f"vs {b.label}: modelled s to target"]
    return head + ["Σ step wall s", "run wall s"]


def _ci(values: list, fmt) -> str:
    """Mean [95% CI] of a per-run quantity (the value alone for one seed); "—" when none is finite."""
    return estimate(values).text(fmt)


def summary_table(exp: str, ctx: Context, k: int = LAST_K) -> str:
    """Markdown: one line per setting, mean [95% CI] over its seeds, and its verdicts against Dense and
    Top-k 10x. The to-target cells, speedup and verdicts are plots/tables.py's (the Table 2
    definitions), so the two cannot disagree."""
    pct = (lambda x: fmt_metric(x, ctx.metric))
    merits = {g: merit(g, ctx.target, k) for g in ctx.groups}
    ref = ctx.find(REFERENCE)
    target = fmt_metric(ctx.target, ctx.metric) if ctx.target is not None else "none"
    head = summary_header(ctx, k)
    lines = [f"### {exp} (metric {ctx.metric}, target {target})", "",
             *([f"Note: {merged_note(ctx)}.", ""] if ctx.merged_keys else []),
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for g in ctx.groups:
        m, t = merits[g], merits[g].to
        totals = [r.totals() for r in g.runs]
        vs_dense = [(r.summary or {}).get("parameters", math.nan) * len(r.steps) / tot.floats
                    for r, tot in zip(g.runs, totals) if tot is not None and tot.floats > 0]
        speed = ratio_cell(*ratio(merits[ref].to, t, "model_s")[:2]) if ref else "—"
        cells = [g.label, str(g.n), m.final.text(pct), m.last_k.text(pct), _ci([r.best_metric() for r in g.runs], pct),
                 t.reached_text(), t.cell("step"), m.floats.text(fmt_num), _ci(vs_dense, lambda x: fmt_num(x) + "x"),
                 t.cell("floats"), t.cell("model_s"), speed]
        for _, v in against_baselines(ctx, merits, g, REFERENCE):
            cells += verdict_texts(v, ctx.metric)
        cells += [_ci([x.wall_s for x in totals if x], fmt_num),
                  _ci([(r.summary or {}).get("wall_s") for r in g.runs], fmt_num)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def summary_intro(k: int) -> str:
    """summary.md's heading and the paragraph saying what its tables hold and how they are computed."""
    return ("# Study summary\n\nMade by `python bench/reference.py` from the runs in this folder. Per setting: "
            f"mean [95% CI] over seeds; 'last-{k} mean' is the mean of each run's last {k} evaluations, the "
            f"headline metric. {CI_SENTENCE} {VERDICT_SENTENCE} Floats are per worker; 'to target' is at the first "
            "evaluation reaching the target; modelled s = Σ over steps of the run's modelled step time (compute + "
            "compression + alpha-beta communication at the experiment's network, overlapped with backward as DDP "
            "does when the run's clock overlaps; each run's summary.json `clock` says which and where compute and "
            "compression times came from); speedup vs Top-k 10x = its modelled s to target / this setting's; run "
            "wall s includes start-up and evaluation, with two runs sharing the 2 cores. 'To target' cells of "
            "settings where some seeds missed the target average the seeds that reached it and say so.\n\n")


def curate(exp: str, runs: list[Run], out: str, every: int, k: int = LAST_K) -> tuple[list[dict], str]:
    """Copy one experiment's runs, write its runs.csv and curves.csv; returns the rows and its summary."""
    rows, curves, summary = [], [], []
    contexts = build_contexts(runs)
    for ctx in contexts:
        summary.append(summary_table(exp, ctx, k))
        prefix = f"{ctx.slug}--" if len(contexts) > 1 else ""       # several cluster sizes or networks
        for g in ctx.groups:
            for run in g.runs:
                name = f"{prefix}{g.slug}-s{run.cfg('train.seed', 0)}"
                copy_run(run, os.path.join(out, exp, "runs", name))
                rows.append(run_row(exp, g.label, run, ctx.target, k))
                curves += curve_rows(exp, g.label, run, every)
    write_csv(os.path.join(out, exp, "runs.csv"), rows, RUN_COLUMNS)
    write_csv(os.path.join(out, exp, "curves.csv"), curves, CURVE_COLUMNS)
    return rows, "\n".join(summary)


def draw(folder: str, sources: list[str], k: int = LAST_K) -> int:
    """plots/paper.py on the curated copies, run inside `folder` so its index names relative paths."""
    here = os.getcwd()
    os.chdir(folder)
    try:
        no_bench = [] if "compress_bench.csv" in sources else ["--no-bench"]  # never one found above
        return paper.main(sources + ["--out", "plots", "--formats", "png", "--figures", "all", "--last-k", str(k),
                                      *no_bench])
    finally:
        os.chdir(here)


def main(argv=None) -> int:
    args = parse_args(argv)
    experiments = [e for e in args.experiments.split(",") if e]
    chosen, left = select(args.raw, experiments)
    for why in left:
        print(f"left out: {why}")
    if not any(chosen.values()):
        print(f"error: no completed run of {', '.join(experiments)} under {', '.join(args.raw)}; run the study "
              "first (REPRODUCING.md)", file=sys.stderr)
        return 2
    out = os.path.normpath(args.out)
    tmp = out + ".new"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if os.path.exists(out) and not os.path.isdir(out):
            raise OutputError(f"output folder {out} is a file, not a folder")
        make_folder(tmp)
    except OutputError as e:            # the same line as plots/paper.py's
        print(f"error: {e}: give --out a folder you can write to (it is made if missing)", file=sys.stderr)
        return 2
    sources, tables = [], []
    for exp in experiments:
        if chosen[exp]:
            rows, summary = curate(exp, chosen[exp], tmp, args.every, args.last_k)
            print(f"{exp}: {len(rows)} run(s)")
            sources.append(os.path.join(exp, "runs"))
            tables.append(summary)
        else:
            print(f"{exp}: no completed run")
    with open(os.path.join(tmp, "summary.md"), "w") as f:
        f.write(summary_intro(args.last_k) + "\n".join(tables))
    if args.bench and os.path.exists(args.bench):
        shutil.copyfile(args.bench, os.path.join(tmp, "compress_bench.csv"))
        sources.append("compress_bench.csv")
    code = draw(tmp, sources, args.last_k)
    if code:
        print("error: plots/paper.py could not draw from the curated runs; the previous reference is kept",
              file=sys.stderr)
        return code
    keep_other_studies(out, tmp, set(experiments) | set(STUDY) | {"plots"})
    old = out + ".old"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(out):
        os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
    print(f"reference written to {out}")
    return 0


def keep_other_studies(out: str, tmp: str, ours: set[str]) -> None:
    """Copy into the new reference every folder of the old one this curation does not make (other studies
    curated into subfolders of OUT, e.g. with --out results/reference/gain_arms), so a rerun never deletes them."""
    if not os.path.isdir(out):
        return
    kept = [e.name for e in os.scandir(out) if e.is_dir() and e.name not in ours and not os.path.exists(
        os.path.join(tmp, e.name))]
    for name in sorted(kept):
        shutil.copytree(os.path.join(out, name), os.path.join(tmp, name), symlinks=True)
    if kept:
        print(f"kept as they were (other studies): {', '.join(sorted(kept))}")


if __name__ == "__main__":
    sys.exit(main())
