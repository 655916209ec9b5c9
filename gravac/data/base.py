"""Dataset and per-worker loader classes shared by every dataset, plus path and cache helpers.

A `Dataset` holds the decoded arrays of one dataset; `train_loader(rank, world, ...)` hands each
data-parallel worker a `WorkerLoader` over its own disjoint shard, which it iterates forever,
epoch after epoch, deterministically from (seed, rank, epoch) so a resumed run continues exactly.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

try:
    import fcntl
except ImportError:  # Windows: no lock, the atomic rename alone keeps the cache consistent
    fcntl = None  # type: ignore[assignment]

from gravac.data.augment import random_crop_flip_nhwc, to_normalized_tensor
from gravac.errors import UserError


class DataError(UserError, ValueError):
    """A user-fixable data problem (missing files, wrong layout, bad option): one clear line."""


# ---------------------------------------------------------------------------------------------
# paths and cache


def resolve_root(root: Optional[str]) -> Path:
    """The data root: `root` if given, else $GRAVAC_DATA_DIR, else ./data (absolute, ~ expanded)."""
    root = root or os.environ.get("GRAVAC_DATA_DIR") or "./data"
    return Path(os.path.expanduser(str(root))).resolve()


def resolve_cache_dir(cache_dir: Optional[str]) -> Path:
    """The decoded-array cache: `cache_dir`, else $GRAVAC_CACHE_DIR, else ~/.cache/gravac-bench."""
    d = cache_dir or os.environ.get("GRAVAC_CACHE_DIR") or os.path.join("~", ".cache", "gravac-bench")
    return Path(os.path.expanduser(str(d))).resolve()


def fingerprint(source: Path, files: Sequence[Path | tuple[str, int, int]], extra: str = "") -> str:
    """A short key for a source folder: its absolute path plus every file's name, size and mtime
    (Paths, or precomputed (relative name, size, mtime_ns) tuples), so that a changed, added or
    removed file gives a new key (and a fresh decode)."""
    h = hashlib.sha256()
    h.update(str(source.resolve()).encode())
    h.update(extra.encode())
    parts = []
    for f in files:
        if isinstance(f, tuple):
            parts.append("%s\0%d\0%d" % f)
        else:
            st = f.stat()
            parts.append("%s\0%d\0%d" % (f.relative_to(source), st.st_size, st.st_mtime_ns))
    h.update("\0".join(parts).encode())
    h.update(f"\0n={len(files)}".encode())
    return h.hexdigest()[:20]


def cached_arrays(cache_dir: Path, name: str, key: str,
                  build: Callable[[], dict[str, np.ndarray]], mmap: bool = True) -> dict[str, np.ndarray]:
    """Return the arrays stored under cache_dir/<name>-<key>/, building and storing them first if
    absent. The folder is written under a temporary name and renamed into place, so a killed or
    concurrent run never leaves (or reads) a half-written cache; a lock file makes concurrent
    starts (e.g. ddp ranks) wait for one builder instead of all decoding. An unwritable cache warns
    and builds in memory."""
    final = cache_dir / f"{name}-{key}"
    found = _read_cache(final, mmap)
    if found is not None:
        return found
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        lock = open(cache_dir / f".{name}-{key}.lock", "a+")
    except OSError as e:
        warnings.warn(f"could not write the data cache under {cache_dir} ({e}); set dataset.cache_dir= "
                      f"or GRAVAC_CACHE_DIR to a writable folder to avoid decoding on every start")
        return build()
    with lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        found = _read_cache(final, mmap)      # another process may have built it meanwhile
        if found is not None:
            return found
        arrays = build()
        try:
            _write_cache(cache_dir, final, arrays)
        except OSError as e:
            warnings.warn(f"could not write the data cache under {cache_dir} ({e}); set dataset.cache_dir= "
                          f"or GRAVAC_CACHE_DIR to a writable folder to avoid decoding on every start")
        return arrays


def _read_cache(final: Path, mmap: bool) -> Optional[dict[str, np.ndarray]]:
    meta = final / "arrays.json"
    if not meta.is_file():
        return None
    try:
        names = json.loads(meta.read_text())["arrays"]
        return {n: np.load(final / f"{n}.npy", mmap_mode="r" if mmap else None) for n in names}
    except (OSError, ValueError, KeyError) as e:  # unreadable: build again and replace it
        warnings.warn(f"ignoring unreadable cache {final} ({e}); decoding again")
        return None


def _write_cache(cache_dir: Path, final: Path, arrays: dict[str, np.ndarray]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=cache_dir))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache may be shared
        for n, a in arrays.items():
            np.save(tmp / f"{n}.npy", a)
        (tmp / "arrays.json").write_text(json.dumps({"arrays": list(arrays)}))
        if final.exists():  # a broken earlier cache (a complete one would have been read)
            shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _mix_seed(*parts: int) -> int:
    """A well-mixed 63-bit seed from integers (seed, rank, epoch, ...)."""
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(2, np.uint64)[0]
               >> np.uint64(1))


# ---------------------------------------------------------------------------------------------
# datasets


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


def _check_rank(rank: int, world: int, batch_size: int) -> None:
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"need 0 <= rank < world, got rank={rank}, world={world}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")


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
        self.in_channels = int(train_x.shape[3])
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


def _split_stream(ids: Tensor, rank: int, world: int) -> Tensor:
    chunk = len(ids) // world
    return ids[rank * chunk:(rank + 1) * chunk]


def batchify(ids: Tensor, batch_size: int) -> Tensor:
    """(T,) token stream -> (T // batch_size, batch_size): column j is the j-th contiguous piece."""
    n = len(ids) // batch_size
    return ids[:n * batch_size].view(batch_size, n).t().contiguous()


# ---------------------------------------------------------------------------------------------
# loaders


class WorkerLoader:
    """One worker's endless iterator over its disjoint training shard.

    `next_batch()` returns the next batch. `epoch` counts completed epochs (it goes up as the last
    batch of an epoch is returned) and `epoch_progress` is the fractional count. `new_epoch` is True
    when the batch just returned by `next_batch()` is the first of an epoch (the very first batch
    included), so an LM loop fetches, then does `if loader.new_epoch: hidden = model.init_hidden(b)`.
    `state_dict()`/`load_state_dict()` save and restore the position; the data order is a pure
    function of (seed, rank, world, batch_size, epoch, index), so a restored loader yields exactly
    the batches the original would have.
    """

    steps_per_epoch: int

    def __init__(self, rank: int, world: int, batch_size: int, seed: int):
        _check_rank(rank, world, batch_size)
        self.rank, self.world, self.batch_size, self.seed = rank, world, batch_size, int(seed)
        self.epoch = 0
        self.index = 0  # batches already returned in the current epoch
        self._last_index = -1  # within-epoch index of the batch last returned (-1: none yet)

    @property
    def new_epoch(self) -> bool:
        return self._last_index == 0

    @property
    def epoch_progress(self) -> float:
        return self.epoch + self.index / self.steps_per_epoch

    def next_batch(self) -> tuple[Tensor, Tensor]:
        batch = self._batch(self.epoch, self.index)
        self._last_index = self.index
        self.index += 1
        if self.index == self.steps_per_epoch:
            self.epoch, self.index = self.epoch + 1, 0
        return batch

    def __iter__(self):
        while True:
            yield self.next_batch()

    def _batch(self, epoch: int, index: int) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed, "rank": self.rank,
                "world": self.world, "batch_size": self.batch_size}

    def load_state_dict(self, d: dict) -> None:
        for k in ("seed", "rank", "world", "batch_size"):
            if k in d and d[k] != getattr(self, k):
                raise ValueError(f"loader state was saved with {k}={d[k]} but this loader has {k}={getattr(self, k)}; "
                                 f"a resumed run must use the same seed, workers and batch size")
        if not 0 <= int(d["index"]) < self.steps_per_epoch:
            raise ValueError(f"loader state index {d['index']} out of range for {self.steps_per_epoch} steps per epoch")
        self.epoch, self.index = int(d["epoch"]), int(d["index"])
        self._last_index = -1


