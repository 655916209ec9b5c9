"""Config composition, the paper presets, and one-line errors for bad values."""
from __future__ import annotations

import dataclasses
import os
import re

import pytest

from conftest import CONF, compose, failure, run_cli, run_cli_many
from gravac.config.cli import help_text
from gravac.config.compose import ConfigError, build_config


def _options(group: str) -> list[str]:
    return sorted(f[:-5] for f in os.listdir(CONF / group) if f.endswith(".yaml"))


GROUPS = sorted(d for d in os.listdir(CONF) if (CONF / d).is_dir())


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in _options(g)])
def test_every_option_composes(group, option):
    extra = []
    if group == "dataset" and option == "ptb":
        extra = ["model=lstm_mini"]
    if group == "compressor" and option != "none":
        extra = ["method=static"]
    cfg = compose([f"{group}={option}", *extra])
    run = build_config(cfg)
    assert run is not None


def test_vgg16_preset():
    run = build_config(compose(["model=vgg16"]))
    assert (run.model.name, run.dataset.name, run.dataset.num_classes) == ("vgg16", "cifar100", 100)
    t = run.train
    assert (t.batch_size, t.lr, t.momentum, t.weight_decay, t.milestones) == (32, 0.1, 0.9, 5e-4, [])
    assert (t.target_metric, t.target) == ("top5", 0.9)


def test_resnet101_preset():
    run = build_config(compose(["model=resnet101"]))
    assert (run.model.name, run.dataset.name) == ("resnet101", "cifar10")
    t = run.train
    assert (t.batch_size, t.lr, t.momentum, t.weight_decay, t.milestones, t.gamma) == (32, 0.1, 0.9, 1e-4, [9000, 14000], 0.1)
    assert (t.target_metric, t.target) == ("top1", 0.8)


def test_lstm_preset():
    run = build_config(compose(["model=lstm"]))
    m = run.model
    assert (m.name, m.num_layers, m.hidden_size, m.embed_size, m.dropout) == ("lstm", 2, 1500, 1500, 0.65)
    assert (run.dataset.name, run.dataset.bptt) == ("ptb", 35)
    t = run.train
    assert (t.batch_size, t.lr, t.momentum, t.weight_decay, t.target_metric, t.target) == (20, 0.1, 0.9, 1e-4, "perplexity", 22.0)


def test_group_override_beats_preset():
    run = build_config(compose(["model=vgg16", "dataset=cifar10"]))
    assert run.dataset.name == "cifar10" and run.model.name == "vgg16" and run.train.weight_decay == 5e-4


def test_data_root_from_env(monkeypatch):
    monkeypatch.setenv("GRAVAC_DATA_DIR", "/some/where")
    assert build_config(compose([])).dataset.root == "/some/where"
    monkeypatch.delenv("GRAVAC_DATA_DIR")
    assert build_config(compose([])).dataset.root == "./data"


