"""The warning paper-scale presets print before their first step when far from the paper's setting."""
from __future__ import annotations

import os

from conftest import compose, failure, run_cli
from gravac.config.compose import build_config
from gravac.loop.scale import duration, paper_gap, paper_warning


def run_of(overrides: list[str]):
    return build_config(compose(overrides), overrides=overrides)


def test_paper_presets_on_a_cpu_are_warned_with_what_differs():
    gaps = paper_gap(run_of(["model=resnet101"]))
    assert gaps == ["device cpu (paper: cuda)", "4 workers (paper: 32)",
                    "global batch 128 at lr 0.1 (paper: 1024 at lr 0.1)"]
    assert paper_gap(run_of(["model=vgg16", "method=gravac"]))[:2] == gaps[:2]
    assert paper_gap(run_of(["model=lstm"]))[2] == "global batch 80 at lr 0.1 (paper: 640 at lr 0.1)"


def test_fewer_workers_than_the_paper_on_gpus_are_warned_too():
    assert paper_gap(run_of(["model=resnet101", "cluster.device=cuda", "cluster.workers=8"])) == [
        "8 workers (paper: 32)", "global batch 256 at lr 0.1 (paper: 1024 at lr 0.1)"]


def test_the_paper_setting_and_cpu_sized_models_are_not_warned():
    assert paper_gap(run_of(["experiment=paper_resnet101"])) == []
    assert paper_gap(run_of(["experiment=paper_vgg16", "cluster.workers=64"])) == []
    assert paper_gap(run_of([])) == []                      # resnet_mini: no paper setting declared
    assert paper_gap(run_of(["experiment=mini_resnet"])) == []
    assert paper_warning(run_of(["experiment=mini_vgg"]), 1.0, 800) == []


def test_the_warning_states_time_differences_and_what_to_run_instead():
    lines = paper_warning(run_of(["model=vgg16", "method=gravac"]), 12.0, 20000)
    assert len(lines) == 2
    assert lines[0].startswith("warning: model=vgg16 is a paper-scale preset, here with device cpu (paper: cuda); "
                               "4 workers (paper: 32); global batch 128 at lr 0.1 (paper: 1024 at lr 0.1): "
                               "about 66.7 h for 20000 steps (12.0 s a step")
    assert lines[1] == ("warning: lr 0.1 is the paper's for a global batch of 1024; at 128 the averaged gradient is "
                        "noisier and the loss can climb at first (train.lr=0.0125 scales it linearly); on a CPU run "
                        "experiment=mini_vgg (its CPU-scale study), or cluster.device=cuda on GPUs; going on")


def test_a_linearly_scaled_lr_gets_no_lr_note():
    """The note suggests the paper's lr scaled to this batch, never this run's own lr scaled again."""
    (_, line) = paper_warning(run_of(["model=resnet101", "train.lr=0.0125"]), 5.0, 100)
    assert line.startswith("warning: on a CPU run experiment=mini_resnet")
    (_, line) = paper_warning(run_of(["model=resnet101", "train.lr=0.05"]), 5.0, 100)
    assert "(train.lr=0.0125 scales it linearly)" in line


def test_a_paper_sized_global_batch_gets_no_lr_note():
    (_, line) = paper_warning(run_of(["model=resnet101", "cluster.workers=32"]), 5.0, 100)
    assert line == ("warning: on a CPU run experiment=mini_resnet (its CPU-scale study), or cluster.device=cuda "
                    "on GPUs; going on")


def test_durations_read_naturally():
    assert [duration(s) for s in (45, 600, 3.4 * 3600, 66.7 * 3600, 5 * 86400)] == [
        "45 s", "10 min", "3.4 h", "66.7 h", "5.0 days"]


PLUGIN = '''
from gravac.models import MODELS
resnet_mini = MODELS["resnet_mini"]
MODELS.register("tiny_paper", resnet_mini.config, task="classification", cpu_preset="experiment=mini_resnet",
                paper=dict(workers=8, batch_size=8, lr=0.1, device="cuda"))(resnet_mini.target)
'''


def test_a_run_prints_the_warning_before_its_first_step_and_goes_on(tmp_path):
    # a model declared as paper-scale from outside the library: the declaration alone triggers it
    (tmp_path / "tiny_paper_plugin.py").write_text(PLUGIN)
    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "model" / "tiny_paper.yaml").write_text("name: tiny_paper\n")
    env = {"GRAVAC_PLUGINS": "tiny_paper_plugin",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    r = run_cli([f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "model=tiny_paper", "model.width=4",
                 "dataset.image_size=8", "dataset.train_size=256", "dataset.test_size=64", "train.batch_size=8",
                 "cluster.workers=2", "train.steps=2", "cluster.threads=1", "logger.progress=false",
                 f"experiment.results_root={tmp_path / 'runs'}"], env=env)
    assert r.returncode == 0, failure(r)
    out = r.stdout.splitlines()
    first = next(i for i, line in enumerate(out) if line.startswith("warning: model=tiny_paper is a paper-scale"))
    assert "2 workers (paper: 8); global batch 16 at lr 0.1 (paper: 64 at lr 0.1): about" in out[first]
    assert "for 2 steps" in out[first]
    assert out[first + 1].startswith("warning: lr 0.1 is the paper's for a global batch of 64; at 16")
    assert any(line.startswith("done: 2 steps") for line in out[first + 2:])
