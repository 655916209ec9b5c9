"""Adding a compressor and a method from outside the library: one module plus one YAML each.

This module is itself the plug-in (bench/run.py imports it through $GRAVAC_PLUGINS): a toy
compressor that keeps every s-th element and a toy method that alternates dense and compressed
steps, registered through the public API. The tests select them from the command line on both
backends, check their records by hand, and find their label in plots/paper.py's output. The
README's "Adding a compressor / a method" section describes exactly these steps.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from compressors import COMPRESSORS, Compressor
from gravac.core import option
from gravac.core.schema import CompressorCfg, MethodCfg
from gravac.methods import METHODS, CompressingMethod

ROOT = Path(__file__).resolve().parents[1]


# --- the plug-in -------------------------------------------------------------------------------
@dataclass
class StrideCfg(CompressorCfg):
    offset: int = option(0, check=lambda v: v >= 0, valid=">= 0")   # position of the first kept element


@COMPRESSORS.register("stride", StrideCfg, label="Stride")
class Stride(Compressor):
    """Keeps k = n/cf elements at offset, offset + s, ... (s = n // k): the same on every worker."""
    name = "stride"

    def __init__(self, *, offset: int = 0, check_finite: bool = True):
        super().__init__(check_finite=check_finite)
        self.offset = offset

    @property
    def shared(self) -> bool:
        return True

    def _select(self, a, k, cf, seed, check):
        pos = (self.offset + np.arange(k) * (a.shape[0] // k)) % a.shape[0]
        return pos, a[pos]


@dataclass
class AlternateCfg(MethodCfg):
    dense_every: int = option(2, check=lambda v: v >= 1, valid=">= 1")   # a dense step every this many


@METHODS.register("alternate", AlternateCfg)
class Alternate(CompressingMethod):
    """Dense every `dense_every` steps, compressor.cf (with error feedback) otherwise."""
    name = "alternate"

    def step(self, grads, ctx):
        cf = 1.0 if ctx.step % self.cfg.dense_every == 0 else self.comp_cfg.cf
        c = self.compress_all(grads, cf, ctx.step)
        return self.finish(c, extra={"toy_phase": "dense" if cf == 1 else "sparse"})

    @classmethod
    def label(cls, cfg, comp):
        return f"Alternate ({COMPRESSORS[comp.name].label} {comp.cf:g}x, dense every {cfg.dense_every})"

    @classmethod
    def ignores(cls, cfg, comp):
        return []


# --- the tests ---------------------------------------------------------------------------------
YAMLS = {"compressor/stride.yaml": "# Keep every s-th element (a toy).\nname: stride\n",
         "method/alternate.yaml": "# Dense and compressed steps in turn (a toy).\nname: alternate\n"}
SMALL = ["dataset.image_size=8", "dataset.train_size=256", "dataset.test_size=64", "model.width=4",
         "train.batch_size=8", "train.steps=4", "train.eval_every=2", "logger.progress=false", "cluster.threads=1"]


@pytest.fixture(scope="module")
def conf(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("plugin_conf")
    for rel, text in YAMLS.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    return d


def cli(conf: Path, args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, GRAVAC_PLUGINS="test_plugins",
               PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), f"hydra.searchpath=[file://{conf}]",
                           *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def runs(conf, tmp_path_factory) -> dict[str, Path]:
    """The toy method + compressor, 4 steps, on the simulated cluster and on 2 gloo processes."""
    out = {}
    for backend in ("sim", "ddp"):
        root = tmp_path_factory.mktemp(backend)
        r = cli(conf, [*SMALL, "method=alternate", "compressor=stride", "compressor.cf=4", "compressor.offset=1",
                       f"cluster={backend}", "cluster.workers=2", f"experiment.results_root={root}"])
        assert r.returncode == 0, r.stderr
        (out[backend],) = [p for p in root.glob("*/*") if p.is_dir()]
    return out


def steps(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]


def test_toy_plugins_run_on_both_backends_with_hand_checked_records(runs):
    sim, ddp = steps(runs["sim"]), steps(runs["ddp"])
    from conftest import model_cfg
    from gravac.models import build_model
    sizes = [p.numel() for p in build_model(model_cfg("resnet_mini", width=4), 10, "classification").parameters()]
    assert json.loads((runs["sim"] / "summary.json").read_text())["parameters"] == sum(sizes)
    assert [s["toy_phase"] for s in sim] == ["dense", "sparse", "dense", "sparse"]
    assert sim[0]["floats_sent"] == sum(sizes) and sim[0]["cf"] == 1
    k = sum(max(1, n // 4) for n in sizes)                     # per layer (granularity=layer)
    assert sim[1]["floats_sent"] == k and sim[1]["cf"] == pytest.approx(sum(sizes) / k)
    assert sim[1]["wire_bytes"] == 4 * k                       # shared indices: values only, all-reduced
    for a, b in zip(sim, ddp):                                 # the same numbers on both backends
        assert (a["floats_sent"], a["cf"], a["wire_bytes"], a["toy_phase"]) == \
               (b["floats_sent"], b["cf"], b["wire_bytes"], b["toy_phase"])
    for run in runs.values():
        config = (run / "config.yaml").read_text()
        assert "offset: 1" in config and "dense_every: 2" in config
        assert json.loads((run / "summary.json").read_text())["status"] == "completed"


def test_toy_plugins_are_labelled_in_the_plots(runs, tmp_path):
    out = tmp_path / "plots"
    r = subprocess.run([sys.executable, str(ROOT / "plots" / "paper.py"), str(runs["sim"]), "--out", str(out),
                        "--formats", "png"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    label = "Alternate (Stride 4x, dense every 2)"
    assert label in (out / "static_compression.md").read_text()


def test_config_errors_know_the_plugins(conf):
    r = cli(conf, ["compressor=nope", "method=alternate"])
    assert r.returncode == 2 and "stride" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = cli(conf, ["method=alternate", "compressor=stride", "compressor.offset=-1"])
    assert r.returncode == 2 and "compressor.offset=-1 is out of range: must be >= 0" in r.stderr, r.stderr
    r = cli(conf, ["method=static", "compressor=topk", "compressor.offset=1"])
    assert r.returncode == 2 and "compressor.offset is not an option of compressor=topk" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_plugin_that_cannot_load_is_one_line(tmp_path):
    """GRAVAC_PLUGINS naming a missing module, or a plug-in re-registering a built-in name: one
    line saying which module and how to fix it, even for --help (which lists the plug-ins)."""
    from conftest import run_cli_many
    (tmp_path / "dup_topk.py").write_text("from compressors import COMPRESSORS, Compressor\n\n"
                                          "@COMPRESSORS.register('topk')\nclass Mine(Compressor):\n    pass\n")
    path = os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])
    missing, dup = run_cli_many([dict(args=["--help"], env={"GRAVAC_PLUGINS": "no_such_mod"}),
                                 dict(args=["train.steps=1"], env={"GRAVAC_PLUGINS": "dup_topk", "PYTHONPATH": path})])
    for r in (missing, dup):
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "plug-in module 'no_such_mod' (from GRAVAC_PLUGINS) is not found" in missing.stderr
    assert "PYTHONPATH" in missing.stderr
    assert "'dup_topk'" in dup.stderr and "compressor 'topk' is already registered" in dup.stderr
    assert "another name" in dup.stderr