BAD = [
    (["train.batch_size=-1"], "train.batch_size=-1 is out of range"),
    (["train.batch_size=abc"], "train.batch_size='abc' is not an integer"),
    (["train.lr=fast"], "train.lr='fast' is not a number"),
    (["cluster.workers=0"], "cluster.workers=0 is out of range"),
    (["model=foo"], "unknown model 'foo'; choose one of: lstm"),
    (["train.lrr=1"], "unknown key train.lrr"),
    (["cluster.backend=mpi"], "cluster.backend='mpi' is not valid; choose one of: sim, ddp"),
    (["model=lstm_mini", "dataset=cifar10"], "does not fit dataset=cifar10"),
    (["train.target=80", "train.target_metric=top1"], "is a fraction"),
    (["method=static", "compressor.cf=0.5"], "compressor.cf=0.5 is out of range: must be >= 1"),
    (["method=gravac", "method.epsilon=0"], "method.epsilon=0.0 is out of range: must be in (0, 1]"),
    (["method=gravac", "method.epsilon=1.5"], "method.epsilon=1.5 is out of range"),
    (["method=gravac", "method.window=0"], "method.window=0 is out of range"),
    (["method=gravac", "method.cf_min=100", "method.cf_max=10"], "method.cf_max=10.0 must be >= method.cf_min=100.0"),
    (["method=gravac", "method.policy=linear"], "method.policy='linear' is not valid; choose one of: exponential, geometric"),
    (["method=gravac", "method.omega=1"], "method.omega=1.0 is out of range"),
    (["method=gravac", "compressor=none"], "method=gravac needs a compressor"),
    (["method=accordion", "method.cf_low=1000", "method.cf_high=10"], "method.cf_high=10.0 must be >= method.cf_low"),
    (["method=static", "compressor.granularity=bucket"], "compressor.granularity='bucket' is not valid"),
    (["train.momentum=1.0"], "train.momentum=1.0 is out of range"),
    (["train.milestones=[0]"], "train.milestones=[0] is out of range"),
    (["train.steps=0"], "train.steps=0 is out of range"),
    (["network.bandwidth_gbps=0"], "network.bandwidth_gbps=0.0 is out of range"),
    (["network.time_source=gpu"], "network.time_source='gpu' is not valid"),
    (["logger.mode=cloud"], "logger.mode='cloud' is not valid"),
    (["train.nesterov=maybe"], "train.nesterov='maybe' is not a boolean"),
    (["cluster.dist_backend=nccl"], "needs cluster.device=cuda"),
    (["dataset.eval_split=valid"], "exists only for ptb"),
    (["model=lstm_mini", "train.target_metric=top1"], "evaluated by perplexity"),
    # the name is the problem, not the results folder (issue 33): at most 255 bytes, counted in UTF-8
    ([f"experiment.name={'a' * 300}"], "experiment.name is 300 bytes long, too long for a folder name (at most 255"),
    ([f"experiment.run_id='{'é' * 200}'"], "experiment.run_id is 400 bytes long, too long for a folder name"),
    # results never land outside experiment.results_root (issue 21 case 3)
    (["experiment.name=../../escape"], "experiment.name='../../escape' is out of range: must be one folder name"),
    (["experiment.run_id=../../x"], "experiment.run_id='../../x' is out of range"),
    (["experiment.run_id=/tmp/abs"], "experiment.run_id='/tmp/abs' is out of range"),
    (["experiment.name=${oc.env:HOME}"], "is out of range: must be one folder name"),
    (["experiment.name=.."], "experiment.name='..' is out of range"),
]


# unknown group options and keys are caught on the command line, before Hydra composes
@pytest.mark.parametrize("args,fragment", [b for b in BAD if b[0][0] not in ("model=foo", "train.lrr=1")])
def test_bad_values_in_process(args, fragment):
    with pytest.raises(ConfigError) as e:
        build_config(compose(args))
    assert fragment in str(e.value) and "\n" not in str(e.value)


CLI_BAD = BAD[:6] + BAD[9:12] + BAD[-5:-3]


@pytest.fixture(scope="module")
def cli_bad():
    """Every CLI_BAD case's bench/run.py, two at a time."""
    return run_cli_many([dict(args=args, timeout=120) for args, _ in CLI_BAD])


@pytest.mark.parametrize("case", range(len(CLI_BAD)), ids=[f for _, f in CLI_BAD])
def test_bad_values_cli_one_line_no_traceback(cli_bad, case):
    fragment, r = CLI_BAD[case][1], cli_bad[case]
    assert r.returncode == 2, r.stderr
    assert fragment in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert len([l for l in r.stderr.splitlines() if l.strip()]) == 1, r.stderr


def test_steps_and_epochs_on_one_command_line_are_refused():
    """epochs > 0 used to win silently over an explicit train.steps (issue 21 case 10)."""
    args = ["train.steps=50", "train.epochs=2"]
    with pytest.raises(ConfigError, match="train.steps and train.epochs=2 are both set"):
        build_config(compose(args), args)
    assert build_config(compose(["train.epochs=2"]), ["train.epochs=2"]).train.epochs == 2


