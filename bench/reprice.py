"""Re-price finished runs under another collective model, without retraining.

    python bench/reprice.py FOLDER [FOLDER ...] --collectives gloo-cpu [--out results/reference/reprice/gloo_cpu]

Every recorded step's messages are rebuilt from the run's config.yaml (method, compressor, the
model's layer sizes, N, the DDP buckets of its clock) and the step's own record (steps.jsonl: the
bytes it sent, GraVAC's level), priced with the suite's network model (gravac/cluster/netmodel.py)
and scheduled on the suite's timeline (gravac/cluster/timeline.py) exactly as the run's clock did,
so only the collective model changes: the CF trajectory, compute and compression times stay the
run's. Before a run's numbers are used it must pass the identity check: re-priced under the model
it ran with, every step's step_model_s and step_overlap_model_s must come back (relative 1e-9);
a run that fails it, or whose messages cannot be rebuilt from its record, is skipped in one line.

Rebuilt exactly: dense (one all-reduce per DDP bucket, overlapping backward), static and Accordion
with a sparse payload (padded sparse all-gather: counts, then values + indices) or a shared one
(seeded Random-k: one all-reduce of the values), static with a quantizer (one all-gather of every
worker's packed bytes, no counts) or a 16-bit cast (one all-reduce of 2 bytes a value per DDP
bucket, each bucket casting its share, as `Static.in_buckets` sends it), GraVAC (its gather of 4
floats per worker, then a dense all-reduce or the sparse all-gather of the level it sent). Not
rebuilt (skipped): methods whose per-step messages the record does not hold (PowerSGD's and
L-GreCo's per-layer factor all-reduces, MergeComp/CoVAP groups, ExDyna/MiCRO index unions).
A method that decides on modelled time (GraVAC's T_system) could have chosen other CFs under the
new model; the re-priced trajectory is the one it chose under the old one.

FOLDER: a run folder, a folder of runs (results/reference/mini_vgg/runs) or a curated study
folder (results/reference/mini_vgg). With --out, OUT.csv gets one row per setting and model
(modelled s to target, speedup and time verdicts against Dense and Top-k 10x, computed as
bench/reference.py's summary does) and OUT.md the tables side by side with the verdicts that change.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from compressors import COMPRESSORS, COUNT_BYTES  # noqa: E402
from gravac.cluster.netmodel import NetworkModel, load_profile  # noqa: E402
from gravac.cluster.timeline import Piece, buckets, schedule  # noqa: E402
from gravac.core.errors import UserError  # noqa: E402

REBUILT = ("dense", "static", "accordion", "gravac")
GRAVAC_ROW = 4          # floats per worker in GraVAC's gather: 3 norms + its last step time (gravac.py, step)
IDENTITY_RTOL = 1e-9
TIME_KEYS = ("step_model_s", "step_overlap_model_s")
BASELINES = (("vs_dense", "Dense"), ("vs_topk10", "Top-k 10x"))     # bench/reference.py's, in its order


class RepriceError(ValueError):
    """A bad folder or profile: printed as one line."""


class Skip(Exception):
    """A run whose messages cannot be rebuilt exactly from its record (the reason, one line)."""


@dataclass
class Recorded:
    """What re-pricing a run needs: its config, per-step records, device profile, buckets, the
    network model it ran with and how its payload goes on the wire (`payload_kind`)."""
    path: str
    cfg: object
    steps: list[dict]
    sizes: list[int]
    profile: object
    buckets: list[list[int]]
    net: NetworkModel
    workers: int
    payload: str

    @property
    def numel(self) -> int:
        return sum(self.sizes)


_SIZES: dict[str, list[int]] = {}


def _sizes(cfg) -> list[int]:
    """Parameter tensor sizes of the run's model (built once per model and dataset)."""
    import dataclasses
    key = repr((dataclasses.asdict(cfg.model), cfg.dataset.name))
    if key not in _SIZES:
        import torch
        from gravac.data import load_dataset
        from gravac.models import build_model
        torch.manual_seed(0)
        ds = load_dataset(cfg.dataset)
        model = build_model(cfg.model, ds.num_classes, ds.task)
        _SIZES[key] = [p.numel() for p in model.parameters() if p.requires_grad]
    return _SIZES[key]