class ImageLoader(WorkerLoader):
    """Classification shard: a permutation fixed by `seed` split into `world` equal contiguous parts
    (the remainder < world is dropped); each epoch reshuffles this worker's part with a generator
    seeded by (seed, rank, epoch) and serves `len(part) // batch_size` full batches (a partial final
    batch is dropped, so every step has the same batch size). Augmentation draws from a generator
    seeded by (seed, rank, epoch, index)."""

    def __init__(self, ds: ImageDataset, rank: int, world: int, batch_size: int, seed: int):
        super().__init__(rank, world, batch_size, seed)
        self.ds = ds
        per = ds.train_size // world
        perm = np.random.default_rng(_mix_seed(self.seed, 0x5EED)).permutation(ds.train_size)
        self.shard = perm[rank * per:(rank + 1) * per]
        self.steps_per_epoch = per // batch_size
        if self.steps_per_epoch == 0:
            raise ValueError(f"{ds.name}: a shard of {per} samples ({ds.train_size} over {world} workers) "
                             f"holds no full batch of {batch_size}")
        self._order_epoch, self._order = -1, None

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if epoch != self._order_epoch:
            rng = np.random.default_rng(_mix_seed(self.seed, self.rank, epoch))
            self._order, self._order_epoch = self.shard[rng.permutation(len(self.shard))], epoch
        return self._order

    def _batch(self, epoch: int, index: int) -> tuple[Tensor, Tensor]:
        idx = self._epoch_order(epoch)[index * self.batch_size:(index + 1) * self.batch_size]
        rng = np.random.default_rng(_mix_seed(self.seed, self.rank, epoch, index, 0xA06))
        return self.ds.make_batch(idx, train=True, rng=rng)


class LMLoader(WorkerLoader):
    """LM shard: the training stream split into `world` contiguous chunks; this worker's chunk is
    batchified into `batch_size` columns and served in consecutive bptt windows, x = rows
    [i, i+bptt) and y = rows [i+1, i+1+bptt), both (bptt, batch_size) int64. The short final
    window is dropped so every step has the same shape. The order is the same every epoch (the
    standard recipe: hidden state flows along each column), so `seed` is only recorded."""

    def __init__(self, ds: LMDataset, rank: int, world: int, batch_size: int, seed: int):
        super().__init__(rank, world, batch_size, seed)
        self.ds = ds
        self.bptt = ds.bptt
        self.data = batchify(_split_stream(ds.train_ids, rank, world), batch_size)
        self.steps_per_epoch = (len(self.data) - 1) // self.bptt
        if self.steps_per_epoch == 0:
            raise ValueError(f"{ds.name}: a chunk of {ds.train_size // world} tokens in {batch_size} columns "
                             f"is shorter than one bptt={self.bptt} window")

    def _batch(self, epoch: int, index: int) -> tuple[Tensor, Tensor]:
        i = index * self.bptt
        return self.data[i:i + self.bptt], self.data[i + 1:i + 1 + self.bptt]
