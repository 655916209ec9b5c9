"""The reproduction study: its presets and grid arms compose to what REPRODUCING.md says, and
bench/reference.py curates raw runs into a reference that redraws itself."""
from __future__ import annotations

import csv
import functools
import gzip
import os
import sys
from pathlib import Path

import pytest

from conftest import CONF, ROOT, compose
from gravac.config.compose import build_config
from plots.load import load_run

sys.path.insert(0, str(ROOT / "bench"))
import reference  # noqa: E402

from test_plots import make_fixture, write_run  # noqa: E402

ARMS = sorted(f[:-5] for f in os.listdir(CONF / "arm") if f.endswith(".yaml"))
# arm -> (method, compressor, static cf, epsilon, policy, cf_max)
EXPECTED = {
    "dense": ("dense", None, None, None, None, None),
    **{f"{c}{cf}": ("static", c, cf, None, None, None) for c in ("topk", "dgc", "redsync", "randomk") for cf in (10, 1000)},
    **{f"topk{cf}": ("static", "topk", cf, None, None, None) for cf in (8, 16, 32, 64, 100, 260, 320, 400)},
    **{a: ("static", c, None, None, None, None) for a, c in (("qsgd8", "qsgd"), ("terngrad", "terngrad"),
                                                             ("efsignsgd", "efsignsgd"), ("quant4", "quant"))},
    "fp16": ("static", "fp16", None, None, None, None),              # CF 2, fixed by the cast
    "lgreco100": ("lgreco", "topk", None, None, None, None),
    "lgreco_quant4": ("lgreco", "quant", None, None, None, None),
    "lgreco_accordion_topk": ("lgreco_accordion", "topk", None, None, None, None),
    "accordion_randomk": ("accordion", "randomk", None, None, None, None),
    "accordion_topk": ("accordion", "topk", None, None, None, None),
    "gravac03": ("gravac", "dgc", None, 0.3, "exponential", 1000),
    "gravac07": ("gravac", "dgc", None, 0.7, "exponential", 1000),
    "gravac09": ("gravac", "dgc", None, 0.9, "exponential", 1000),
    "gravac_redsync_geo": ("gravac", "redsync", None, 0.7, "geometric", 2000),
    "gravac07_code": ("gravac", "dgc", None, 0.7, "exponential", 1000),
    "gravac09_code": ("gravac", "dgc", None, 0.9, "exponential", 1000),
    "gravac07_accepted": ("gravac", "dgc", None, 0.7, "exponential", 1000),
    "gravac_randomk": ("gravac", "randomk", None, 0.7, "exponential", 1000),
    "accordion_powersgd": ("accordion_powersgd", "none", None, None, None, None),
    "powersgd2": ("powersgd", "none", None, None, None, None),
    "lgreco_powersgd2": ("lgreco_powersgd", "none", None, None, None, None),
    "exdyna1000": ("exdyna", "none", 1000, None, None, None),      # cf: the global density
    "micro1000": ("micro", "none", 1000, None, None, None),
    "exdyna1000_calibrated": ("exdyna", "none", 1000, None, None, None),
    "topk8000": ("static", "topk", 8000, None, None, None),          # k = K/8: exdyna1000's global K
    "dgc8000": ("static", "dgc", 8000, None, None, None),
    **{a: ("covap", "none", None, None, None, None) for a in ("covap", "covap2", "covap4", "covap8", "covap_f1", "covap_overlap")},
    **{f"mergecomp_{c}100{v}": ("mergecomp", c, 100, None, None, None)
       for c in ("topk", "dgc") for v in ("", "_exhaustive", "_layerwise", "_whole")},
}
# arm -> method options beyond the table above
EXTRA = {"gravac07_code": {"gain": "code"}, "gravac09_code": {"gain": "code"},
         "gravac07_accepted": {"grow_if": "accepted"}, "gravac_randomk": {"cf_min": 1.5, "step": 2.0},
         "accordion_powersgd": {"rank": 1, "rank_critical": 2}, "powersgd2": {"rank": 2},
         "lgreco_powersgd2": {"rank": 2, "candidates": [1, 2, 3, 4], "period": 100, "window": 10},
         "exdyna1000_calibrated": {"threshold_start": "calibrated"},
         "lgreco100": {"default_cf": 100, "period": 100, "window": 10},
         "lgreco_quant4": {"bits": [8, 4, 2], "period": 100, "window": 10},
         "lgreco_accordion_topk": {"cf_low": 1.5, "cf_high": 1000, "period": 100, "window": 10,
                                   "candidates": [1.5, 10, 20, 50, 100, 200, 1000]},
         "covap": {"drop_rate": "auto", "ef": "schedule"}, "covap_f1": {"drop_rate": 4, "ef": "constant"},
         "covap_overlap": {"drop_rate": "overlap", "ef": "schedule", "overlap_tol": 0.02},
         **{f"covap{r}": {"drop_rate": r, "ef": "schedule"} for r in (2, 4, 8)},
         **{f"mergecomp_{c}100{v}": opts for c in ("topk", "dgc") for v, opts in (
             ("", {"groups": 2, "search": "binary"}), ("_exhaustive", {"groups": 2, "search": "exhaustive"}),
             ("_layerwise", {"groups": 0, "search": "none"}), ("_whole", {"groups": 1, "search": "none"}))}}


