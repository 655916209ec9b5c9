"""plots/: hand-made run folders in tmp_path -> every figure and table, numbers checked by hand.

Fixture (4 workers, 10 steps, evaluations every 2 steps, target top-1 0.6):

| setting                   | floats/step        | model s/step | wall s/step | top-1 at 2,4,6,8,10  | target at |
|---------------------------|--------------------|--------------|-------------|----------------------|-----------|
| Dense                     | 1000               | 1.0          | 0.5         | .2 .4 .6 .8 .85      | step 6    |
| Top-k 10x seed 0          | 100                | 0.5          | 0.4         | .1 .3 .5 .6 .7       | step 8    |
| Top-k 10x seed 1          | 100                | 0.5          | 0.4         | .1 .3 .6 .65 .7      | step 6    |
| Top-k 100x                | 10                 | 0.3          | 0.25        | .1 .2 .3 .4 .5       | never     |
| GraVAC ε=0.7 (dgc)        | 100 x4, then 10    | 0.6          | 0.3         | .2 .5 .6 .7 .8       | step 6    |
| Accordion (randomk 1.5x/1000x) | 600 x5, then 1 | 0.8          | 0.4         | .1 .2 .3 .5 .6       | step 10   |

wire bytes = 8 x floats (4 for dense). Floats to target: Dense 6000, Top-k 10x 800 and 600 (mean
700), GraVAC 4·100 + 2·10 = 420, Accordion 5·600 + 5·1 = 3005; Top-k 100x sent 100 in all.
"""
from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from plots.paper import main

ROOT = Path(__file__).resolve().parents[1]
M = 1000          # parameters
STEPS = 10
EVERY = 2
TARGET = 0.6


