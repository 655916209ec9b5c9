"""Tracking: wandb is imported only when asked for, and offline mode needs no network."""
from __future__ import annotations

import subprocess
import sys

from conftest import ROOT, failure, run_cli


def test_wandb_not_imported_without_logger():
    code = ("import sys; from gravac.run.launch import launch; from gravac.loop.track import Tracker; "
            "from gravac.core.schema import LoggerCfg; Tracker(LoggerCfg(), 3, {}, None, enabled=True).close(); "
            "assert 'wandb' not in sys.modules, 'wandb imported'")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_wandb_offline_run_logs_locally(tmp_path):
    r = run_cli(["logger=wandb", "logger.mode=offline", "train.steps=3", "train.eval_every=3",
                 "dataset.image_size=8", "dataset.train_size=256", "dataset.test_size=64", "model.width=4",
                 f"experiment.results_root={tmp_path}"], env={"WANDB_SILENT": "true"})
    assert r.returncode == 0, failure(r)
    (run,) = [p for p in tmp_path.glob("*/*") if p.is_dir()]
    offline = list((run / "wandb").glob("offline-run-*"))
    assert offline, "no offline wandb run folder"