def test_every_arm_is_known():
    assert ARMS == sorted(EXPECTED)


@functools.lru_cache(maxsize=None)
def family_config(exp: str):
    """The family's own config, composed once for all its arms (a Hydra compose costs ~0.5 s)."""
    return build_config(compose([f"experiment={exp}"]))


@pytest.mark.parametrize("exp", ["mini_vgg", "mini_resnet", "mini_lstm"])
@pytest.mark.parametrize("arm", ARMS)
def test_arm_sets_method_and_keeps_the_family(exp, arm):
    base = family_config(exp)
    run = build_config(compose([f"experiment={exp}", f"arm={arm}"]))
    method, comp, cf, eps, policy, cf_max = EXPECTED[arm]
    assert run.method.name == method
    if comp:
        assert run.compressor.name == comp
    if cf:
        assert run.compressor.cf == cf
    if eps is not None:
        assert (run.method.epsilon, run.method.policy, run.method.cf_max) == (eps, policy, cf_max)
    for key, value in EXTRA.get(arm, {}).items():
        assert getattr(run.method, key) == value
    if method == "accordion":
        assert (run.method.cf_low, run.method.cf_high, run.method.eta) == (1.5, 1000, 0.5)
    # the family's scale wins over the method presets' paper values (window 500, switch_freq 10);
    # each method's config holds only its own options, so each is checked where it exists
    for key, family in (("window", 100), ("switch_freq", 1)):
        if method in ("gravac", "accordion"):
            assert hasattr(run.method, key) == (key == ("window" if method == "gravac" else "switch_freq"))
        if hasattr(run.method, key) and key not in EXTRA.get(arm, {}):   # an arm's own value is checked above
            assert getattr(run.method, key) == family
    assert (run.model, run.dataset, run.train, run.cluster, run.network) == \
        (base.model, base.dataset, base.train, base.cluster, base.network)


def test_study_families():
    vgg, res, lstm = (family_config(e) for e in ("mini_vgg", "mini_resnet", "mini_lstm"))
    assert (vgg.model.name, vgg.dataset.name, vgg.network.bandwidth_gbps) == ("vgg_mini", "cifar10", 1.0)
    assert (res.model.name, res.model.blocks, res.dataset.name, res.network.bandwidth_gbps) == \
        ("resnet_mini", 1, "cifar10", 0.1)
    assert (lstm.model.name, lstm.model.tie_weights, lstm.dataset.name, lstm.train.target_metric) == \
        ("lstm_mini", True, "ptb", "perplexity")
    for r in (vgg, res, lstm):
        assert r.cluster.backend == "sim" and r.cluster.workers >= 8 and r.train.target > 0
        assert r.network.comm_ratio == 0  # a fixed bandwidth: every run of a grid sees the same network