def load(path: str) -> Recorded:
    """A finished run's record (Skip when it cannot be re-priced; RepriceError when it is not a run)."""
    import yaml
    from gravac.cluster.profile import _cached, profile_dir
    from gravac.config.compose import build_config
    from plots.load import load_run
    run = load_run(path)
    if run.damage or not run.has_config or not run.steps:
        raise RepriceError(f"{path}: not a readable run folder ({run.damage or 'no config.yaml or steps record'})")
    with open(os.path.join(path, "config.yaml")) as f:
        cfg = build_config(yaml.safe_load(f))
    if cfg.method.name not in REBUILT:
        raise Skip(f"method {cfg.method.name}: its per-step messages (factor all-reduces, groups or index unions) "
                   "are not in steps.jsonl")
    if cfg.clock.compute != "profile" or cfg.clock.compress != "profile":
        raise Skip("clock.compute/compress=measured: the step's own measured times are not all recorded")
    clock = (run.summary or {}).get("clock") or {}
    key, machine = (clock.get("profile") or {}).get("key"), (clock.get("profile") or {}).get("machine", "")
    cache = profile_dir(cfg.clock.cache_dir) / "devices.json"
    profile = _cached(device_entry(cache, clock.get("profile") or {}), key, machine)
    if cfg.clock.compute_s > 0:
        profile = profile.scaled(cfg.clock.compute_s)
    sizes = _sizes(cfg)
    net_cfg = cfg.network
    cap = net_cfg.bucket_cap_mb if net_cfg.buckets <= 0 else sum(sizes) * 4 / net_cfg.buckets / 2**20
    bucket_list = buckets(sizes, profile.backward_order, 4, cap, min(net_cfg.first_bucket_mb, cap))
    told = run.network
    beta = (net_cfg.bandwidth_gbps if net_cfg.comm_ratio <= 0 else told["bandwidth_gbps"]) * 1e9 / 8
    net = NetworkModel(alpha_s=net_cfg.latency_us * 1e-6, beta_Bps=beta, enabled=net_cfg.enabled,
                       profile=load_profile(told.get("collectives", net_cfg.collectives)))
    return Recorded(path, cfg, run.steps, sizes, profile, bucket_list, net, cfg.cluster.workers, payload_kind(cfg))


def device_entry(cache: Path, told: dict) -> dict:
    """The device profile the run's clock used: devices.json's entry under the key summary.json
    names, else (a key made before the key text changed) the one entry of the same machine whose
    forward, backward and optimizer times are the ones summary.json recorded, to the bit."""
    import json
    try:
        data = json.loads(cache.read_text())
    except (OSError, ValueError):
        raise Skip(f"device profiles {cache} cannot be read") from None
    if told.get("key") in data:
        return data[told["key"]]
    same = [e for e in data.values() if isinstance(e, dict) and e.get("machine") == told.get("machine")
            and all(e.get(k) == told.get(k) for k in ("forward_s", "backward_s", "optimizer_s"))]
    if len(same) != 1:
        raise Skip(f"device profile {told.get('key')} not in {cache} ({len(same)} entries with its times)")
    return same[0]


Pieces = list[tuple[list[int] | None, float, list[tuple[str, float]]]]


def payload_kind(cfg) -> str:
    """How the run puts its gradient on the wire: "dense" (dense SGD's bucketed all-reduces),
    "cast" (16-bit, all-reduced per bucket), "packed" (a quantizer's bytes, all-gathered), "shared"
    (shared indices: the values all-reduced) or "sparse" (values + indices, padded all-gather)."""
    if cfg.method.name == "dense":
        return "dense"
    target = COMPRESSORS[cfg.compressor.name].target
    if target.fixed_cf(cfg.compressor) is not None:
        return "cast" if hasattr(target, "wire_dtype") else "packed"
    from compressors.factory import from_config
    return "shared" if from_config(cfg.compressor, [1]).shared else "sparse"