def write_run(root: Path, name: str, method: str, compressor: str, cf: float, floats, metrics, model_s, wall_s,
              seed: int = 0, extra=None, summary: bool = True, torn: bool = False, target: float = TARGET,
              epsilon: float = 0.7, model: str = "resnet_mini", metric: str = "top1") -> Path:
    """A run folder as bench/run.py writes it, from hand-chosen per-step floats and eval metrics."""
    d = root / name
    d.mkdir(parents=True)
    config = {
        "model": {"name": model}, "dataset": {"name": "synthetic", "seed": 0},
        "compressor": {"name": compressor, "cf": cf},
        "method": {"name": method, "cf_min": 10.0, "cf_max": 1000.0, "window": 4, "step": 2.0, "epsilon": epsilon,
                   "omega": 0.01, "policy": "exponential", "cf_low": 1.5, "cf_high": 1000.0},
        "cluster": {"backend": "sim", "workers": 4},
        "network": {"name": "10gbps", "enabled": True, "bandwidth_gbps": 10.0, "latency_us": 10.0},
        "train": {"steps": STEPS, "eval_every": EVERY, "target_metric": metric, "target": target, "seed": seed},
        "experiment": {"name": "fixture", "run_id": name},
    }
    config["setting"] = setting_of(config)
    (d / "config.yaml").write_text(yaml.safe_dump(config))
    lines, tot = [], {"floats": 0.0, "wire": 0.0, "model": 0.0, "wall": 0.0}
    for i, f in enumerate(floats):
        wire = f * (4 if method == "dense" else 8)
        rec = {"step": i, "epoch": i / 10, "loss": 1.0, "lr": 0.1, "cf": M / f, "floats_sent": f, "wire_bytes": wire,
               "compute_s": model_s / 2, "compress_s": 0.0, "comm_s": wall_s - model_s / 2,
               "comm_model_s": model_s / 2, "step_model_s": model_s, "step_wall_s": wall_s}
        rec.update(extra(i) if extra else {})
        lines.append(json.dumps(rec))
        tot["floats"] += f
        tot["wire"] += wire
        tot["model"] += model_s
        tot["wall"] += wall_s
    text = "\n".join(lines) + "\n"
    if torn:
        text += '{"step": 10, "epoch": 1.0, "loss": 0.9, "cf": 10'
    (d / "steps.jsonl").write_text(text)
    values = (lambda m: {"perplexity": m}) if metric == "perplexity" else (lambda m: {"top1": m, "top5": min(1, m + .2)})
    evals = [{"step": (j + 1) * EVERY, "epoch": 0.2 * (j + 1), "loss": 1.0, **values(m), "metric": m, "eval_s": 0.1}
             for j, m in enumerate(metrics)]
    (d / "evals.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    if summary:
        reached = (lambda v: v <= target) if metric == "perplexity" else (lambda v: v >= target)
        hit = next((e for e in evals if reached(e["metric"])), None)
        tr = None
        if hit:
            n = hit["step"]
            fl = sum(floats[:n])
            tr = {"step": n, "floats_sent": fl, "wire_bytes": fl * (4 if method == "dense" else 8),
                  "wall_s": 99.0, "step_wall_s": n * wall_s, "model_s": n * model_s}
        s = {"status": "completed", "method": method, "compressor": compressor, "cf": cf if method == "static" else None,
             "model": model, "dataset": "synthetic", "parameters": M, "workers": 4, "backend": "sim",
             "steps": len(floats), "total_steps": STEPS, "metric": metric, "final_metric": metrics[-1],
             "best_metric": (min if metric == "perplexity" else max)(metrics), "target": target, "floats_sent": tot["floats"], "wire_bytes": tot["wire"],
             "wall_s": 123.0, "step_wall_s": tot["wall"], "model_s": tot["model"], "time_source": "modelled",
             "network": {"name": "10gbps", "enabled": True, "latency_us": 10.0, "bandwidth_gbps": 10.0},
             "cf_histogram": {}, "target_reached": tr, "setting": config["setting"]}
        (d / "summary.json").write_text(json.dumps(s))
    return d


def setting_of(config: dict) -> dict:
    """The `setting` block bench/run.py writes into config.yaml and summary.json for this config."""
    from gravac.config.compose import build_config, saved_config
    return saved_config(build_config({k: dict(config[k]) for k in ("method", "compressor")}))["setting"]


def static_gain(g):
    return lambda i: {"gain": g - 0.01 * i}


def gravac_extra(i):
    cf_min, cs = (10.0, 10.0)
    level = "min" if i < 4 else "c"
    tc = {"1": 50.0, "10": 400.0} if i < 4 else {"1": 50.0, "10": 400.0, "100": 380.0 + i}
    return {"cf_min": cf_min, "cs": cs, "cf_c": cf_min * cs, "level": level, "delta_min": 0.9 - 0.01 * i,
            "delta_c": 0.6 + 0.03 * i, "delta_min_raw": 0.9, "delta_c_raw": 0.7, "t_system": 500.0,
            "t_compression": tc, "settled": False}


def accordion_extra(i):
    return {"cf_low_layers": 3 if i < 5 else 0, **({"accordion_decision": "low"} if i == 4 else {})}


def make_fixture(root: Path) -> Path:
    exp = root / "runs" / "fixture"
    write_run(exp, "dense", "dense", "none", 100.0, [1000.0] * 10, [.2, .4, .6, .8, .85], 1.0, 0.5)
    write_run(exp, "topk10-s0", "static", "topk", 10.0, [100.0] * 10, [.1, .3, .5, .6, .7], 0.5, 0.4,
              extra=static_gain(0.8))
    write_run(exp, "topk10-s1", "static", "topk", 10.0, [100.0] * 10, [.1, .3, .6, .65, .7], 0.5, 0.4, seed=1,
              extra=static_gain(0.82))
    write_run(exp, "topk100", "static", "topk", 100.0, [10.0] * 10, [.1, .2, .3, .4, .5], 0.3, 0.25,
              extra=static_gain(0.5))
    write_run(exp, "gravac", "gravac", "dgc", 100.0, [100.0] * 4 + [10.0] * 6, [.2, .5, .6, .7, .8], 0.6, 0.3,
              extra=gravac_extra)
    write_run(exp, "accordion", "accordion", "randomk", 100.0, [600.0] * 5 + [1.0] * 5, [.1, .2, .3, .5, .6],
              0.8, 0.4, extra=accordion_extra)
    return root / "runs"


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(x: str) -> float:
    return float(x) if x not in ("", None) else math.nan


FIGURES = ["floats_cumulative", "wire_bytes_cumulative", "time_to_accuracy_model", "time_to_accuracy_wall",
           "metric_vs_iterations", "gain_static", "gravac_gain_gravac-eps0.7-dgc", "gravac_cf_gravac-eps0.7-dgc",
           "gravac_tcomp_gravac-eps0.7-dgc", "accordion_cf_accordion-randomk-1.5x-1000x", "multilevel"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("plots")
    runs = make_fixture(root)
    bench = root / "compress_bench.csv"
    bench.write_text("model,compressor,cf,mode,median_s\n"
                     "resnet101,topk,1000,direct,0.020\nresnet101,topk,1000,multilevel,0.0125\n"
                     "resnet101,dgc,1000,direct,0.010\nresnet101,dgc,1000,multilevel,0.008\n"
                     "vgg16,topk,1000,direct,0.030\nvgg16,topk,1000,multilevel,0.015\n"
                     "resnet101,topk,10,single,0.5\n")
    out = root / "out"
    code = main([str(runs), "--out", str(out), "--bench", str(bench), "--debug", "--figures", "all", "--formats", "png,pdf"])
    return code, out


def test_every_figure_and_table_is_made(made):
    code, out = made
    assert code == 0
    for stem in FIGURES:
        for ext in ("png", "pdf"):
            assert (out / f"{stem}.{ext}").stat().st_size > 1000, f"{stem}.{ext}"
    for stem in ("comm_savings", "static_compression", "multilevel"):
        assert (out / f"{stem}.md").exists() and (out / f"{stem}.csv").exists()
    index = (out / "README.md").read_text()
    assert "floats_cumulative.png" in index and "Conventions" in index
    assert not list(out.glob("*.tmp.*"))


def test_savings_table_numbers(made):
    _, out = made
    rows = {(r["baseline"], r["gravac"]): r for r in read_csv(out / "comm_savings.csv")}
    g = "GraVAC ε=0.7 (dgc)"
    assert set(rows) == {(b, g) for b in ("Accordion (randomk 1.5x/1000x)", "Dense", "Top-k 10x", "Top-k 100x")}
    acc = rows[("Accordion (randomk 1.5x/1000x)", g)]
    assert num(acc["baseline_floats"]) == 3005 and num(acc["gravac_floats"]) == 420
    assert num(acc["comm_saving"]) == pytest.approx(3005 / 420)
    assert num(acc["model_speedup"]) == pytest.approx(8.0 / 3.6)
    assert num(acc["wall_speedup"]) == pytest.approx(4.0 / 1.8)
    assert num(acc["wire_saving"]) == pytest.approx(3005 * 8 / (420 * 8))
    dense = rows[("Dense", g)]
    assert num(dense["comm_saving"]) == pytest.approx(6000 / 420)
    assert num(dense["model_speedup"]) == pytest.approx(6.0 / 3.6)
    assert num(dense["wall_speedup"]) == pytest.approx(3.0 / 1.8)
    assert dense["comm_saving_kind"] == "exact"
    topk = rows[("Top-k 10x", g)]          # two seeds: mean of 800 and 600
    assert topk["baseline_runs"] == "2" and topk["baseline_reached"] == "2"
    assert num(topk["baseline_floats"]) == pytest.approx(700)
    assert num(topk["baseline_floats_sd"]) == pytest.approx(math.sqrt(2) * 100)
    assert num(topk["comm_saving"]) == pytest.approx(700 / 420)
    assert num(topk["model_speedup"]) == pytest.approx(3.5 / 3.6)
    never = rows[("Top-k 100x", g)]        # never reached: its whole run is a lower bound
    assert never["baseline_reached"] == "0" and never["comm_saving_kind"] == "lower_bound"
    assert num(never["comm_saving"]) == pytest.approx(100 / 420)
    md = (out / "comm_savings.md").read_text()
    assert "not reached" in md and "7.15x" in md and "14.3x" in md


def test_static_table_numbers(made):
    _, out = made
    rows = {r["setting"]: r for r in read_csv(out / "static_compression.csv")}
    assert list(rows) == ["Dense", "Top-k 10x", "Top-k 100x", "Accordion (randomk 1.5x/1000x)", "GraVAC ε=0.7 (dgc)"]
    ref_model, ref_wall = 3.5, 2.8
    assert num(rows["Top-k 10x"]["speedup_model"]) == pytest.approx(1.0)
    assert num(rows["Dense"]["speedup_model"]) == pytest.approx(ref_model / 6.0)
    assert num(rows["Dense"]["speedup_wall"]) == pytest.approx(ref_wall / 3.0)
    assert num(rows["GraVAC ε=0.7 (dgc)"]["speedup_model"]) == pytest.approx(ref_model / 3.6)
    assert num(rows["GraVAC ε=0.7 (dgc)"]["speedup_wall"]) == pytest.approx(ref_wall / 1.8)
    assert num(rows["Accordion (randomk 1.5x/1000x)"]["speedup_model"]) == pytest.approx(ref_model / 8.0)
    assert rows["Top-k 100x"]["speedup_model"] == "" and rows["Top-k 100x"]["reached"] == "0"
    assert num(rows["Dense"]["final_metric"]) == pytest.approx(0.85)
    assert num(rows["Dense"]["delta_to_target"]) == pytest.approx(0.25)
    assert num(rows["Top-k 100x"]["delta_to_target"]) == pytest.approx(-0.1)
    assert num(rows["Top-k 10x"]["steps_to_target"]) == pytest.approx(7)
    assert num(rows["GraVAC ε=0.7 (dgc)"]["mean_cf"]) == pytest.approx(10 * M / 460)
    assert num(rows["Top-k 10x"]["mean_cf"]) == pytest.approx(10)
    # mean of the last 3 evaluations: Top-k 10x (.5+.6+.7)/3 and (.6+.65+.7)/3; two seeds -> CI = their range
    top = rows["Top-k 10x"]
    assert (num(top["last_k"]), num(top["last_k_metric_mean"])) == (3, pytest.approx(0.625))
    assert (num(top["last_k_metric_lo"]), num(top["last_k_metric_hi"])) == (pytest.approx(0.6), pytest.approx(0.65))
    assert (num(top["model_s_to_target_lo"]), num(top["model_s_to_target_hi"])) == (3, 4)
    assert top["vs_dense_metric_verdict"] == top["vs_dense_time_verdict"] == "one seed: not tested"
    assert top["vs_reference_metric_verdict"] == ""                 # it is the reference
    assert rows["Dense"]["vs_reference_metric_verdict"] == "one seed: not tested"
    md = (out / "static_compression.md").read_text()
    assert "+25.00 pp" in md and "not reached" in md and "95% CI: percentile bootstrap" in md


def test_multilevel_table(made):
    _, out = made
    rows = {(r["model"], r["compressor"]): r for r in read_csv(out / "multilevel.csv")}
    assert set(rows) == {("resnet101", "topk"), ("resnet101", "dgc"), ("vgg16", "topk")}
    assert num(rows[("resnet101", "topk")]["speedup"]) == pytest.approx(1.6)
    assert num(rows[("vgg16", "topk")]["speedup"]) == pytest.approx(2.0)


def test_multilevel_reader_is_tolerant(tmp_path):
    from plots.bench import BenchFormatError, multilevel_rows
    wide = tmp_path / "wide.csv"
    wide.write_text("size,compressor,cf,direct_ms,multilevel_ms\n1000000,topk,1000,20,10\n1000000,topk,1000,22,12\n")
    (row,) = multilevel_rows(str(wide))
    assert row["direct_s"] == pytest.approx(0.021) and row["speedup"] == pytest.approx(21 / 11)
    odd = tmp_path / "odd.csv"      # multi-level rows name their CF differently: paired without CF
    odd.write_text("model,compressor,cf,kind,time_s\nvgg16,dgc,1000,direct,0.3\nvgg16,dgc,10->100,multi-level,0.2\n")
    (row,) = multilevel_rows(str(odd))
    assert row["speedup"] == pytest.approx(1.5)
    bad = tmp_path / "bad.csv"
    bad.write_text("model,compressor,cf,time_s\nvgg16,dgc,1000,0.3\n")
    with pytest.raises(BenchFormatError, match="direct"):
        multilevel_rows(str(bad))


def test_incomplete_run_is_used_and_named(tmp_path, capsys):
    exp = tmp_path / "runs"
    write_run(exp, "dense", "dense", "none", 100.0, [1000.0] * 10, [.2, .4, .6, .8, .85], 1.0, 0.5)
    write_run(exp, "gravac-killed", "gravac", "dgc", 100.0, [100.0] * 4 + [10.0] * 2, [.2, .5, .6], 0.6, 0.3,
              extra=gravac_extra, summary=False, torn=True)
    out = tmp_path / "out"
    assert main([str(exp), "--out", str(out), "--formats", "png", "--figures", "all"]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if "gravac-killed" in x)
    assert "summary.json missing" in line and "torn" in line
    assert "gravac-killed" in (out / "README.md").read_text()
    rows = read_csv(out / "comm_savings.csv")
    assert len(rows) == 1 and num(rows[0]["gravac_floats"]) == 420       # 6 complete steps were enough
    assert num(rows[0]["comm_saving"]) == pytest.approx(6000 / 420)
    for stem in ("floats_cumulative", "time_to_accuracy_model", "gravac_cf_gravac-eps0.7-dgc"):
        assert (out / f"{stem}.png").exists()
    assert "multilevel" in text                                           # reported as not made, with why


def test_no_target_reports_why(tmp_path, capsys):
    exp = tmp_path / "runs"
    write_run(exp, "dense", "dense", "none", 100.0, [1000.0] * 10, [.2, .4, .6, .8, .85], 1.0, 0.5, target=0.0)
    write_run(exp, "gravac", "gravac", "dgc", 100.0, [100.0] * 10, [.2, .5, .6, .7, .8], 0.6, 0.3, target=0.0,
              extra=gravac_extra)
    assert main([str(exp), "--out", str(tmp_path / "o"), "--formats", "png"]) == 0
    assert "no target" in capsys.readouterr().out
    assert main([str(exp), "--out", str(tmp_path / "o2"), "--target", "60", "--formats", "png"]) == 0  # percent
    rows = read_csv(tmp_path / "o2" / "comm_savings.csv")
    assert num(rows[0]["target"]) == pytest.approx(0.6)
    assert num(rows[0]["comm_saving"]) == pytest.approx(6000 / 600)


def test_seed_replicas_are_grouped_and_settings_told_apart(tmp_path):
    from plots.load import find_runs, load_run
    from plots.settings import build_contexts
    exp = tmp_path / "runs"
    write_run(exp, "a", "gravac", "dgc", 100.0, [10.0] * 10, [.5] * 5, 0.6, 0.3, seed=0)
    write_run(exp, "b", "gravac", "dgc", 100.0, [10.0] * 10, [.5] * 5, 0.6, 0.3, seed=1)
    write_run(exp, "c", "gravac", "dgc", 100.0, [10.0] * 10, [.5] * 5, 0.6, 0.3, epsilon=0.9)
    cfg = yaml.safe_load((exp / "b" / "config.yaml").read_text())
    cfg["method"]["policy"] = "geometric"
    write_run(exp, "d", "gravac", "dgc", 100.0, [10.0] * 10, [.5] * 5, 0.6, 0.3)
    (exp / "d" / "config.yaml").write_text(yaml.safe_dump(cfg))
    (ctx,) = build_contexts([load_run(d) for d in find_runs([str(exp)])[0]])
    labels = sorted((g.label, g.n) for g in ctx.groups)
    assert labels == [("GraVAC ε=0.7 (dgc), policy=exponential", 2), ("GraVAC ε=0.7 (dgc), policy=geometric", 1),
                      ("GraVAC ε=0.9 (dgc)", 1)]


def test_perplexity_and_two_contexts(tmp_path):
    """Lower-is-better metric; two models -> two contexts, files suffixed, one table row each."""
    exp = tmp_path / "runs"
    write_run(exp, "dense", "dense", "none", 100.0, [1000.0] * 10, [.2, .4, .6, .8, .85], 1.0, 0.5)
    write_run(exp, "gravac", "gravac", "dgc", 100.0, [100.0] * 10, [.2, .5, .6, .7, .8], 0.6, 0.3, extra=gravac_extra)
    lstm = dict(model="lstm_mini", metric="perplexity", target=22.0)
    write_run(exp, "lstm-dense", "dense", "none", 100.0, [1000.0] * 10, [100, 50, 30, 21, 20], 1.0, 0.5, **lstm)
    write_run(exp, "lstm-gravac", "gravac", "dgc", 100.0, [10.0] * 10, [100, 40, 22, 21, 20], 0.5, 0.5,
              extra=gravac_extra, **lstm)
    out = tmp_path / "out"
    assert main([str(exp), "--out", str(out), "--formats", "png", "--debug", "--figures", "all"]) == 0
    rows = {r["context"].split(" /")[0]: r for r in read_csv(out / "comm_savings.csv")}
    assert num(rows["lstm_mini"]["baseline_floats"]) == 8000 and num(rows["lstm_mini"]["gravac_floats"]) == 60
    assert num(rows["lstm_mini"]["comm_saving"]) == pytest.approx(8000 / 60)
    assert num(rows["lstm_mini"]["model_speedup"]) == pytest.approx(8.0 / 3.0)
    assert num(rows["resnet_mini"]["comm_saving"]) == pytest.approx(6000 / 600)
    static = {(r["context"].split(" /")[0], r["setting"]): r for r in read_csv(out / "static_compression.csv")}
    assert num(static[("lstm_mini", "Dense")]["delta_to_target"]) == pytest.approx(-2.0)
    assert (out / "time_to_accuracy_model__lstm_mini-synthetic-4w-10gbps.png").exists()
    assert (out / "floats_cumulative__resnet_mini-synthetic-4w-10gbps.png").exists()


def test_summary_cross_check(tmp_path):
    from plots.load import load_run
    d = write_run(tmp_path, "dense", "dense", "none", 100.0, [1000.0] * 10, [.2, .4, .6, .8, .85], 1.0, 0.5)
    assert load_run(str(d)).notes == [] and load_run(str(d)).problems == []
    s = json.loads((d / "summary.json").read_text())
    s["floats_sent"] = 1.0
    s["target_reached"]["step"] = 4
    (d / "summary.json").write_text(json.dumps(s))
    notes = " ".join(load_run(str(d)).notes)
    assert "floats_sent=1" in notes and "10000" in notes and "step 4" in notes


def test_a_run_that_failed_before_its_first_step_is_skipped_in_one_line(tmp_path, capsys):
    """Issue 20: a run whose dataset was missing counted as a context of its own and every figure
    of it was listed as 'not made'. Such a run now leaves no folder (issue 41), but one stopped or
    killed before its first step, or one of an older version, does: one tiny good run, and its
    folder as it stood before the first step, with a CIFAR-10 config and a failed summary."""
    import shutil
    from conftest import failure, run_cli
    root = tmp_path / "runs"
    good = run_cli(["train.steps=4", "train.eval_every=2", "cluster.workers=2", "cluster.threads=1",
                    "logger.progress=false", "dataset.image_size=8", "dataset.train_size=256", "dataset.test_size=64",
                    "model.width=4", "experiment.run_id=good", f"experiment.results_root={root}"])
    assert good.returncode == 0, failure(good)
    failed = root / "default" / "nodata"
    shutil.copytree(root / "default" / "good", failed)
    config = yaml.safe_load((failed / "config.yaml").read_text())
    config["dataset"]["name"] = "cifar10"
    (failed / "config.yaml").write_text(yaml.safe_dump(config))
    for name in ("steps.jsonl", "evals.jsonl", "ready.jsonl", "model.pt"):
        (failed / name).unlink(missing_ok=True)
    (failed / "steps.jsonl").write_text("")
    (failed / "summary.json").write_text(json.dumps({"status": "failed", "error": "CIFAR-10 not found", "steps": 0}))
    assert main([str(root), "--out", str(tmp_path / "out"), "--formats", "png"]) == 0
    text = capsys.readouterr().out
    assert [x for x in text.splitlines() if "nodata" in x] == [f"skipped 1 run with no steps: {failed}"]
    assert "1 run(s), 1 setting(s), 1 context(s)" in text and "cifar10" not in text
    assert (tmp_path / "out" / "time_to_accuracy_model.png").exists()      # one context: no per-context suffix


def test_no_runs_is_one_line_and_nonzero(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code = main([str(tmp_path / "empty"), "--out", str(tmp_path / "out")])
    assert code != 0
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "no runs found" in err


def test_script_runs_from_the_command_line(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "plots" / "paper.py"), str(tmp_path / "nothing-here"),
                        "--out", str(tmp_path / "o")], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_reads_the_compression_benchmarks_own_csv(tmp_path):
    """The Table 3 reader understands what bench/compress_bench.py actually writes."""
    import importlib.util
    from plots.bench import multilevel_rows
    spec = importlib.util.spec_from_file_location("compress_bench", ROOT / "bench" / "compress_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "cb.csv"
    mod.main(["--quick", "--repeats", "3", "--out", str(out)])
    rows = multilevel_rows(str(out))
    assert {r["compressor"] for r in rows} >= {"topk", "dgc", "redsync", "randomk"}
    assert all(r["direct_s"] > 0 and r["multilevel_s"] > 0 and r["recompress_s"] > 0 for r in rows)
    # every repeat is in the file, so the figure's error bars exist (issue 35)
    assert all(len(r["direct_all"]) == len(r["multi_all"]) == 3 for r in rows)
    from plots.figures import _bars_note
    assert _bars_note(rows).startswith("error bars: 95% CI")


# ---------------------------------------------------------------------------------------------
# figure styling, asserted on the matplotlib objects (issue 20)

def _context(tmp_path, runs):
    """The one context of hand-made runs [(name, method, compressor, cf, floats, metrics[, write_run kwargs])]."""
    from plots.load import find_runs, load_run
    from plots.settings import build_contexts
    exp = tmp_path / "runs"
    for name, method, comp, cf, floats, metrics, *kw in runs:
        write_run(exp, name, method, comp, cf, floats, metrics, 0.5, 0.4, **(kw[0] if kw else {}))
    (ctx,) = build_contexts([load_run(d) for d in find_runs([str(exp)])[0]])
    return ctx


def _series_lines(fig):
    """The lines drawn for settings (labelled), not target lines or target-reached dots."""
    return [ln for ax in fig.axes for ln in ax.lines if not ln.get_label().startswith("_")]


def _style(line) -> tuple:
    """What tells a line apart. Any dash pattern reads "--" here, so distinct styles must differ in
    more than their dash pattern: stricter than the eye."""
    from matplotlib.colors import to_hex
    return to_hex(line.get_color()), line.get_linestyle(), line.get_marker(), line.get_fillstyle()


IDENTICAL = [("dense", "dense", "none", 100.0, [1000.0] * 10, [.2, .4, .6, .8, .85]),
             ("gravac", "gravac", "dgc", 100.0, [1000.0] * 10, [.2, .4, .6, .8, .85]),   # never compressed
             ("topk10", "static", "topk", 10.0, [100.0] * 10, [.1, .3, .5, .6, .7]),
             ("randomk10", "static", "randomk", 10.0, [100.0] * 10, [.1, .2, .3, .4, .5])]


@pytest.mark.parametrize("which", ["floats_cumulative", "metric_vs_iterations"])
def test_identical_curves_stay_visible_and_say_so(tmp_path, which):
    from plots import figures
    ctx = _context(tmp_path, IDENTICAL)
    fig = (figures.cumulative_figure(ctx) if which == "floats_cumulative" else figures.metric_vs_steps_figure(ctx))
    lines = {ln.get_label().split("\n")[0]: ln for ln in _series_lines(fig)}
    gravac = lines["GraVAC ε=0.7 (dgc)"]
    assert "same curve as" in gravac.get_label() and "Dense" in gravac.get_label()
    assert _style(gravac) != _style(lines["Dense"])
    assert gravac.get_fillstyle() == "none" and gravac.get_markersize() > lines["Dense"].get_markersize()
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(t.startswith("GraVAC ε=0.7 (dgc)\n(same curve as Dense)") for t in legend)
    assert not any("same curve" in t for t in legend if t.startswith(("Dense", "Top-k")))
    # same floats sent, different accuracy: the same curve only here, and the note says the curve
    # is the same, not the run ("identical to Top-k 10x" read as identical runs, issue 41)
    if which == "floats_cumulative":
        assert "same curve as Top-k 10x" in lines["Random-k 10x"].get_label()
    else:
        assert "same curve" not in lines["Random-k 10x"].get_label()
    assert not any("identical" in t for t in legend)
    styles = [_style(ln) for ln in _series_lines(fig)]
    assert len(set(styles)) == len(styles) == 4


def test_a_block_averaged_cf_line_says_what_its_blocks_are():
    """Issue 41: GraVAC's CF figure labelled a block-averaged line "CF sent (effective per 2
    steps)", unexplained. The legend now says it is the CF of each block of steps, dense ÷ sent."""
    from types import SimpleNamespace

    import numpy as np

    from plots.figures_more import sent_cf_series
    cf = np.tile([10.0, 100.0], 150)                    # changes every step: drawn in blocks
    run = SimpleNamespace(column=lambda k: {"cf": cf, "floats_sent": 1000.0 / cf}[k])
    x, y, text = sent_cf_series(run)
    assert text == "CF sent per 3-step block (dense ÷ floats sent)"
    assert y[0] == pytest.approx(3000 / (100 + 10 + 100))   # the first block: 10x, 100x, 10x


def test_every_setting_of_a_context_has_its_own_style(tmp_path):
    """Five GraVAC settings (more than its colour family) and eleven Top-k CFs, sixteen settings
    (more than the marker list) in one figure: no two share colour, dash and marker."""
    from plots import figures
    runs = [(f"topk{cf:g}", "static", "topk", cf, [1000.0 / cf] * 10, [.1 + cf / 1e4] * 5)
            for cf in (2, 4, 8, 10, 16, 32, 64, 100, 128, 256, 512)]
    runs += [(f"gravac{e}", "gravac", "dgc", 100.0, [10.0 + e] * 10, [.2 + e / 10] * 5, dict(epsilon=e))
             for e in (0.1, 0.3, 0.5, 0.7, 0.9)]
    ctx = _context(tmp_path, runs)
    for fig in (figures.cumulative_figure(ctx), figures.metric_vs_steps_figure(ctx)):
        styles = [_style(ln) for ln in _series_lines(fig)]
        assert len(styles) == 16 and len(set(styles)) == 16


def test_x_axes_start_at_a_zero_tick(tmp_path):
    from plots import figures
    ctx = _context(tmp_path, IDENTICAL)
    figs = [figures.cumulative_figure(ctx), figures.metric_vs_steps_figure(ctx),
            figures.time_to_accuracy_figure(ctx, "model"), figures.time_to_accuracy_figure(ctx, "step_wall_s")]
    for fig in figs:
        ax = fig.axes[0]
        assert ax.get_xlim()[0] == 0 and 0 in ax.get_xticks(), ax.get_xlabel()


def test_cf_figure_puts_the_metric_on_its_own_axes(tmp_path):
    """The metric is not drawn on (a twin of) the CF axes: its own panel, own y label and ticks."""
    from plots import figures
    ctx = _context(tmp_path, [("accordion", "accordion", "randomk", 100.0, [600.0] * 5 + [1.0] * 5,
                               [.1, .2, .3, .5, .6])])
    fig = figures.cf_figure(ctx, ctx.groups[0])
    cf_ax = next(ax for ax in fig.axes if ax.get_ylabel().startswith("Compression factor"))
    metric_ax = next(ax for ax in fig.axes if ax.get_ylabel() == "Top-1 accuracy (%)")
    assert metric_ax is not cf_ax and len(fig.axes) == 2
    assert not metric_ax.get_shared_y_axes().joined(metric_ax, cf_ax)
    assert cf_ax.get_position().y0 > metric_ax.get_position().y1 - 1e-6    # stacked, not overlaid
    metric_line = next(ln for ln in metric_ax.lines if ln.get_marker() == "o")
    assert list(metric_line.get_ydata()) == pytest.approx([10, 20, 30, 50, 60])
    assert all(ln.get_ydata().max() > 1 for ln in cf_ax.lines)             # CF lines only on the CF axes
    assert metric_ax.get_yscale() == "linear" and cf_ax.get_yscale() == "log"


def test_multilevel_figure_names_compressors_as_elsewhere_and_says_cpu(tmp_path):
    from plots import figures
    from plots.bench import multilevel_rows
    csv_path = tmp_path / "cb.csv"
    csv_path.write_text("kind,size,compressor,cf,threads,direct_s,multilevel_s\n"
                        "multilevel,vgg16,topk,1000,2,0.5,0.4\nmultilevel,vgg16,randomk,1000,2,0.2,0.3\n"
                        "multilevel,vgg16,topk_torch,1000,2,2.0,1.0\n")
    rows = multilevel_rows(str(csv_path))
    assert [r["label"] for r in rows] == ["Top-k", "Random-k", "Top-k (torch)"]
    fig = figures.multilevel_figure(rows)
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert ticks == ["Top-k", "Random-k", "Top-k\n(torch)"]
    assert "timed on a CPU (2 threads)" in fig._suptitle.get_text().replace("\n", " ")


def test_finds_results_compress_bench_csv_without_a_flag(tmp_path, monkeypatch, capsys):
    """`plots/paper.py results/runs/<experiment>` finds results/compress_bench.csv; --bench still wins."""
    results = tmp_path / "results"
    write_run(results / "runs" / "exp", "dense", "dense", "none", 100.0, [1000.0] * 10, [.2, .4, .6, .8, .85],
              1.0, 0.5)
    (results / "compress_bench.csv").write_text("model,compressor,cf,mode,median_s\n"
                                                "vgg16,topk,1000,direct,0.030\nvgg16,topk,1000,multilevel,0.015\n")
    other = tmp_path / "other.csv"
    other.write_text("model,compressor,cf,mode,median_s\nlstm,dgc,1000,direct,0.04\nlstm,dgc,1000,multilevel,0.01\n")
    monkeypatch.chdir(tmp_path)
    assert main([str(results / "runs" / "exp"), "--out", "o1", "--formats", "png"]) == 0
    assert "results/compress_bench.csv (found by itself" in capsys.readouterr().out
    assert [r["model"] for r in read_csv(tmp_path / "o1" / "multilevel.csv")] == ["vgg16"]
    assert main([str(results / "runs" / "exp"), "--out", "o2", "--formats", "png", "--bench", str(other)]) == 0
    assert [r["model"] for r in read_csv(tmp_path / "o2" / "multilevel.csv")] == ["lstm"]
    write_run(tmp_path / "elsewhere", "dense", "dense", "none", 100.0, [1000.0] * 10, [.2] * 5, 1.0, 0.5)
    assert main([str(tmp_path / "elsewhere"), "--out", "o3", "--formats", "png"]) == 0   # default under cwd
    assert (tmp_path / "o3" / "multilevel.csv").exists()
    assert main([str(results / "runs" / "exp"), "--out", "o4", "--formats", "png", "--no-bench"]) == 0
    assert not (tmp_path / "o4" / "multilevel.csv").exists()   # bench/reference.py without a CSV
    assert "results/compress_bench.csv" in (tmp_path / "o1" / "multilevel.md").read_text()
    assert str(tmp_path) not in (tmp_path / "o1" / "multilevel.md").read_text()   # no absolute path


def test_perplexity_axis_over_a_decade_has_several_labels(tmp_path):
    """Perplexity 2500 -> 250 spans one decade and a bit: besides the lone major "1000", the 2-3-5
    minor ticks are labelled."""
    from plots import figures
    lm = dict(model="lstm_mini", metric="perplexity", target=300.0)
    ctx = _context(tmp_path, [("dense", "dense", "none", 100.0, [1000.0] * 10, [2500, 1200, 700, 400, 250], lm)])
    fig = figures.metric_vs_steps_figure(ctx)
    fig.canvas.draw()
    ax = fig.axes[0]
    shown = [t.get_text() for t in ax.get_yticklabels() + ax.get_yticklabels(minor=True)
             if t.get_text() and ax.get_ylim()[0] <= t.get_position()[1] <= ax.get_ylim()[1]]
    assert {"300", "500", "1000", "2000"} <= set(shown)


def test_eight_settings_of_other_methods_get_eight_colours(tmp_path):
    """A MergeComp grid (4 schedules x Top-k/DGC) in one figure: every setting its own colour, not
    only its own marker."""
    from plots import figures
    from matplotlib.colors import to_hex
    runs = [(f"mc-{comp}{cf:g}", "mergecomp", comp, cf, [1000.0 / cf] * 10, [.1 + cf / 1e4] * 5)
            for comp in ("topk", "dgc") for cf in (10, 20, 50, 100)]
    ctx = _context(tmp_path, runs)
    lines = _series_lines(figures.metric_vs_steps_figure(ctx))
    assert len(lines) == 8 and len({to_hex(ln.get_color()) for ln in lines}) == 8


DAMAGE = {"null": "steps.jsonl record 4: step=null is not a step number",
          "three": 'steps.jsonl record 4: step="three" is not a step number',
          "nan": "steps.jsonl record 4: step=NaN is not a step number",
          "four": "cluster.workers='four' is not a whole number (config.yaml)"}


def damage(d: Path, kind: str) -> None:
    """Damage run folder `d` as a hand edit or a broken writer could: the 4th step record's step
    becomes null, "three" or NaN, or config.yaml says `cluster.workers: four`."""
    if kind == "four":
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        cfg["cluster"]["workers"] = "four"
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))
        return
    lines = (d / "steps.jsonl").read_text().splitlines()
    rec = json.loads(lines[3])
    rec["step"] = {"null": None, "three": "three", "nan": math.nan}[kind]
    lines[3] = json.dumps(rec)
    (d / "steps.jsonl").write_text("\n".join(lines) + "\n")


def test_damaged_runs_are_left_out_with_the_reason_and_the_rest_is_made(tmp_path, capsys):
    exp = tmp_path / "runs"
    write_run(exp, "dense", "dense", "none", 100.0, [1000.0] * 10, [.2, .4, .6, .8, .85], 1.0, 0.5)
    write_run(exp, "gravac", "gravac", "dgc", 100.0, [100.0] * 10, [.2, .5, .6, .7, .8], 0.6, 0.3, extra=gravac_extra)
    for kind in DAMAGE:
        damage(write_run(exp, f"bad-{kind}", "static", "topk", 10.0, [100.0] * 10, [.1, .3, .5, .6, .7], 0.5, 0.4),
               kind)
    out = tmp_path / "out"
    assert main([str(exp), "--out", str(out), "--formats", "png", "--figures", "all"]) == 0
    text, index = capsys.readouterr().out, (out / "README.md").read_text()
    for kind, why in DAMAGE.items():
        assert f"skipped damaged run {exp / f'bad-{kind}'}: {why}" in text.splitlines()
        assert f"- `{exp / f'bad-{kind}'}`: {why}" in index
    assert "2 run(s), 2 setting(s), 1 context(s)" in text
    assert (out / "floats_cumulative.png").exists() and len(read_csv(out / "comm_savings.csv")) == 1


def _unwritable(tmp_path: Path) -> Path:
    """A folder this process cannot create files in: mode 0o500, or for root (who ignores modes)
    /sys, where nobody can."""
    if os.geteuid() == 0:
        return Path("/sys")
    d = tmp_path / "read-only"
    d.mkdir(mode=0o500)
    return d


def test_an_out_that_cannot_take_files_is_one_line(tmp_path, capsys):
    runs = make_fixture(tmp_path)
    (tmp_path / "a-file").write_text("")
    for out, why in ((tmp_path / "a-file", "is a file, not a folder"), (_unwritable(tmp_path), "cannot write into"),
                     (tmp_path / "a-file" / "sub", "Not a directory")):
        assert main([str(runs), "--out", str(out), "--formats", "png"]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and why in err and "give --out a folder you can write to" in err, err


# ---------------------------------------------------------------------------------------------
# python -m plots.compare (issue 41, item 3)

def test_compare_two_committed_settings(tmp_path, capsys):
    """Dense against Top-k 10x over the committed vgg_mini seeds: means, CIs, n and verdicts, and
    the table and figure written with --out."""
    from plots.compare import main
    runs = ROOT / "results" / "reference" / "mini_vgg" / "runs"
    paths = [str(p) for p in sorted(runs.glob("dense-s*"))] + [str(p) for p in sorted(runs.glob("top-k-10x-s*"))]
    assert len(paths) == 10
    assert main([*paths, "--out", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    assert "- Dense (n=5)" in out and "- Top-k 10x (n=5)" in out
    assert "last-3 mean              68.27 [" in out          # REPRODUCING: dense last-3 mean 68.27%
    assert "worse (-5.34 pp [" in out and "reached                  5 of 5" in out
    rows = list(csv.DictReader(open(tmp_path / "cmp" / "compare.csv")))
    assert [r["setting"] for r in rows] == ["Dense", "Top-k 10x"]
    assert rows[0]["time_vs_baseline"] == "baseline" and rows[1]["time_vs_baseline"].startswith("slower")
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 10_000
    # the other setting as baseline flips the verdict
    assert main([*paths, "--baseline", "Top-k 10x"]) == 0
    assert "better (+5.34 pp [" in capsys.readouterr().out


def test_compare_mistakes_are_one_line(tmp_path, capsys):
    from plots.compare import main
    assert main([str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no runs found in") and err.count("\n") == 1
    run = str(ROOT / "results" / "reference" / "mini_vgg" / "runs" / "dense-s0")
    assert main([run, "--baseline", "Nope"]) == 2
    err = capsys.readouterr().err
    assert err == "error: no setting is labelled 'Nope'; settings: Dense\n"


def test_an_option_added_later_does_not_split_replicas(tmp_path):
    """Seed 0 written before `train.warmup_steps` existed, seeds 1-2 after (with its default 0):
    one setting of 3 replicas, and the merge is reported. Runs that vary the option stay apart."""
    from plots.load import find_runs, load_run
    from plots.settings import build_contexts
    exp = tmp_path / "runs"
    for seed, warmup in ((0, None), (1, 0), (2, 0), (3, 100)):
        d = write_run(exp, f"dense-s{seed}", "dense", "none", 100.0, [1000.0] * 10, [.2, .4, .6, .8, .85], 0.5, 0.4,
                      seed=seed)
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        if warmup is not None:
            cfg["train"]["warmup_steps"] = warmup
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))

    def groups(names):
        (ctx,) = build_contexts([load_run(str(exp / n)) for n in names])
        return ctx, sorted(sorted(r.name for r in g.runs) for g in ctx.groups)

    ctx, got = groups(["dense-s0", "dense-s1", "dense-s2"])
    assert got == [["dense-s0", "dense-s1", "dense-s2"]] and ctx.merged_keys == {"train.warmup_steps": 0}
    ctx, got = groups(["dense-s0", "dense-s1", "dense-s2", "dense-s3"])    # 0 and 100: a real difference
    assert got == [["dense-s0"], ["dense-s1", "dense-s2"], ["dense-s3"]] and ctx.merged_keys == {}
    assert len(find_runs([str(exp)])[0]) == 4


# ---------------------------------------------------------------------------------------------
# readable by default on many settings (issue 41): a cap per axes, short runs apart, legend outside

def _many(n: int) -> list:
    """n static Top-k settings, each with its own CF, floats and accuracy."""
    return [(f"topk{cf}", "static", "topk", float(cf), [1000.0 / cf] * 10, [.1 + cf / 1e4] * 5)
            for cf in range(2, 2 + n)]


def test_a_context_with_more_settings_than_the_cap_is_continued(tmp_path):
    """20 settings, cap 8: three figures "(1/3)".."(3/3)", each with at most 8 curves, every
    setting drawn once, in the context's order."""
    from plots import figures
    from plots.settings import MAX_SERIES, split_parts
    ctx = _context(tmp_path, _many(20))
    parts = split_parts(ctx)
    assert len(parts) == 3 and [p.title.endswith(f"({k}/3)") for k, p in enumerate(parts, 1)] == [True] * 3
    assert [g for p in parts for g in p.groups] == ctx.groups
    for p in parts:
        fig = figures.metric_vs_steps_figure(p)
        assert 0 < len(_series_lines(fig)) <= MAX_SERIES
    assert split_parts(_context(tmp_path / "few", _many(MAX_SERIES)))[0].part == ""


def test_every_continued_figure_keeps_the_dense_baseline(tmp_path):
    """A part without Dense had nothing to compare with: Dense opens every part, the other
    settings are each drawn once."""
    from plots.settings import MAX_SERIES, split_parts
    ctx = _context(tmp_path, _many(20) + [("dense", "dense", "none", 1.0, [1000.0] * 10, [.2] * 5)])
    dense = [g for g in ctx.groups if g.method == "dense"]
    assert len(dense) == 1
    parts = split_parts(ctx)
    assert all(p.groups[0] is dense[0] and len(p.groups) <= MAX_SERIES for p in parts)
    assert sorted(id(g) for p in parts for g in p.groups[1:]) == sorted(id(g) for g in ctx.groups if g is not dense[0])


def test_legend_sits_outside_the_axes_and_is_not_taller(tmp_path):
    """After drawing, each part's legend box does not overlap its axes, is no taller than them and
    lies within the figure (one figure of 20 settings had a legend twice the height of its axes)."""
    import matplotlib.pyplot as plt
    from plots import figures
    from plots.settings import split_parts
    for p in split_parts(_context(tmp_path, _many(20))):
        for fig in (figures.cumulative_figure(p), figures.time_to_accuracy_figure(p, "model")):
            fig.canvas.draw()
            r = fig.canvas.get_renderer()
            leg, ax = fig.legends[0].get_window_extent(r), fig.axes[0].get_window_extent(r)
            assert not leg.overlaps(ax) and leg.height <= ax.height
            assert 0 <= leg.x0 and leg.x1 <= fig.bbox.width and leg.y0 >= 0    # not cut off: saved untrimmed
            plt.close(fig)


def test_short_runs_are_left_out_of_the_figures_of_a_ten_times_longer_context(tmp_path, capsys):
    """A 10-step run beside 100-step runs: not on the figures, said in the summary and the index,
    still in the tables."""
    from plots import figures
    from plots.settings import without_short_runs
    long = [.1 + .008 * j for j in range(50)]
    ctx = _context(tmp_path, [("dense", "dense", "none", 100.0, [1000.0] * 100, long),
                              ("topk10", "static", "topk", 10.0, [100.0] * 100, long[::-1]),
                              ("smoke", "static", "topk", 100.0, [10.0] * 10, [.1] * 5)])
    drawn, short = without_short_runs(ctx)
    assert [g.label for g in short] == ["Top-k 100x"] and len(drawn.groups) == 2
    labels = [ln.get_label() for ln in _series_lines(figures.cumulative_figure(drawn))]
    assert not any("100x" in x for x in labels)
    out = tmp_path / "out"
    assert main([str(tmp_path / "runs"), "--out", str(out), "--formats", "png", "--no-bench"]) == 0
    printed = capsys.readouterr().out
    assert "left out of the figures of 1 context(s), kept in the tables: 1 setting(s)" in printed
    assert "Top-k 100x" in (out / "README.md").read_text().split("## Made")[0]
    assert "Top-k 100x" in {r["setting"] for r in read_csv(out / "static_compression.csv")}


def test_a_folder_of_studies_is_drawn_study_by_study(tmp_path, capsys):
    """Two studies of the same model and cluster (as results/reference/covap and .../mergecomp):
    two contexts, not one with every setting; one experiment's folder stays one context."""
    from plots.load import assign_studies, find_runs, load_runs
    from plots.settings import build_contexts
    for study in ("covap", "mergecomp"):
        write_run(tmp_path / "ref" / study / "runs", "dense", "dense", "none", 100.0, [1000.0] * 10, [.2] * 5, 1.0, 0.5)
        write_run(tmp_path / "ref" / study / "runs", "topk10", "static", "topk", 10.0, [100.0] * 10, [.1] * 5, .5, .4)
    for root, titles in ((tmp_path / "ref", ["covap: ", "mergecomp: "]), (tmp_path / "ref" / "covap" / "runs", [""])):
        runs = load_runs(find_runs([str(root)])[0])[0]
        assign_studies(runs, [str(root)])
        ctxs = build_contexts(runs)
        assert [c.title[:len(t)] for c, t in zip(ctxs, titles)] == titles and len(ctxs) == len(titles)
        assert all(len(c.groups) == 2 for c in ctxs)
    assert main([str(tmp_path / "ref"), "--out", str(tmp_path / "out"), "--no-bench"]) == 0
    assert (tmp_path / "out" / "time_to_accuracy_model__mergecomp-resnet_mini-synthetic-4w-10gbps.png").exists()
    assert len(capsys.readouterr().out.splitlines()) <= 10


def test_clock_auto_is_the_device_it_resolved_to(tmp_path):
    """A run under the default clock.machine=auto that used the study device is a replica of one that
    named it; one that profiled its own host is a setting apart."""
    from plots.load import find_runs, load_run
    from plots.settings import build_contexts
    exp = tmp_path / "runs"
    for seed, (machine, used) in enumerate([("reference-cpu", "reference-cpu"), ("auto", "reference-cpu"),
                                            ("auto", "torch 2.14.1, cpu, 1 threads, AMD EPYC")]):
        d = write_run(exp, f"r{seed}", "static", "topk", 10.0, [100.0] * 10, [.5] * 5, 0.5, 0.4, seed=seed)
        config = yaml.safe_load((d / "config.yaml").read_text())
        config["clock"] = {"machine": machine}
        (d / "config.yaml").write_text(yaml.safe_dump(config))
        summary = json.loads((d / "summary.json").read_text())
        summary["clock"] = {"profile": {"machine": used}}
        (d / "summary.json").write_text(json.dumps(summary))
    (ctx,) = build_contexts([load_run(d) for d in find_runs([str(exp)])[0]])
    assert sorted(sorted(r.name for r in g.runs) for g in ctx.groups) == [["r0", "r1"], ["r2"]]


def test_a_figure_that_gives_up_is_closed(tmp_path):
    """A figure function that opened a figure and then skipped left it open: over a reference's
    many contexts they piled up (matplotlib's "more than 20 figures" warning)."""
    import matplotlib.pyplot as plt
    from plots import figures
    from plots.output import Outputs
    from plots.paper import _attempt

    def gives_up():
        plt.figure()
        raise figures.Skip("nothing to draw")
    before = len(plt.get_fignums())
    out = Outputs(str(tmp_path / "out"))
    assert _attempt(out, "x", False, gives_up) is None and out.skipped == [("x", "nothing to draw")]
    assert len(plt.get_fignums()) == before


def test_levels_figure_draws_each_layer_and_weighs_shares_by_size(tmp_path):
    """L-GreCo's heat map: one row per layer, levels carried forward between announcements, rows
    labelled with the layer's values, and the caption's shares weighted by them (hand-computed:
    sizes 90/10, 5 steps at 10x/10x then 5 at 100x/10x -> 10x 55%, 100x 45%)."""
    import matplotlib.pyplot as plt
    import numpy as np
    from plots import figures
    from plots.load import load_run
    levels = lambda i: {"lgreco_levels": [10.0, 10.0]} if i == 0 else {"lgreco_levels": [100.0, 10.0]} if i == 5 else {}
    ctx = _context(tmp_path, [("lg", "accordion", "topk", 100.0, [10.0] * 10, [.1, .2, .3, .4, .5],
                               {"extra": levels})])
    summary = tmp_path / "runs" / "lg" / "summary.json"
    s = json.loads(summary.read_text())
    summary.write_text(json.dumps({**s, "method_summary": {"layer_sizes": [90, 10]}}))
    ctx.groups[0].runs[:] = [load_run(str(summary.parent))]           # reread with the layer sizes
    fig = figures.levels_figure(ctx, ctx.groups[0])
    ax = fig.axes[0]
    img = ax.images[0].get_array()
    assert np.allclose(img, np.log10([[10] * 5 + [100] * 5, [10] * 10]))
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0: 90", "1: 10"]
    assert "10x 55%, 100x 45%" in fig._suptitle.get_text().replace("\n", " ")
    plt.close(fig)


def test_levels_figure_of_a_quantizer_says_bits(tmp_path):
    """L-GreCo over a quantizer records code widths: the colour bar and the caption's shares say
    bits (hand-computed: sizes 90/10, 5 steps at 4/4 bits then 5 at 2/8 -> 2-bit 45%, 4-bit 50%,
    8-bit 5%), whether the method's summary names the unit or only the setting does (config.yaml of a
    run still going)."""
    import matplotlib.pyplot as plt
    from plots import figures
    from plots.load import load_run
    levels = lambda i: {"lgreco_levels": [4, 4]} if i == 0 else {"lgreco_levels": [2, 8]} if i == 5 else {}
    ctx = _context(tmp_path, [("lgq", "accordion", "topk", 100.0, [10.0] * 10, [.1, .2, .3, .4, .5],
                               {"extra": levels})])
    summary = tmp_path / "runs" / "lgq" / "summary.json"
    s = json.loads(summary.read_text())
    for ms in ({"layer_sizes": [90, 10], "level_unit": "bits"}, {"layer_sizes": [90, 10]}):
        summary.write_text(json.dumps({**s, "method_summary": ms}))
        ctx.groups[0].runs[:] = [load_run(str(summary.parent))]
        run = ctx.groups[0].runs[0]
        if "level_unit" not in ms:                       # no method summary's unit: the setting tells it
            assert figures.level_unit(run) == "cf"
            run.config["setting"] = {**run.setting, "level_unit": "bits"}
            run.summary.pop("setting", None)
        assert figures.level_unit(run) == "bits"
        fig = figures.levels_figure(ctx, ctx.groups[0])
        bar = fig.axes[1]
        assert [t.get_text() for t in bar.get_yticklabels()] == ["2-bit", "4-bit", "8-bit"]
        assert bar.get_ylabel() == "code width of the layer"
        assert "per width: 2-bit 45%, 4-bit 50%, 8-bit 5%" in fig._suptitle.get_text().replace("\n", " ")
        plt.close(fig)


def test_levels_figure_of_ranks_labels_ranks_and_leaves_dense_layers_blank(tmp_path):
    """L-GreCo over PowerSGD: levels are ranks (summary's level_unit), a null level (a tensor always
    sent dense) is blank and out of the shares (sizes 60/30/10, rank 2/null/2 then 1/null/2 ->
    rank 1 60·5 / 70·10 = 43%, rank 2 57%)."""
    import matplotlib.pyplot as plt
    import numpy as np
    from plots import figures
    from plots.load import load_run
    levels = lambda i: {"lgreco_levels": [2, None, 2]} if i == 0 else {"lgreco_levels": [1, None, 2]} if i == 5 else {}
    ctx = _context(tmp_path, [("lg", "accordion", "topk", 100.0, [10.0] * 10, [.1, .2, .3, .4, .5],
                               {"extra": levels})])
    summary = tmp_path / "runs" / "lg" / "summary.json"
    s = json.loads(summary.read_text())
    summary.write_text(json.dumps({**s, "method_summary": {"layer_sizes": [60, 30, 10], "level_unit": "rank"}}))
    ctx.groups[0].runs[:] = [load_run(str(summary.parent))]
    assert figures.level_unit(ctx.groups[0].runs[0]) == "rank"
    fig = figures.levels_figure(ctx, ctx.groups[0])
    img = np.ma.getdata(fig.axes[0].images[0].get_array())
    assert np.isnan(img[1]).all() and np.allclose(img[0], np.log10([2] * 5 + [1] * 5))
    assert [t.get_text() for t in fig.axes[1].get_yticklabels()] == ["rank 1", "rank 2"]
    assert fig.axes[1].get_ylabel() == "rank of the layer"
    assert "parameter-steps per rank: rank 1 43%, rank 2 57%" in fig._suptitle.get_text().replace("\n", " ")
    plt.close(fig)


def test_levels_figure_skips_a_run_without_levels(tmp_path):
    from plots import figures
    from plots.draw import Skip
    ctx = _context(tmp_path, [("a", "accordion", "topk", 100.0, [10.0] * 10, [.1, .2, .3, .4, .5])])
    with pytest.raises(Skip, match="lgreco_levels"):
        figures.levels_figure(ctx, ctx.groups[0])


def test_paths_are_shown_relative_only_under_the_working_folder(tmp_path, monkeypatch):
    """A clone beside pytest's tmp folder once printed "../pytest-of-root/..." where the others
    print the absolute path: a path outside the working folder is shown as given."""
    from plots.paper import _rel
    (tmp_path / "work" / "runs").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    assert _rel(str(tmp_path / "work" / "runs" / "a")) == os.path.join("runs", "a")
    assert _rel(str(tmp_path / "other" / "a")) == str(tmp_path / "other" / "a")
    assert _rel(str(tmp_path)) == str(tmp_path)