def test_help_lists_groups():
    r = run_cli(["--help"], timeout=120)
    assert r.returncode == 0
    for g in ("model:", "dataset:", "method:", "compressor:", "cluster:", "network:"):
        assert g in r.stdout
    assert "resnet101" in r.stdout and "synthetic" in r.stdout


def test_dense_ignores_a_compressor_so_grids_work():
    run = build_config(compose(["method=dense", "compressor=topk"]))
    assert run.method.name == "dense" and run.compressor.name == "none"


def builtins(kind: str) -> list:
    """The library's own registered plug-ins of a kind (test modules may register toys)."""
    from gravac.config.plugins import registries
    return [e for e in registries()[kind].entries() if e.target.__module__.startswith(("compressors", "gravac"))]


def test_every_registered_plugin_has_a_yaml_and_every_yaml_a_plugin():
    """The registries and conf/ agree: a built-in is one module plus one YAML, nothing more."""
    from gravac.core.schema import PLUGGABLE
    for kind in PLUGGABLE:
        names = {e.name for e in builtins(kind)} | ({"none"} if kind == "compressor" else set())
        assert set(_options(kind)) == names, kind


def test_help_comes_from_the_registries():
    """--help lists every plug-in with its description and options, from the registries."""
    r = run_cli(["--help"], timeout=120)
    assert r.returncode == 0
    from gravac.core.schema import PLUGGABLE
    for kind in PLUGGABLE:
        for e in builtins(kind):
            assert f"    {e.name:13} {e.doc}" in r.stdout, (kind, e.name)
    assert "sample_ratio=0.01" in r.stdout and "epsilon=0.7" in r.stdout and "options/" not in r.stdout


def _common_fields() -> list[tuple[str, str, str]]:
    from gravac.core.schema import SECTIONS
    return [(section, f.name, f.type) for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)
            if f.name != "name"]


@pytest.mark.parametrize("section,key,kind", _common_fields(), ids=lambda v: str(v))
def test_help_shows_every_setting_with_its_type_and_default(section, key, kind):
    """Issue 41: --help said each key's type was shown by --cfg job, which shows none. --help
    itself now gives every common setting as `key: type = default` (its choices for the type
    when it has them), in its section's line."""
    from gravac.core.schema import SECTIONS
    text = help_text(str(CONF))
    assert "type: --cfg job" not in text
    (line,) = [ln for ln in text.splitlines() if ln.startswith(f"  {section}: ") and " = " in ln]
    f = next(f for f in dataclasses.fields(SECTIONS[section]) if f.name == key)
    shown = " | ".join(map(str, f.metadata["choices"])) if f.metadata.get("choices") else kind
    assert re.search(rf"(^|, ){key}: {re.escape(shown)} = ", line.split(": ", 1)[1]), line


USER_MISTAKES = [  # (overrides, environment, fragment of the one-line error): issue 21 case 8
    (["train.batch_size=100000"], {}, "holds no full batch of 100000: lower train.batch_size"),
    (["experiment.results_root=/dev/null"], {}, "cannot create results folder /dev/null/default: Not a directory"),
    ([], {"GRAVAC_FAULT": "garbage"}, "GRAVAC_FAULT='garbage' must look like RANK:STEP"),
    ([], {"GRAVAC_FAULT": "0:1:explode"}, "GRAVAC_FAULT='0:1:explode' must look like"),
    # issue 21 case 7: refused before spawning processes or building shards
    (["cluster=ddp", "cluster.workers=100000"], {}, "would start 100000 processes here"),
    (["cluster.workers=100000"], {}, "a shard of 0 samples (256 over 100000 workers)"),
    (["cluster.workers=100000", "model.width=16"], {}, "the 100000-worker cluster needs about"),
    (["experiment.seeds=0"], {}, "experiment.seeds=0: give the number of seed replicas"),
    (["experiment.seeds=three"], {}, "experiment.seeds=three: give the number of seed replicas"),
    (["experiment.seeds=2", "train.seed=4"], {}, "experiment.seeds and train.seed are both given"),
    (["network.collectives=/nonexistent/gloo.json"], {}, "network.collectives=/nonexistent/gloo.json: no such profile"),
]
TINY = ["train.steps=2", "logger.progress=false", "cluster.threads=1", "dataset.train_size=256",
        "dataset.test_size=64", "model.width=4", "dataset.image_size=8"]