def messages(rec: Recorded, s: dict) -> Pieces:
    """The step's pieces as (parameters, compression seconds, [(collective, bytes), ...]), rebuilt
    from its record. DDP's buckets carry no compression; a method's one piece after backward
    carries all of it; a cast's buckets each carry their share."""
    wire, compress = float(s["wire_bytes"]), float(s["compress_model_s"])
    kind = rec.payload
    if kind in ("dense", "cast"):
        width = wire / rec.numel
        sizes = [sum(rec.sizes[i] for i in b) for b in rec.buckets]
        cast = compress if kind == "cast" else 0.0
        return [(b, cast * n / rec.numel, [("allreduce", n * width)]) for b, n in zip(rec.buckets, sizes)]
    msgs: list[tuple[str, float]] = []
    if rec.cfg.method.name == "gravac":
        msgs.append(("allgather", 8.0 * GRAVAC_ROW))
        wire -= 8.0 * GRAVAC_ROW
        if s.get("level") == "dense":
            return [(None, compress, msgs + [("allreduce", wire)])]
    if kind == "shared":
        msgs.append(("allreduce", wire))
    elif kind == "packed":
        msgs.append(("allgather", wire))
    else:
        msgs.append(("sparse_allgather", wire - COUNT_BYTES))
    return [(None, compress, msgs)]


def price(rec: Recorded, net: NetworkModel, s: dict) -> dict:
    """The step's modelled times under `net`: serial (step_model_s) and on the overlap timeline."""
    n = rec.workers
    pieces, comm = [], 0.0
    for params, compress, msgs in messages(rec, s):
        secs: list[float] = []
        for kind, nbytes in msgs:
            if kind == "sparse_allgather":
                secs += net.sparse_allgather(nbytes, n)
            else:
                secs.append(getattr(net, kind)(nbytes, n))
        comm += sum(secs)
        pieces.append(Piece(params, compress, secs))
    p = rec.profile
    plan = schedule(p.forward_s, p.backward_s, p.ready_s, p.optimizer_s, pieces)
    serial = float(s["compute_model_s"]) + float(s["compress_model_s"]) + comm + p.optimizer_s
    return {"step": s["step"], "comm_model_s": comm, "step_model_s": serial, "step_overlap_model_s": plan.step_s,
            "exposed_comm_model_s": plan.exposed_comm_s}


def identity(rec: Recorded) -> str | None:
    """None when re-pricing under the run's own model gives back every recorded step time, else why not."""
    for s in rec.steps:
        got = price(rec, rec.net, s)
        for k in TIME_KEYS:
            want = float(s[k])
            if not math.isclose(got[k], want, rel_tol=IDENTITY_RTOL, abs_tol=1e-15):
                return f"step {s['step']}: {k} re-priced {got[k]:.9g} s, recorded {want:.9g} s"
    return None


def reprice(rec: Recorded, net: NetworkModel) -> list[dict]:
    """Every step re-priced under `net` (after the identity check passed)."""
    return [price(rec, net, s) for s in rec.steps]


def new_model(rec: Recorded, spec: str) -> NetworkModel:
    """The run's network (α, β) with collective model `spec` (ideal, a committed profile or a file)."""
    return NetworkModel(alpha_s=rec.net.alpha_s, beta_Bps=rec.net.beta_Bps, enabled=rec.net.enabled,
                        profile=load_profile(spec))


def run_folders(folders: list[str]) -> list[str]:
    """Every run folder under the given ones (a run, a folder of runs, or a study with runs/)."""
    out = []
    for f in folders:
        if not os.path.isdir(f):
            raise RepriceError(f"{f}: no such folder (give run folders, folders of runs or a curated study folder)")
        if os.path.exists(os.path.join(f, "config.yaml")):
            out.append(f)
            continue
        base = os.path.join(f, "runs") if os.path.isdir(os.path.join(f, "runs")) else f
        found = sorted(os.path.join(base, d) for d in os.listdir(base)
                       if os.path.exists(os.path.join(base, d, "config.yaml")))
        if not found:
            raise RepriceError(f"{f}: holds no run folder (a folder with config.yaml)")
        out += found
    return out


# --- tables: bench/reference.py's summary statistics on the re-priced runs --------------------------------
def with_times(path: str, times: list[dict] | None):
    """plots.load's Run of `path`, its modelled step times replaced by `times` (None: as recorded)."""
    from plots.load import load_run
    run = load_run(path)
    if times is not None:
        for s, t in zip(run.steps, times):
            for k in TIME_KEYS + ("comm_model_s", "exposed_comm_model_s"):
                s[k] = t[k]
        run._cum.clear()        # load_run's cross-checks cached the recorded cumulative sums
    return run


