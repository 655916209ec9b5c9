"""Regenerate the GraVAC paper's figures and tables from run folders.

    python plots/paper.py RESULTS_DIR... --out FOLDER [--figures overview|all] [--target T]
                          [--reference "Top-k 10x"] [--bench results/compress_bench.csv] [--smooth N]

RESULTS_DIR may be a run folder, an experiment or multirun folder (searched recursively for
folders holding steps.jsonl or summary.json; when runs lie in several folders below it, each of
those is a study, drawn apart), or the benchmark CSV. Writes PNG figures (one per context, or the
paper's full set with --figures all), Markdown+CSV tables and an index README.md into --out,
prints a screenful on what was read, made, left out (no steps, damaged, runs 10x shorter than
their context's) and not made (and why), and exits 0 when anything was made; non-zero with one
line when no run was found or --out cannot take files.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter

if __package__ in (None, ""):  # run as `python plots/paper.py`: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from plots import bench, figures, scaling, tables  # noqa: E402
from plots.load import assign_studies, find_runs, load_runs, skipped_lines  # noqa: E402
from plots.settings import Context, Group, build_contexts, merged_note, split_parts, without_short_runs  # noqa: E402
from plots.output import OutputError, Outputs  # noqa: E402

CONVENTIONS = """
- Floats sent and wire bytes are per worker; cumulative values are sums over steps.jsonl.
- Target reached = the first evaluation whose metric reaches the target (≥; ≤ for perplexity).
  Floats, bytes and times to target are taken at that evaluation's step, not interpolated
  between evaluations (the same point summary.json's target_reached records).
- Wall time = Σ step_wall_s (compute + compression + measured communication + optimizer);
  modelled time = Σ step_overlap_model_s (a DDP-like schedule: buckets or a method's pieces sent
  while backward runs) for runs whose clock overlapped (network.overlap, the default), else
  Σ step_model_s (compute + compression + alpha-beta modelled communication, in series; runs
  recorded before the clock existed used measured compute). Evaluation time is excluded from both.
  The network model and its parameters are in the time-to-accuracy subtitles.
- Savings and speedups are baseline / GraVAC (or reference / setting): > 1 favours GraVAC (the
  setting). A baseline that never reached the target gives a lower bound (≥), computed from its
  whole run; a GraVAC run (setting) that never reached it gives "not reached".
- Runs that differ only in seeds (train.seed, dataset.seed), paths, logging or options their
  method ignores are replicas of one setting: figures draw the mean with a shaded 95% confidence
  band of the mean over seeds; tables give the mean [95% CI] (to-target figures over the replicas
  that reached the target, with how many did), and ratios of those means. "(n=3)" in a legend is
  the number of replicas.
- 95% CI: percentile bootstrap of the mean over seeds (scipy.stats.bootstrap, 10 000 resamples,
  fixed seed, so outputs regenerate byte-identically); one seed has no CI.
- Verdicts (static and savings tables): each setting against Dense and the --reference setting,
  on the mean of the last --last-k evaluations and the modelled s to target, from a two-sample
  bootstrap 95% CI of the difference of means (metric) or of the ratio baseline / setting (time):
  "better"/"faster" or "worse"/"slower" only when the CI excludes 0 (1), else "not distinguishable
  at 95%"; "one seed: not tested" when either side has one seed. P is the probability of
  improvement (Mann-Whitney U / (n·m), ties half). A replica that missed the target counts with its
  whole run (a lower bound); a verdict such replicas could overturn (the side with misses comes out
  faster) reads "not distinguishable (censored)"; a setting that never reached it against a
  baseline that always did reads "slower (never reached)" when its whole runs alone are already
  slower (and "faster (baseline never reached)" the other way round).
- Accuracy is shown in percent; differences to the target in percentage points.
- Compression gains of static runs are drawn as a trailing moving average (window in the
  subtitle); GraVAC's δ are drawn as recorded (already EWMA-smoothed).
"""


def parse_args(argv):
    p = argparse.ArgumentParser(prog="plots/paper.py", description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="*", default=["results/runs"],
                   help="run folders, experiment/multirun folders or the benchmark CSV (default results/runs)")
    p.add_argument("--out", default="results/paper", help="output folder (default results/paper)")
    p.add_argument("--target", type=float, default=None,
                   help="target metric value for every context (default: the runs' train.target); "
                        "accuracy as a fraction (0.8) or percent (80)")
    p.add_argument("--reference", default="Top-k 10x", help="setting the static table's speedups refer to")
    p.add_argument("--bench", default=None, help="compression benchmark CSV (default: the nearest "
                                                 "compress_bench*.csv in or above the results folders, up to "
                                                 "results/, else results/compress_bench.csv)")
    p.add_argument("--no-bench", action="store_true",
                   help="no Table 3: do not look for a benchmark CSV (bench/reference.py without one)")
    p.add_argument("--last-k", type=int, default=3,
                   help="the tables' headline metric is the mean of each run's last K evaluations (default 3)")
    p.add_argument("--smooth", type=int, default=0, help="moving-average window of static gains (0: auto)")
    p.add_argument("--figures", choices=("overview", "all"), default="overview",
                   help="overview (default): one figure per context, metric vs modelled cluster time (cumulative "
                        "floats sent when its runs have no evaluations); all: every figure of the paper (floats, "
                        "wire bytes, wall and modelled time, iterations, gains, each GraVAC and Accordion setting's "
                        "CF and T_compression)")
    p.add_argument("--formats", default="png",
                   help="figure formats, comma-separated (default png; pdf embeds TrueType fonts, for a paper, and "
                        "takes twice as long)")
    p.add_argument("--debug", action="store_true", help="raise instead of reporting unexpected errors")
    return p.parse_args(argv)


def find_bench_csv(args, csvs: list[str]) -> str | None:
    """The benchmark CSV for Table 3: --bench when given, else one named among the results, else
    the nearest compress_bench*.csv in a results folder or above it (up to the `results` folder
    holding it, so `results/runs/<experiment>` finds `results/compress_bench.csv`), else
    results/compress_bench.csv under the current folder."""
    if args.no_bench:
        return None
    if args.bench:
        return args.bench
    if csvs:
        return csvs[0]
    for d in args.results:
        for folder in _bench_folders(os.path.abspath(d)):
            found = sorted(n for n in os.listdir(folder) if n.startswith("compress_bench") and n.endswith(".csv"))
            if found:
                return os.path.join(folder, found[0])
    default = os.path.join("results", "compress_bench.csv")
    return default if os.path.isfile(default) else None


def _bench_folders(path: str) -> list[str]:
    """`path` and its parents up to the nearest one named `results`; without one, `path` and its
    parent."""
    chain = [path]
    while os.path.basename(chain[-1]) != "results" and os.path.dirname(chain[-1]) != chain[-1]:
        chain.append(os.path.dirname(chain[-1]))
    if os.path.basename(chain[-1]) != "results":
        chain = chain[:2]
    return [f for f in chain if os.path.isdir(f)]


def _attempt(out: Outputs, what: str, debug: bool, fn, *a, **kw):
    """Run fn; a Skip or unexpected error becomes a 'not made' entry instead of a traceback, and a
    figure it opened before giving up is closed (left open, they piled up over many contexts)."""
    import matplotlib.pyplot as plt
    before = set(plt.get_fignums())
    try:
        return fn(*a, **kw)
    except figures.Skip as e:
        out.skip(what, str(e))
    except Exception as e:  # noqa: BLE001 - reported, the other outputs still get made
        if debug:
            raise
        out.skip(what, f"unexpected error {type(e).__name__}: {e} (rerun with --debug for the traceback)")
    for num in set(plt.get_fignums()) - before:
        plt.close(num)
    return None


def make_figures(ctx: Context, out: Outputs, suffix: str, args) -> list[Group]:
    """Every figure of one context: settings whose runs are ten times shorter than its longest left
    out (returned, for the summary), at most MAX_SERIES settings per axes with the rest in figures
    marked (2/3), ..., and each GraVAC or Accordion setting's own figures."""
    ctx, short = without_short_runs(ctx)
    for part in split_parts(ctx):
        s = f"{suffix}_part{part.part.replace('/', 'of')}" if part.part else suffix
        (_shared_figures if args.figures == "all" else _overview_figure)(part, out, s, args)
    for g in ctx.groups if args.figures == "all" else []:
        _setting_figures(ctx, g, out, suffix, args)
    return short


def _setting_figures(ctx: Context, g: Group, out: Outputs, suffix: str, args) -> None:
    """A GraVAC setting's δ, CF and T_compression figures, an Accordion setting's CF figure, an
    L-GreCo setting's levels per layer."""
    def one(stem, desc, fn, *a):
        _figure(out, f"{stem}_{g.slug}{suffix}", f"{desc}, {g.label} ({ctx.title})", args, fn, ctx, g, *a)

    if g.method == "gravac":
        one("gravac_gain", "GraVAC δ_min, δ_c and ε", figures.gravac_gain_figure, args.smooth)
        one("gravac_cf", "CF chosen by GraVAC and metric", figures.cf_figure)
        one("gravac_tcomp", "T_compression per candidate CF", figures.tcomp_figure)
    elif g.method == "accordion":
        one("accordion_cf", "CF sent by Accordion and metric", figures.cf_figure)
    elif g.method in ("lgreco", "lgreco_accordion", "lgreco_powersgd"):
        what = figures.UNIT_NAMES.get(figures.level_unit(g.first), ("level",))[0]
        one("lgreco_levels", f"{what} of each layer over the run", figures.levels_figure)


def _figure(out: Outputs, stem: str, desc: str, args, fn, *a) -> None:
    """Draw one figure and save it under `stem`, or note why it was not made."""
    f = _attempt(out, stem, args.debug, fn, *a)
    if f is not None:
        out.figure(f, stem, desc)


def _overview_figure(ctx: Context, out: Outputs, suffix: str, args) -> None:
    """The one figure of `ctx` in an overview: metric vs modelled cluster time (time to accuracy,
    the paper's headline), or cumulative floats sent when no run of it evaluated."""
    if any(len(r.eval_series()[0]) for r in ctx.runs):
        _figure(out, f"time_to_accuracy_model{suffix}", f"metric vs modelled cluster time ({ctx.title})", args,
                figures.time_to_accuracy_figure, ctx, "model")
    else:
        _figure(out, f"floats_cumulative{suffix}", f"cumulative floats sent per worker vs iterations ({ctx.title})",
                args, figures.cumulative_figure, ctx, "floats_sent", "floats sent")


def _shared_figures(ctx: Context, out: Outputs, suffix: str, args) -> None:
    """The figures that draw every setting of `ctx` (a context or one part of it) on one axes."""
    def fig(stem, desc, fn, *a):
        _figure(out, f"{stem}{suffix}", f"{desc} ({ctx.title})", args, fn, ctx, *a)

    fig("floats_cumulative", "cumulative floats sent per worker vs iterations (Fig. 1-style)",
        figures.cumulative_figure, "floats_sent", "floats sent")
    fig("wire_bytes_cumulative", "cumulative wire bytes per worker vs iterations",
        figures.cumulative_figure, "wire_bytes", "wire bytes")
    fig("time_to_accuracy_model", "metric vs modelled cluster time", figures.time_to_accuracy_figure, "model")
    fig("time_to_accuracy_wall", "metric vs measured wall time", figures.time_to_accuracy_figure, "step_wall_s")
    fig("metric_vs_iterations", "metric vs iterations", figures.metric_vs_steps_figure)
    if any(g.method == "static" for g in ctx.groups):
        fig("gain_static", "compression gain of static compressors per CF (Figs. 4-6)",
            figures.static_gain_figure, args.smooth)


def make_tables(contexts: list[Context], out: Outputs, args) -> None:
    res = _attempt(out, "comm_savings", args.debug, tables.savings_table, contexts, args.last_k)
    if res is not None:
        text, rows, why_not = res
        for w in why_not:
            out.skip("comm_savings" + (" (one context)" if rows else ""), w)
        if rows:
            out.table("comm_savings", text, rows, tables.SAVINGS_COLUMNS,
                      "floats / wire bytes / time to the same target, baselines vs GraVAC (Table 4)")
        elif not why_not:
            out.skip("comm_savings", "no baseline/GraVAC pair")
    res = _attempt(out, "static_compression", args.debug, tables.static_table, contexts, args.reference,
                   args.last_k)
    if res is not None:
        text, rows, notes = res
        for n in notes:
            out.skip("static_compression", n)
        if rows:
            out.table("static_compression", text, rows, tables.STATIC_COLUMNS,
                      f"final metric, difference to target, speedup vs {args.reference} (Table 2)")
    runs = [r for c in contexts for g in c.groups for r in g.runs]
    if len({r.workers for r in runs}) > 1:           # settings run at several cluster sizes
        text, rows = scaling.scaling_table(runs)
        out.table("scaling", text, rows, scaling.COLUMNS,
                  "modelled iteration time and scaling factor t_1 / t_N per cluster size (plots/scaling.py)")
    res = _attempt(out, "iteration_time", args.debug, tables.iteration_table, contexts)
    if res is not None and res[1]:
        out.table("iteration_time", res[0], res[1], tables.ITERATION_COLUMNS,
                  "steady-state iteration time and scaling factor (MergeComp's comparison)")


def make_bench(path: str | None, out: Outputs, args) -> None:
    if path is None:
        out.skip("multilevel", "no compress_bench*.csv found (write one with bench/compress_bench.py, or pass --bench)")
        return
    if not os.path.exists(path):
        out.skip("multilevel", f"{path} does not exist")
        return
    try:
        rows = bench.multilevel_rows(path)
    except (bench.BenchFormatError, OSError, UnicodeDecodeError) as e:
        out.skip("multilevel", str(e))
        return
    out.table("multilevel", tables.multilevel_table(rows, _rel(path)), rows, tables.MULTILEVEL_COLUMNS,
              "direct vs multi-level compression times (Table 3)")
    f = _attempt(out, "multilevel", args.debug, figures.multilevel_figure, rows)
    if f is not None:
        out.figure(f, "multilevel", "speedup of multi-level over direct compression (Table 3)")


def _rel(path: str) -> str:
    """A path as the user would type it: relative when it lies under the working folder, else as
    given (a "../x" would depend on where the command ran, and so would the tests reading it)."""
    r = os.path.relpath(path)
    return path if r == os.pardir or r.startswith(os.pardir + os.sep) else r


def main(argv=None) -> int:
    args = parse_args(argv)
    run_dirs, csvs, missing = find_runs(args.results)
    bench_csv = find_bench_csv(args, csvs)
    if not run_dirs and not (args.bench or csvs):
        gone = f"; does not exist: {', '.join(missing)}" if missing else ""
        print(f"error: no runs found in {', '.join(args.results)} (a run folder holds steps.jsonl or "
              f"summary.json){gone}", file=sys.stderr)
        return 2
    formats = tuple(f.strip().lower() for f in args.formats.split(",") if f.strip())
    bad = [f for f in formats if f not in ("png", "pdf", "svg")]
    if bad or not formats:
        print(f"error: --formats takes png, pdf or svg, got {args.formats!r}", file=sys.stderr)
        return 2
    try:
        out = Outputs(args.out, formats)
    except OutputError as e:
        print(f"error: {e}: give --out a folder you can write to (it is made if missing)", file=sys.stderr)
        return 2
    for m in missing:
        print(f"not found: {m}")
    runs, left_out = load_runs(run_dirs)
    assign_studies(runs, args.results)
    left_out = [(_rel(p), why) for p, why in left_out]
    for line in skipped_lines(left_out):
        print(line)
    contexts = build_contexts(runs, args.target)
    figures.setup_style()
    n_settings = sum(len(c.groups) for c in contexts)
    print(f"{len(runs)} run(s), {n_settings} setting(s), {len(contexts)} context(s) from {', '.join(args.results)}")
    if bench_csv and not args.bench and not csvs:
        print(f"compression benchmark (Table 3): {_rel(bench_csv)} (found by itself; --bench picks another)")
    incomplete = [(_rel(r.path), r.problems) for r in runs if r.problems]
    notes = [(_rel(r.path), r.notes) for r in runs if r.notes]
    print_inputs(contexts, incomplete, notes)

    short = {}
    for ctx in contexts:
        short[ctx.title] = make_figures(ctx, out, f"__{ctx.slug}" if len(contexts) > 1 else "", args)
    short = {t: gs for t, gs in short.items() if gs}
    if contexts:
        make_tables(contexts, out, args)
    else:
        out.skip("figures and run tables", "no runs found")
    if not args.no_bench:
        make_bench(bench_csv, out, args)

    out.write_index(index_header(args.results, len(runs), contexts, short), incomplete + [(p, [f"cross-check: {x}" for x in n]) for p, n in notes
                                          if p not in dict(incomplete)], CONVENTIONS, left_out)
    for line in summary_lines(out, short, args.out, [c.title for c in contexts]):
        print(line)
    if not out.made:
        print("error: nothing could be made from these runs (see 'not made' above)", file=sys.stderr)
        return 1
    return 0


def index_header(sources: list[str], n_runs: int, contexts: list[Context], short: dict[str, list[Group]]) -> str:
    """The index's opening: the sources, the contexts with their targets, and the settings left out
    of the figures as too short."""
    text = (f"Made by `plots/paper.py` from {', '.join(f'`{p}`' for p in sources)}: {n_runs} run(s), "
            f"{sum(len(c.groups) for c in contexts)} setting(s). Contexts: " + "; ".join(
                f"{c.title} ({c.metric}, target {c.target if c.target is not None else 'none'})" for c in contexts))
    if short:
        text += ("\n\nLeft out of the figures (kept in the tables), runs at least 10x shorter than their context's "
                 "longest: " + "; ".join(f"{t}: {', '.join(g.label for g in gs)}" for t, gs in short.items()))
    return text


LIST_AT_MOST = 5    # contexts, incomplete runs or cross-checks printed one a line; more are counted


def print_inputs(contexts: list[Context], incomplete: list, notes: list) -> None:
    """What was read: each context with its settings, the incomplete runs and the cross-checks,
    one a line when there are a few, else counted (the index README.md lists them all)."""
    if len(contexts) <= LIST_AT_MOST:
        for ctx in contexts:
            print(f"  {ctx.title}: target {ctx.target if ctx.target is not None else 'none'}; "
                  + ", ".join(f"{g.label}" + (f" x{g.n}" if g.n > 1 else "") for g in ctx.groups))
            for note in (ctx.target_note, merged_note(ctx)):
                if note:
                    print(f"  note: {note}")
    else:
        studies = Counter(c.study or "(top)" for c in contexts)
        print(f"  contexts per study: {', '.join(f'{s} {n}' for s, n in studies.items())}")
    if len(incomplete) <= LIST_AT_MOST:
        if incomplete:
            print("incomplete runs (used for what they contain):")
        for path, why in incomplete:
            print(f"  {path}: {'; '.join(why)}")
    else:
        print(f"{len(incomplete)} incomplete runs, used for what they contain (listed in the index)")
    if len(notes) <= LIST_AT_MOST:
        for path, n in notes:
            print(f"  cross-check {path}: {'; '.join(n)}")
    else:
        print(f"{len(notes)} runs whose summary.json disagrees with their steps (cross-checks in the index)")


def summary_lines(out: Outputs, short: dict[str, list[Group]], folder: str, titles: list[str]) -> list[str]:
    """A screenful on what was made: counts per kind of output, where, the settings left out of
    the figures as too short, and what was not made with its commonest reasons (all in the index)."""
    kinds = Counter(re.split(r"__|_part\d|_(?=[a-z0-9.]+-)", files.split()[0].rsplit(".", 1)[0])[0]
                    for files, _ in out.made)
    lines = [f"made {len(out.made)} output(s) in {folder} (index: {os.path.join(folder, 'README.md')}): "
             + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))]
    if short:
        n = sum(len(gs) for gs in short.values())
        lines.append(f"left out of the figures of {len(short)} context(s), kept in the tables: {n} setting(s) "
                     f"whose runs are at least 10x shorter than their context's longest (named in the index)")
    if out.skipped:
        why = Counter(_reason(w, titles) for _, w in out.skipped).most_common()
        lines.append(f"not made: {len(out.skipped)} (in the index), " + "; ".join(
            f"{n}x {r}" for r, n in why[:3]) + (f"; {len(why) - 3} other reason(s)" if len(why) > 3 else ""))
    return lines


def _reason(why: str, titles: list[str]) -> str:
    """A not-made reason without the context it names and its parenthesised details, so the same
    reason counts once."""
    for t in titles:
        if why.startswith(t + ": "):
            why = why[len(t) + 2:]
            break
    return why.split(" (")[0]


if __name__ == "__main__":
    sys.exit(main())