@pytest.mark.parametrize("model,dataset", [("resnet101", "cifar10"), ("vgg16", "cifar100"), ("lstm", "ptb")])
def test_paper_scale_presets(model, dataset):
    run = build_config(compose([f"experiment=paper_{model}", "arm=gravac07"]))
    assert (run.model.name, run.dataset.name) == (model, dataset)
    assert (run.cluster.backend, run.cluster.device, run.cluster.workers) == ("ddp", "cuda", 32)
    assert run.network.enabled is False and run.method.window == 500  # the paper's window
    assert run.train.target == {"resnet101": 0.8, "vgg16": 0.9, "lstm": 22.0}[model]


# ------------------------------------------------------------------------------------------------
# bench/reference.py


def _study_fixture(tmp_path: Path) -> Path:
    """test_plots' runs, plus an older duplicate of Dense and a run that was killed."""
    runs = make_fixture(tmp_path)
    exp = runs / "fixture"
    os.rename(exp / "dense", exp / "z-dense-newer")  # run ids sort by time: this one is the newer
    write_run(exp, "a-dense-older", "dense", "none", 100.0, [1000.0] * 10, [.1, .1, .1, .1, .1], 1.0, 0.5)
    write_run(exp, "killed", "static", "dgc", 10.0, [100.0] * 10, [.1, .2, .3, .4, .5], 0.5, 0.4, summary=False)
    return runs


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_reference_curates_runs_and_redraws_from_the_copies(tmp_path, capsys):
    runs = _study_fixture(tmp_path)
    bench = tmp_path / "bench.csv"
    bench.write_text("model,compressor,cf,mode,median_s\nresnet101,topk,1000,direct,0.02\n"
                     "resnet101,topk,1000,multilevel,0.0125\n")
    out = tmp_path / "reference"
    assert reference.main([str(runs), "--out", str(out), "--experiments", "fixture", "--bench", str(bench),
                           "--every", "3"]) == 0
    said = capsys.readouterr().out
    assert "a-dense-older: replaced by the newer run" in said and "killed: incomplete" in said

    names = sorted(os.listdir(out / "fixture" / "runs"))
    assert names == ["accordion-randomk-1.5x-1000x-s0", "dense-s0", "gravac-eps0.7-dgc-s0", "top-k-100x-s0",
                     "top-k-10x-s0", "top-k-10x-s1"]
    dense = out / "fixture" / "runs" / "dense-s0"
    assert sorted(os.listdir(dense)) == ["config.yaml", "evals.jsonl", "origin.txt", "steps.jsonl.gz", "summary.json"]
    assert (dense / "origin.txt").read_text() == "z-dense-newer\n"
    raw = runs / "fixture" / "z-dense-newer" / "steps.jsonl"
    assert gzip.decompress((dense / "steps.jsonl.gz").read_bytes()) == raw.read_bytes()
    copy, orig = load_run(str(dense)), load_run(str(raw.parent))
    assert not copy.problems and list(copy.cumulative("floats_sent")) == list(orig.cumulative("floats_sent"))

    rows = {(r["setting"], r["seed"]): r for r in _rows(out / "fixture" / "runs.csv")}
    assert len(rows) == 6
    d, g = rows[("Dense", "0")], rows[("GraVAC ε=0.7 (dgc)", "0")]
    assert (d["target_step"], float(d["floats_to_target"]), float(d["floats_sent"])) == ("6", 6000, 10000)
    assert (g["target_step"], float(g["floats_to_target"]), float(g["floats_vs_dense"])) == ("6", 420, pytest.approx(10000 / 460, rel=1e-5))
    assert rows[("Top-k 100x", "0")]["target_step"] == ""  # never reached
    assert float(rows[("Top-k 10x", "1")]["mean_gain"]) == pytest.approx(0.82 - 0.045)

    curve = [r for r in _rows(out / "fixture" / "curves.csv") if r["setting"] == "GraVAC ε=0.7 (dgc)"]
    # every 3rd step, every evaluation (2, 4, ...) and the last step
    assert [int(r["step"]) for r in curve] == [2, 3, 4, 6, 8, 9, 10]
    at6 = next(r for r in curve if r["step"] == "6")
    assert (float(at6["floats_cum"]), float(at6["metric"])) == (420, 0.6)

    line = summary_cells(out / "summary.md")
    # Top-k 10x: to target after 8 and 6 steps at 0.5 modelled s/step = 3.5 s on average, and with two
    # seeds the percentile-bootstrap 95% CI is their range; GraVAC 6 x 0.6 s
    top = line["Top-k 10x"]
    assert top["seeds"] == "2" and top["modelled s to target"] == "3.5 [3, 4]" and top["speedup vs Top-k 10x"] == "1x"
    # last-3 means (.5+.6+.7)/3 and (.6+.65+.7)/3
    assert top["reached"] == "2 of 2" and top["last-3 mean"] == "62.50% [60.00%, 65.00%]"
    assert top["vs Dense: last-3 mean"] == "one seed: not tested" and top["vs Top-k 10x: last-3 mean"] == "baseline"
    assert line["GraVAC ε=0.7 (dgc)"]["speedup vs Top-k 10x"] == f"{3.5 / 3.6:.3g}x"
    assert line["Dense"]["speedup vs Top-k 10x"] == f"{3.5 / 6:.3g}x"
    never = line["Top-k 100x"]
    assert never["modelled s to target"] == "not reached (whole run 3)" and never["reached"] == "0 of 1"
    assert never["speedup vs Top-k 10x"] == "not reached"

    index = (out / "plots" / "README.md").read_text()
    assert "fixture/runs" in index and str(tmp_path) not in index  # drawn from the copies, paths relative
    for stem in ("floats_cumulative.png", "comm_savings.csv", "static_compression.csv", "multilevel.csv"):
        assert (out / "plots" / stem).exists(), stem
    assert not (tmp_path / "reference.new").exists() and not (tmp_path / "reference.old").exists()


