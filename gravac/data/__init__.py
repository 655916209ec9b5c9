"""Datasets for gravac-bench: CIFAR-10, CIFAR-100, Penn Treebank and a synthetic image task,
registered by name in `DATASETS` (see registry.py).

`load_dataset(cfg)` returns a `Dataset`; `ds.train_loader(rank, world, batch_size, seed)` gives
each data-parallel worker a `WorkerLoader` over its disjoint shard and `ds.eval_batches(...)` the
eval split. Data is found through `cfg.root` (else $GRAVAC_DATA_DIR, else ./data); decoded arrays
are cached under `cfg.cache_dir` (else $GRAVAC_CACHE_DIR, else ~/.cache/gravac-bench). User
mistakes (missing files, wrong layout, no network for a download) raise `DataError`, a ValueError
with one line saying what is missing, where it was looked for and how to fix it.
"""
from __future__ import annotations

from gravac.data.augment import augment_batch, normalize
from gravac.data.base import Dataset, ImageDataset, LMDataset
from gravac.data.files import DataError, resolve_cache_dir, resolve_root
from gravac.data.loaders import ImageLoader, LMLoader, WorkerLoader, batchify
from gravac.data.registry import DATASETS, load_dataset

__all__ = ["DATASETS", "DataError", "Dataset", "ImageDataset", "LMDataset", "WorkerLoader", "ImageLoader",
           "LMLoader", "load_dataset", "augment_batch", "normalize", "batchify", "resolve_root", "resolve_cache_dir"]
