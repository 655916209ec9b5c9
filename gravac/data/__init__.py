"""Datasets for gravac-bench: CIFAR-10, CIFAR-100, Penn Treebank and a synthetic image task.

`load_dataset(cfg)` returns a `Dataset`; `ds.train_loader(rank, world, batch_size, seed)` gives
each data-parallel worker a `WorkerLoader` over its disjoint shard and `ds.eval_batches(...)` the
eval split. Data is found through `cfg.root` (else $GRAVAC_DATA_DIR, else ./data); decoded arrays
are cached under `cfg.cache_dir` (else $GRAVAC_CACHE_DIR, else ~/.cache/gravac-bench). User
mistakes (missing files, wrong layout, no network for a download) raise `DataError`, a ValueError
with one line saying what is missing, where it was looked for and how to fix it.
"""
from __future__ import annotations

from gravac.data.augment import augment_batch, normalize
from gravac.data.base import (DataError, Dataset, ImageDataset, ImageLoader, LMDataset, LMLoader, WorkerLoader,
                              batchify, resolve_cache_dir, resolve_root)

DATASET_NAMES: tuple[str, ...] = ("synthetic", "cifar10", "cifar100", "ptb")

__all__ = ["DATASET_NAMES", "DataError", "Dataset", "ImageDataset", "LMDataset", "WorkerLoader", "ImageLoader",
           "LMLoader", "load_dataset", "augment_batch", "normalize", "batchify", "resolve_root", "resolve_cache_dir"]


def load_dataset(cfg) -> Dataset:
    """Load (or generate) the dataset named by cfg.name; see the module docstring."""
    name = cfg.name
    if name == "synthetic":
        from gravac.data.synthetic import load_synthetic
        ds = load_synthetic(cfg)
    elif name == "cifar10":
        from gravac.data.cifar import load_cifar10
        ds = load_cifar10(cfg)
    elif name == "cifar100":
        from gravac.data.cifar import load_cifar100
        ds = load_cifar100(cfg)
    elif name == "ptb":
        from gravac.data.ptb import load_ptb
        return load_ptb(cfg)
    else:
        raise DataError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASET_NAMES)}")
    split = cfg.eval_split
    if split != "test":
        raise DataError(f"dataset.eval_split={split!r} is not available for {name} (only 'test'; 'valid' is for ptb)")
    return ds