def summary_cells(path: Path) -> dict[str, dict[str, str]]:
    """summary.md's table rows as {setting: {column: cell}}."""
    rows = [[c.strip() for c in ln.strip("|").split(" | ")] for ln in path.read_text().splitlines()
            if ln.startswith("| ")]
    head = rows[0]
    return {r[0]: dict(zip(head, r)) for r in rows[1:]}


def test_reference_regenerates_byte_identical(tmp_path):
    """Two curations of the same runs write the same bytes, tables and figures alike: the bootstrap
    behind every CI and verdict is seeded."""
    runs = _study_fixture(tmp_path)
    for s in (1, 2, 3, 4):   # five Dense seeds: CIs narrower than the range, where the resamples matter
        write_run(runs / "fixture", f"dense-s{s}", "dense", "none", 100.0, [1000.0] * 10,
                  [.2, .4, .6 + s / 70, .8 - s / 30, .8 + s / 50], 1.0 + s / 10, 0.5, seed=s)
    outs = [tmp_path / "ref1", tmp_path / "ref2"]
    for out in outs:
        assert reference.main([str(runs), "--out", str(out), "--experiments", "fixture", "--bench", ""]) == 0
    files = [sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file()) for out in outs]
    assert files[0] == files[1] and len(files[0]) > 20
    differ = [str(f) for f in files[0] if (outs[0] / f).read_bytes() != (outs[1] / f).read_bytes()]
    assert not differ
    cells = summary_cells(outs[0] / "summary.md")["Top-k 10x"]
    assert cells["vs Dense: last-3 mean"].startswith("worse (")      # 0.625 vs Dense's ~0.75, both n >= 2


def test_reference_is_replaced_whole_and_kept_on_failure(tmp_path, capsys):
    runs = _study_fixture(tmp_path)
    out = tmp_path / "reference"
    assert reference.main([str(runs), "--out", str(out), "--experiments", "fixture", "--bench", ""]) == 0
    (out / "stale.txt").write_text("from an earlier study")
    (out / "fixture" / "stale.txt").write_text("from an earlier study")
    (out / "other_study").mkdir()                         # curated separately, e.g. --out reference/gain_arms
    (out / "other_study" / "summary.md").write_text("kept")
    assert reference.main([str(runs), "--out", str(out), "--experiments", "fixture", "--bench", ""]) == 0
    assert not (out / "stale.txt").exists() and not (out / "fixture" / "stale.txt").exists()
    assert (out / "other_study" / "summary.md").read_text() == "kept"
    assert "kept as they were (other studies): other_study" in capsys.readouterr().out
    before = sorted(p.name for p in out.rglob("*"))
    assert reference.main([str(tmp_path / "nothing"), "--out", str(out), "--experiments", "fixture"]) == 2
    assert "no completed run of fixture" in capsys.readouterr().err
    assert sorted(p.name for p in out.rglob("*")) == before