@pytest.fixture(scope="module")
def user_mistakes(tmp_path_factory):
    """Every USER_MISTAKES case's bench/run.py (each in its own results root), two at a time."""
    jobs = []
    for args, env, _ in USER_MISTAKES:
        root = [] if any(a.startswith("experiment.results_root=") for a in args) else \
            [f"experiment.results_root={tmp_path_factory.mktemp('mistake')}"]
        tiny = [t for t in TINY if not any(a.split("=")[0] == t.split("=")[0] for a in args)]
        jobs.append(dict(args=[*tiny, *root, *args], env=env, timeout=120))
    return run_cli_many(jobs)


@pytest.mark.parametrize("case", range(len(USER_MISTAKES)), ids=[f for _, _, f in USER_MISTAKES])
def test_user_mistakes_end_in_one_line(user_mistakes, case):
    fragment, r = USER_MISTAKES[case][2], user_mistakes[case]
    assert r.returncode == 2, failure(r)
    assert fragment in r.stderr and "Traceback" not in r.stderr + r.stdout
    assert len([line for line in r.stderr.splitlines() if line.strip()]) == 1, r.stderr


def test_a_taken_run_id_is_refused_and_the_first_run_kept(tmp_path):
    args = [*TINY, f"experiment.results_root={tmp_path}", "experiment.run_id=same"]
    assert run_cli(args, timeout=120).returncode == 0
    before = (tmp_path / "default" / "same" / "summary.json").read_text()
    r = run_cli(args, timeout=120)
    assert r.returncode == 2 and "run folder" in r.stderr and "exists already" in r.stderr
    assert "Traceback" not in r.stderr
    assert (tmp_path / "default" / "same" / "summary.json").read_text() == before


def test_a_sweep_with_a_bad_job_ends_with_the_failed_jobs_line(tmp_path):
    r = run_cli(["-m", *TINY, f"experiment.results_root={tmp_path}", "train.batch_size=100000,8"], timeout=300)
    assert r.returncode != 0
    assert "1 job(s) of the sweep failed" in r.stderr and "Traceback" not in r.stderr + r.stdout


def test_a_name_too_long_for_the_filesystem_says_so(tmp_path):
    """Past the config check (a filesystem with names shorter than 255 bytes, or a long
    results_root component), the folder's name is named as the problem, not its permissions."""
    from gravac.core.errors import UserError
    from gravac.loop.results import make_run_dir
    with pytest.raises(UserError) as e:
        make_run_dir(str(tmp_path / ("r" * 300)), "default", "", "tag")
    assert "too long for this filesystem; shorten experiment.name (or experiment.results_root)" in str(e.value)
    assert "writable" not in str(e.value)


def test_experiment_seeds_runs_that_many_seed_replicas(tmp_path):
    """experiment.seeds=2 is the sweep train.seed=0,1: one run folder per seed, nothing else."""
    r = run_cli([*TINY, f"experiment.results_root={tmp_path}", "experiment.seeds=2"], timeout=300)
    assert r.returncode == 0, failure(r)
    runs = sorted(p.parent for p in tmp_path.glob("default/*/summary.json"))
    assert [_seed_of(p) for p in runs] == [0, 1]


def _seed_of(run) -> int:
    import yaml
    return yaml.safe_load((run / "config.yaml").read_text())["train"]["seed"]


def test_expand_seeds_rewrites_only_its_own_argument():
    from gravac.config.compose import expand_seeds
    assert expand_seeds(["method=dense"]) == ["method=dense"]
    assert expand_seeds(["experiment.seeds=3", "arm=topk10,dense"]) == ["-m", "arm=topk10,dense", "train.seed=0,1,2"]
    assert expand_seeds(["-m", "experiment.seeds=1"]) == ["-m", "train.seed=0"]