def table_rows(runs: list, model: str) -> list[dict]:
    """Per setting: modelled s to target, speedup vs Dense and time verdicts vs Dense and Top-k 10x."""
    from bench.reference import REFERENCE
    from plots.merit import against_baselines, merit
    from plots.settings import build_contexts
    from plots.tables import ratio, ratio_cell
    rows = []
    for ctx in build_contexts(runs):
        merits = {g: merit(g, ctx.target) for g in ctx.groups}
        dense = next((g for g in ctx.groups if g.method == "dense"), None)
        for g in ctx.groups:
            t = merits[g].to
            v = {b.label: x for b, x in against_baselines(ctx, merits, g, REFERENCE)}
            speed = ratio(merits[dense].to, t, "model_s") if dense else (math.nan, "", "")
            e = t.estimate("model_s")
            row = {"experiment": runs[0].cfg("experiment.name"), "model": model, "setting": g.label,
                   "seeds": g.n, "reached": t.reached, "model_s_to_target": e.point, "lo": e.lo, "hi": e.hi,
                   "to_target": t.cell("model_s"), "speedup_vs_dense": speed[0], "speedup_cell": ratio_cell(*speed[:2])}
            for col, base in BASELINES:
                c = v[base].time if v.get(base) is not None else None
                row[col] = "baseline" if base in v and c is None else c.text() if c else "—"
                row[col + "_verdict"] = "baseline" if base in v and c is None else c.verdict if c else "—"
            rows.append(row)
    return rows


def changes(before: list[dict], after: list[dict]) -> list[str]:
    """One line per (setting, baseline) whose time verdict differs between the two tables (a
    baseline's own row against the other baseline is left out: the other's row says it)."""
    out = []
    new = {(r["experiment"], r["setting"]): r for r in after}
    for r in before:
        o = new.get((r["experiment"], r["setting"]))
        if o is None or r["vs_dense_verdict"] == "baseline":
            continue
        for col, base in BASELINES:
            a, b = r[col + "_verdict"], o[col + "_verdict"]
            if a != b:
                effect = o[col][len(b):].strip() or "no CI"
                out.append(f"{r['experiment']}: {r['setting']} vs {base} in modelled time to target: {a} under "
                           f"{r['model']} -> {b} under {o['model']} {effect}")
    return out


def crossings(before: list[dict], after: list[dict]) -> list[str]:
    """Settings whose speedup vs Dense (point estimate) crosses 1 between the tables while no verdict
    can say so (a side with one seed): worth naming, not a verdict."""
    out = []
    new = {(r["experiment"], r["setting"]): r for r in after}
    for r in before:
        o = new.get((r["experiment"], r["setting"]))
        a, b = r["speedup_vs_dense"], o["speedup_vs_dense"] if o else math.nan
        if o and math.isfinite(a) and math.isfinite(b) and (a > 1) != (b > 1) and r["vs_dense_verdict"] == o[
                "vs_dense_verdict"]:
            out.append(f"{r['experiment']}: {r['setting']} vs Dense: {a:.3g}x under {r['model']} -> {b:.3g}x under "
                       f"{o['model']} ({r['vs_dense_verdict']})")
    return out


def fixed_costs(net: NetworkModel, workers: int) -> str:
    """What a message of a few bytes costs under `net` at N workers, per collective (the term that
    decides small messages)."""
    return (f"all-reduce {net.allreduce(0, workers) * 1e3:.3g} ms, "
            f"all-gather {net.allgather(0, workers) * 1e3:.3g} ms, "
            f"sparse all-gather {sum(net.sparse_allgather(0, workers)) * 1e3:.3g} ms")


