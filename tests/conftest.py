"""Shared test helpers: composing the project's Hydra config and running bench/run.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


def compose(overrides: list[str] | None = None):
    """The composed DictConfig for `overrides`, exactly as bench/run.py would see it."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from gravac.config import register_base
    register_base()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides or [])


def make_run(**sections):
    """A checked RunConfig from plain per-section values, e.g. make_run(method=dict(name="gravac"))."""
    from gravac.config import build_config
    return build_config(sections)


def plugin_cfg(kind: str, name: str, **values):
    """The registered config class of plug-in `name` filled with `values`, unchecked (so tests of
    the builders' own errors still reach them); an unknown name gets the kind's base class."""
    from gravac.registry import registries
    from gravac.schema import SECTIONS
    reg = registries()[kind]
    cls = reg[name].config if name in reg else SECTIONS[kind]
    return cls(name=name, **values)


def model_cfg(name: str, **values):
    return plugin_cfg("model", name, **values)


def dataset_cfg(name: str, **values):
    return plugin_cfg("dataset", name, **values)


def run_cli(args: list[str], timeout: float = 600, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    """Run `python bench/run.py ARGS` in a subprocess and capture its output."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), *args], capture_output=True,
                          text=True, timeout=timeout, env=e, cwd=cwd or ROOT)


def data_dir(name: str) -> Path:
    """$GRAVAC_DATA_DIR/<name>, or skip the test saying why."""
    root = os.environ.get("GRAVAC_DATA_DIR")
    if not root:
        pytest.skip(f"GRAVAC_DATA_DIR is not set; point it at a folder holding {name}/ to run this test")
    path = Path(root) / name
    if not path.exists():
        pytest.skip(f"{path} does not exist; put {name} there (see README, Data) to run this test")
    return path
