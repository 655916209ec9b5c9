"""The closing line adaptive methods print (Method.explain): from hand-built records, and from tiny
real runs that adapt and that do not."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import failure, make_run, run_cli
from gravac.cluster.comm import SimGroup
from gravac.methods import RunStats, build_method
from gravac.cluster.netmodel import NetworkModel

N = 1000                      # gradient elements


def method(name: str, compressor: str = "topk", sizes=(N,), **opts):
    cfg = make_run(method=dict(name=name, **opts), compressor=dict(name=compressor))
    return build_method(cfg, SimGroup(2, NetworkModel.from_cfg(cfg.network)), list(sizes), torch.device("cpu"))


def gravac_records(levels: list[str], gains: list[float]) -> list[dict]:
    return [{"step": i, "epoch": i / 10, "floats_sent": N if lv == "dense" else N / (10 if lv == "min" else 40),
             "level": lv, "cf_min": 10.0, "cf_c": 40.0, "delta_min": g} for i, (lv, g) in enumerate(zip(levels, gains))]


def test_gravac_that_never_compressed_says_why_and_what_to_try():
    m = method("gravac", epsilon=0.7)
    line = m.explain(RunStats(gravac_records(["dense"] * 4, [0.42, 0.5, 0.56, 0.45]), 10))
    assert line == ("GraVAC sent dense at all 4 steps: the smoothed paper gain at cf_min 10x was 0.42-0.56 < "
                    "epsilon 0.7; try method.epsilon=0.4 or method.gain=code or a lower method.cf_min (now 10)")


def test_gravac_that_compressed_counts_steps_cfs_and_savings():
    m = method("gravac")
    recs = gravac_records(["dense", "min", "c", "c"], [0.5, 0.8, 0.9, 0.9])
    line = m.explain(RunStats(recs, 10))
    # floats: 1000 + 100 + 25 + 25 = 1150 against 4 x 1000 dense
    assert line == "GraVAC compressed 3 of 4 steps, CFs 10x-40x (ending at 40x), 3.5x fewer floats than dense"


def accordion_records(low_layers: list[int], decisions: dict[int, dict] | None = None) -> list[dict]:
    recs = [{"step": i, "epoch": i / 4, "floats_sent": N if n == 3 else N / 2, "cf_low_layers": n}
            for i, n in enumerate(low_layers)]
    for i, d in (decisions or {}).items():
        recs[i]["accordion_decision"] = d
    return recs


def test_accordion_without_a_regime_comparison_says_the_run_is_too_short():
    m = method("accordion", sizes=(400, 300, 300), cf_low=1.5, switch_freq=10)
    first = {"epoch": 0, "reason": "check", "ratios": [None] * 3, "low_layers": [0, 1, 2]}
    line = m.explain(RunStats(accordion_records([3] * 19, {4: first}), 4))
    assert line == ("Accordion ran 1.5x on all layers for all 19 steps: it never compared regimes: the check after "
                    "epoch 1 only records gradient norms (none came before to compare with), the first comparison comes "
                    "method.switch_freq=10 epoch(s) later, at epoch 11.0 (step 44), and the run ended at epoch 4.8; "
                    "try method.switch_freq=1 (a comparison every epoch) or a longer run")


def test_accordion_already_checking_every_epoch_asks_only_for_a_longer_run():
    """Issue 41: "its first regime comparison is at the end of epoch 1 ... the run is 1.6 epochs"
    read as a contradiction. The check after epoch 1 has nothing to compare with; the line says
    so, and that the first comparison is at epoch 2.0, beside where the run ended."""
    m = method("accordion", sizes=(400, 300, 300), cf_low=1.5, switch_freq=1)
    first = {"epoch": 0, "reason": "check", "ratios": [None] * 3, "low_layers": [0, 1, 2]}
    line = m.explain(RunStats(accordion_records([3] * 7, {4: first}), 4))   # 1.75 epochs: no comparison yet
    assert "the check after epoch 1 only records gradient norms" in line
    assert line.endswith("at epoch 2.0 (step 8), and the run ended at epoch 1.8; try a run of at least 3 epochs "
                         "(train.epochs=3)")
    assert "switch_freq=1" not in line.split("try")[1]


def test_accordion_whose_comparisons_all_found_critical_regimes_suggests_eta():
    m = method("accordion", sizes=(400, 300, 300), cf_low=1.5, switch_freq=1, eta=0.5)
    decisions = {4: {"epoch": 0, "reason": "check", "ratios": [None] * 3},
                 8: {"epoch": 1, "reason": "check", "ratios": [0.9, 0.74, 2.0]}}
    line = m.explain(RunStats(accordion_records([3] * 10, decisions), 4))
    assert line.endswith("each of its 1 regime comparisons found every layer's gradient norm changed by >= eta 0.5 "
                         "(smallest change 0.74), a critical regime; try method.eta=0.8 or a longer run")


def test_accordion_that_switched_says_when_and_how_much():
    m = method("accordion", sizes=(400, 300, 300), cf_low=1.5, cf_high=1000, switch_freq=1)
    line = m.explain(RunStats(accordion_records([3, 3, 3, 3, 3, 3, 3, 3, 1, 0]), 4))
    # floats: 8 x 1000 + 2 x 500 = 9000 against 10 x 1000
    assert line == ("Accordion ran 1000x on some layers at 2 of 10 steps (from step 8, epoch 2.0) and 1.5x on all "
                    "layers otherwise, 1.1x fewer floats than dense")


def test_static_and_dense_explain_nothing():
    recs = [{"step": 0, "epoch": 0, "floats_sent": N, "cf": 1.0}]
    assert method("static").explain(RunStats(recs, 10)) is None
    assert method("dense", compressor="none").explain(RunStats(recs, 10)) is None


TINY = ["dataset.image_size=8", "dataset.train_size=128", "dataset.test_size=64", "model.width=4",
        "train.batch_size=8", "cluster.workers=2", "cluster.threads=1", "logger.progress=false"]


def run_tiny(tmp_path: Path, args: list[str]) -> tuple[str, dict]:
    """A tiny real run (8 steps per epoch): its stdout and summary.json."""
    r = run_cli([*TINY, f"experiment.results_root={tmp_path}", *args], timeout=600)
    assert r.returncode == 0, failure(r)
    (run,) = [p for p in tmp_path.glob("*/*") if p.is_dir()]
    return r.stdout, json.loads((run / "summary.json").read_text())


@pytest.mark.slow   # 14-33 s: the default suite stays near 15 min; CI runs it with -m slow
def test_real_gravac_runs_explain_both_outcomes(tmp_path):
    out, s = run_tiny(tmp_path / "dense", ["method=gravac", "method.epsilon=1.0", "train.steps=6"])
    assert s["explanation"].startswith("GraVAC sent dense at all 6 steps: the smoothed paper gain at cf_min 10x")
    assert s["explanation"] in out.splitlines()
    out, s = run_tiny(tmp_path / "adapted", ["method=gravac", "method.epsilon=0.01", "method.window=3",
                                             "train.steps=6"])
    assert s["explanation"].startswith("GraVAC compressed 6 of 6 steps, CFs 20x-")
    assert s["explanation"] in out.splitlines()


@pytest.mark.slow   # 14-33 s: the default suite stays near 15 min; CI runs it with -m slow
def test_real_accordion_runs_explain_both_outcomes(tmp_path):
    out, s = run_tiny(tmp_path / "low", ["method=accordion", "train.steps=12"])
    assert s["explanation"] == ("Accordion ran 1.5x on all layers for all 12 steps: it never compared regimes: the "
                                "check after epoch 1 only records gradient norms (none came before to compare with), "
                                "the first comparison comes method.switch_freq=10 epoch(s) later, at epoch 11.0 (step "
                                "88), and the run ended at epoch 1.5; try method.switch_freq=1 with a run of at least 3 "
                                "epochs (train.epochs=3)")
    assert s["explanation"] in out.splitlines()
    out, s = run_tiny(tmp_path / "high", ["method=accordion", "method.switch_freq=1", "method.eta=100",
                                          "train.steps=20"])
    assert s["explanation"].startswith("Accordion ran 1000x on some layers at 4 of 20 steps (from step 16, epoch 2.0)")


def readme_example(method: str) -> list[str]:
    """The arguments of README.md's `python bench/run.py method=<method> ...` example line."""
    import shlex
    for line in (Path(__file__).resolve().parents[1] / "README.md").read_text().splitlines():
        if line.startswith(f"python bench/run.py method={method} "):
            return shlex.split(line, comments=True)[2:]
    raise AssertionError(f"README.md has no `python bench/run.py method={method} ...` example")


@pytest.mark.slow
def test_the_readme_gravac_example_compresses(tmp_path):
    # the README's command, only shorter: GraVAC compresses from about step 25 on (the code gain's
    # 25-step window fills first), so 40 steps show it
    args = readme_example("gravac")
    r = run_cli([*args, "train.steps=40", "cluster.threads=1", "logger.progress=false",
                 f"experiment.results_root={tmp_path}"], timeout=900)
    assert r.returncode == 0, failure(r)
    (run,) = [p for p in tmp_path.glob("*/*") if p.is_dir()]
    levels = [json.loads(line)["level"] for line in (run / "steps.jsonl").read_text().splitlines()]
    assert len(levels) == 40 and any(lv != "dense" for lv in levels), levels
    assert "GraVAC compressed" in r.stdout
