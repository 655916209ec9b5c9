"""Datasets: the decoded arrays of one dataset, served to workers through loaders.

A `Dataset` holds a dataset in memory (or memory-mapped); `train_loader(rank, world, ...)` hands
each data-parallel worker a loader over its own disjoint shard (see loaders.py) and
`eval_batches` the evaluation split.
"""
from __future__ import annotations

from typing import Iterator, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from gravac.data.augment import random_crop_flip_nhwc, to_normalized_tensor
from gravac.data.files import DataError
from gravac.data.loaders import ImageLoader, LMLoader, WorkerLoader, _check_rank, _split_stream, batchify



class Dataset:
    """Base class: name, task ("classification" | "lm"), num_classes (vocab size for lm), train_size
    (samples, or tokens for lm); `train_loader` and `eval_batches` are implemented by subclasses."""

    name: str
    task: str
    num_classes: int
    train_size: int
    eval_size: int

    def train_loader(self, rank: int, world: int, batch_size: int, seed: int) -> "WorkerLoader":
        raise NotImplementedError

    def eval_batches(self, batch_size: int, rank: int = 0, world: int = 1) -> Iterator[tuple[Tensor, Tensor]]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(name={self.name!r}, task={self.task!r}, num_classes={self.num_classes}, "
                f"train_size={self.train_size}, eval_size={self.eval_size})")


class ImageDataset(Dataset):
    """Image classification from uint8 (N, H, W, 3) arrays (in memory or memory-mapped) and int
    labels. Batches are gathered, augmented (train) and normalised as whole arrays."""

    task = "classification"

    def __init__(self, name: str, train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray,
                 test_y: np.ndarray, num_classes: int, mean: Sequence[float], std: Sequence[float],
                 augment: bool = True, classes: Optional[Sequence[str]] = None):
        self.name = name
        self.num_classes = int(num_classes)
        self.train_x, self.train_y = train_x, np.asarray(train_y, dtype=np.int64)
        self.test_x, self.test_y = test_x, np.asarray(test_y, dtype=np.int64)
        self.train_size, self.eval_size = len(train_x), len(test_x)
        self.image_size = int(train_x.shape[1])
        self.mean, self.std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        self.augment = bool(augment)
        self.classes = list(classes) if classes is not None else [str(i) for i in range(self.num_classes)]

    def make_batch(self, idx: np.ndarray, train: bool, rng: Optional[np.random.Generator] = None) -> tuple[Tensor, Tensor]:
        """(x float32 (B, C, H, W) normalised, y int64 (B,)) for the samples at `idx`; train batches
        are augmented (if enabled) with `rng`. Runs in numpy: see gravac.data.augment."""
        x = (self.train_x if train else self.test_x)[idx]  # works on in-memory and memory-mapped arrays
        if train and self.augment:
            x = random_crop_flip_nhwc(x, rng if rng is not None else np.random.default_rng())
        y = torch.from_numpy((self.train_y if train else self.test_y)[idx])
        return to_normalized_tensor(x, self.mean, self.std), y

    def train_loader(self, rank: int, world: int, batch_size: int, seed: int) -> "ImageLoader":
        return ImageLoader(self, rank, world, batch_size, seed)

    def eval_batches(self, batch_size: int, rank: int = 0, world: int = 1) -> Iterator[tuple[Tensor, Tensor]]:
        """The whole test split in order, optionally the `rank`-th of `world` contiguous parts
        (np.array_split: parts differ by at most one sample and together cover it exactly once)."""
        _check_rank(rank, world, batch_size)
        idx = np.array_split(np.arange(self.eval_size), world)[rank]
        for i in range(0, len(idx), batch_size):
            yield self.make_batch(idx[i:i + batch_size], train=False)


class LMDataset(Dataset):
    """Word-level language modelling from int token-id arrays (train and the chosen eval split)."""

    task = "lm"

    def __init__(self, name: str, vocab: Sequence[str], train_ids: np.ndarray, eval_ids: np.ndarray,
                 bptt: int, eval_split: str = "test"):
        if bptt < 1:
            raise DataError(f"dataset.bptt must be >= 1, got {bptt}")
        self.name = name
        self.vocab = list(vocab)
        self.num_classes = len(self.vocab)
        self.train_ids = torch.from_numpy(np.asarray(train_ids, dtype=np.int64))
        self.eval_ids = torch.from_numpy(np.asarray(eval_ids, dtype=np.int64))
        self.train_size, self.eval_size = len(self.train_ids), len(self.eval_ids)
        self.bptt = int(bptt)
        self.eval_split = eval_split

    def train_loader(self, rank: int, world: int, batch_size: int, seed: int) -> "LMLoader":
        return LMLoader(self, rank, world, batch_size, seed)

    def eval_batches(self, batch_size: int, rank: int = 0, world: int = 1) -> Iterator[tuple[Tensor, Tensor]]:
        """(x, y) windows of up to bptt rows over the eval stream, in order: the stream is split
        into `world` contiguous parts and this rank's part batchified into `batch_size` columns
        (the standard recipe; the last window may be shorter). Start with a fresh hidden state
        and carry it across the windows. As in the standard recipe, the < batch_size tokens left
        over by batchify and the first token of each column are not scored as targets."""
        _check_rank(rank, world, batch_size)
        part = _split_stream(self.eval_ids, rank, world)
        data = batchify(part, batch_size)
        for i in range(0, len(data) - 1, self.bptt):
            n = min(self.bptt, len(data) - 1 - i)
            yield data[i:i + n], data[i + 1:i + 1 + n]