def markdown(ideal: list[dict], other: list[dict], spec: str, skipped: list[str], checked: dict,
             fixed: str = "") -> str:
    """The two tables side by side per experiment, the changed verdicts, what was checked and skipped."""
    was = ideal[0]["model"] if ideal else "as run"
    lines = [f"# Time to target re-priced under network.collectives={spec}", "",
             "Made by `python bench/reprice.py results/reference/mini_vgg results/reference/mini_resnet "
             f"results/reference/mini_lstm --collectives {spec} --out ...`: every step's messages rebuilt from the "
             "run's record and re-priced on the run's overlap timeline; compute, compression and the CF trajectory "
             "are the runs' own (no retraining; GraVAC's T_system was the recorded model's). Mean [95% CI] over "
             "seeds and verdicts as in summary.md (bench/reference.py, plots/stats.py). The runs have N = 8 "
             "workers; the profile was fitted at N <= 4 (bench/netval.py): at N = 8 it is an extrapolation of "
             "its per-step and per-byte terms." + (f" {fixed}" if fixed else ""), "",
             f"Identity check (re-priced under the run's own model, every step, relative {IDENTITY_RTOL:g}): "
             + ", ".join(f"{m}: {k} run(s) exact" for m, k in sorted(checked.items())) + ".", ""]
    if skipped:
        lines += ["Skipped:", *[f"- {s}" for s in skipped], ""]
    head = ["setting", f"s to target ({was})", f"s to target ({spec})", f"speedup vs Dense ({was})",
            f"speedup vs Dense ({spec})", f"vs Dense ({was})", f"vs Dense ({spec})", f"vs Top-k 10x ({was})",
            f"vs Top-k 10x ({spec})"]
    new = {(r["experiment"], r["setting"]): r for r in other}
    for exp in dict.fromkeys(r["experiment"] for r in ideal):
        lines += [f"## {exp}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in (r for r in ideal if r["experiment"] == exp):
            o = new[(exp, r["setting"])]
            lines.append("| " + " | ".join([r["setting"], r["to_target"], o["to_target"], r["speedup_cell"],
                                            o["speedup_cell"], r["vs_dense"], o["vs_dense"], r["vs_topk10"],
                                            o["vs_topk10"]]) + " |")
        lines.append("")
    ch = changes(ideal, other)
    lines += ["## Verdicts that change", "", *([f"- {c}" for c in ch] or ["- none"]), ""]
    cross = crossings(ideal, other)
    if cross:
        lines += ["## Speedups vs Dense that cross 1 without a verdict", "", *[f"- {c}" for c in cross], ""]
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="bench/reprice.py", description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", help="run folders, folders of runs or curated study folders")
    p.add_argument("--collectives", required=True, help="ideal, a committed profile (gloo-cpu) or a profile file")
    p.add_argument("--out", help="write OUT.csv and OUT.md (the tables); without it, print the per-run totals")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        load_profile(args.collectives)
        paths = run_folders(args.folders)
    except (RepriceError, UserError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    skipped, checked, by_exp, was_models, first = [], {}, {}, [], None
    for path in paths:
        try:
            rec = load(path)
        except Skip as e:
            skipped.append(f"{os.path.basename(path)}: {e}")
            continue
        except (RepriceError, UserError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        why = identity(rec)
        if why:
            skipped.append(f"{os.path.basename(path)}: identity check failed ({why})")
            continue
        name = rec.cfg.method.name if rec.cfg.method.name != "static" else f"static {rec.cfg.compressor.name}"
        checked[name] = checked.get(name, 0) + 1
        times = reprice(rec, new_model(rec, args.collectives))
        first = first or rec
        was_models.append(rec.net.profile.source if rec.net.profile is not None else "ideal")
        by_exp.setdefault(rec.cfg.experiment.name, []).append((path, times))
        key = "step_overlap_model_s" if rec.cfg.network.overlap else "step_model_s"     # the run's clock
        if not args.out:
            print(f"{path}: modelled s {sum(float(s[key]) for s in rec.steps):.4g} (as run) -> "
                  f"{sum(t[key] for t in times):.4g} ({args.collectives})")
    for s in skipped:
        print(f"skipped: {s}")
    if not by_exp:
        print("error: no run could be re-priced (see the skipped lines)", file=sys.stderr)
        return 1
    if args.out:
        ideal, other = [], []
        was = sorted(set(was_models))
        for exp, items in by_exp.items():
            ideal += table_rows([with_times(p, None) for p, _ in items], was[0] if len(was) == 1 else "as run")
            other += table_rows([with_times(p, t) for p, t in items], args.collectives)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        cols = list(ideal[0]) if ideal else []
        with open(out.with_suffix(".csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols, lineterminator="\n")
            w.writeheader()
            for r in ideal + other:
                w.writerow({k: (f"{v:.6g}" if isinstance(v, float) and math.isfinite(v) else
                                "" if isinstance(v, float) else v) for k, v in r.items()})
        n = first.workers
        fixed = (f"A message of a few bytes at N = {n}: {fixed_costs(first.net, n)} as run; "
                 f"{fixed_costs(new_model(first, args.collectives), n)} under {args.collectives}.")
        out.with_suffix(".md").write_text(markdown(ideal, other, args.collectives, skipped, checked, fixed))
        print(f"wrote {out.with_suffix('.csv')} and {out.with_suffix('.md')}")
        for c in changes(ideal, other) + crossings(ideal, other):
            print(c)
    return 0


if __name__ == "__main__":
    sys.exit(main())