def test_gzipped_steps_read_like_plain(tmp_path):
    runs = make_fixture(tmp_path)
    d = runs / "fixture" / "gravac"
    plain = load_run(str(d))
    (d / "steps.jsonl.gz").write_bytes(gzip.compress((d / "steps.jsonl").read_bytes()))
    (d / "steps.jsonl").unlink()
    zipped = load_run(str(d))
    assert zipped.steps == plain.steps and not zipped.problems
    whole = (d / "steps.jsonl.gz").read_bytes()
    (d / "steps.jsonl.gz").write_bytes(whole[: len(whole) // 2])  # a copy cut short
    cut = load_run(str(d))
    assert cut.problems and len(cut.steps) < len(plain.steps)


def test_reference_recurates_a_curated_reference(tmp_path):
    """A curated folder (steps.jsonl.gz only) can be curated again, e.g. into another study's
    folder: its gzipped records are copied as they are."""
    runs = _study_fixture(tmp_path)
    first, second = tmp_path / "first", tmp_path / "second"
    assert reference.main([str(runs), "--out", str(first), "--experiments", "fixture", "--bench", ""]) == 0
    assert reference.main([str(first / "fixture"), "--out", str(second), "--experiments", "fixture", "--bench", ""]) == 0
    a, b = first / "fixture" / "runs", second / "fixture" / "runs"
    assert sorted(os.listdir(a)) == sorted(os.listdir(b))
    for name in os.listdir(a):
        assert (a / name / "steps.jsonl.gz").read_bytes() == (b / name / "steps.jsonl.gz").read_bytes()
    rows = _rows(first / "fixture" / "runs.csv")
    assert rows == _rows(second / "fixture" / "runs.csv")        # `run` still names the raw folder
    assert "z-dense-newer" in {r["run"] for r in rows} <= set(os.listdir(runs / "fixture"))


def test_reference_leaves_damaged_runs_out_as_plots_paper_does(tmp_path, capsys):
    """bench/reference.py reads runs through plots.load as plots/paper.py does: a damaged run is
    left out with its reason, the others are curated and drawn."""
    from test_plots import DAMAGE, damage
    runs = make_fixture(tmp_path)
    for kind in ("null", "four"):
        damage(runs / "fixture" / {"null": "topk100", "four": "accordion"}[kind], kind)
    out = tmp_path / "reference"
    assert reference.main([str(runs), "--out", str(out), "--experiments", "fixture", "--bench", ""]) == 0
    said = capsys.readouterr().out
    assert f"left out: {runs / 'fixture' / 'topk100'}: damaged ({DAMAGE['null']})" in said
    assert f"left out: {runs / 'fixture' / 'accordion'}: damaged ({DAMAGE['four']})" in said
    assert sorted(os.listdir(out / "fixture" / "runs")) == ["dense-s0", "gravac-eps0.7-dgc-s0", "top-k-10x-s0",
                                                            "top-k-10x-s1"]
    assert (out / "plots" / "floats_cumulative.png").exists()


def test_reference_out_that_cannot_take_files_is_one_line(tmp_path, capsys):
    """As plots/paper.py: an --out that is a file (kept as it is) or lies in a folder that takes
    no files is one line, before anything is curated."""
    from test_plots import _unwritable
    runs = make_fixture(tmp_path)
    (tmp_path / "a-file").write_text("mine")
    for out, why in ((tmp_path / "a-file", "is a file, not a folder"),
                     (_unwritable(tmp_path) / "reference", "cannot write into")):
        assert reference.main([str(runs), "--out", str(out), "--experiments", "fixture", "--bench", ""]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and why in err and "give --out a folder you can write to" in err, err
    assert (tmp_path / "a-file").read_text() == "mine"
