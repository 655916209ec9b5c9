"""The dataset registry: name -> loader `(cfg) -> Dataset`, config class and task.

A dataset plug-in registers its loader with `@DATASETS.register(name, ItsCfg, task=...)`, task
"classification" (an `ImageDataset`) or "lm" (an `LMDataset`); the keywords are the fields of
`DatasetSpec`.
"""
from __future__ import annotations

from dataclasses import dataclass

from gravac.core.registry import Registry
from gravac.data.files import DataError
from gravac.core.schema import DatasetCfg

@dataclass(frozen=True)
class DatasetSpec:
    """What a dataset registers beside its config and loader."""
    task: str                       # "classification" (an ImageDataset) or "lm" (an LMDataset)


DATASETS = Registry("dataset", DatasetCfg, spec=DatasetSpec, package="gravac.data")


def load_dataset(cfg: DatasetCfg):
    """Load (or generate) the dataset named by cfg.name."""
    DATASETS.load()
    if cfg.name not in DATASETS:
        raise DataError(f"unknown dataset {cfg.name!r}; choose one of: {', '.join(sorted(DATASETS.names()))}")
    entry = DATASETS[cfg.name]
    if entry.spec.task != "lm" and cfg.eval_split != "test":
        raise DataError(f"dataset.eval_split={cfg.eval_split!r} is not available for {cfg.name} "
                        "(only 'test'; 'valid' is for language-model data)")
    return entry.target(cfg)
