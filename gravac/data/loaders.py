"""Per-worker loaders: each data-parallel worker iterates its own disjoint shard, forever,
deterministically from (seed, rank, epoch), so a resumed run continues exactly.
"""
from __future__ import annotations

import numpy as np
from torch import Tensor

from gravac.core.errors import UserError


def _mix_seed(*parts: int) -> int:
    """A well-mixed 63-bit seed from integers (seed, rank, epoch, ...)."""
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(2, np.uint64)[0]
               >> np.uint64(1))


def _check_rank(rank: int, world: int, batch_size: int) -> None:
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"need 0 <= rank < world, got rank={rank}, world={world}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")


def _split_stream(ids: Tensor, rank: int, world: int) -> Tensor:
    chunk = len(ids) // world
    return ids[rank * chunk:(rank + 1) * chunk]


def batchify(ids: Tensor, batch_size: int) -> Tensor:
    """(T,) token stream -> (T // batch_size, batch_size): column j is the j-th contiguous piece."""
    n = len(ids) // batch_size
    return ids[:n * batch_size].view(batch_size, n).t().contiguous()




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

    def __init__(self, ds, rank: int, world: int, batch_size: int, seed: int):
        super().__init__(rank, world, batch_size, seed)
        self.ds = ds
        per = ds.train_size // world
        perm = np.random.default_rng(_mix_seed(self.seed, 0x5EED)).permutation(ds.train_size)
        self.shard = perm[rank * per:(rank + 1) * per]
        self.steps_per_epoch = per // batch_size
        if self.steps_per_epoch == 0:
            raise UserError(f"{ds.name}: a shard of {per} samples ({ds.train_size} over {world} workers) "
                            f"holds no full batch of {batch_size}: lower train.batch_size or cluster.workers")
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

    def __init__(self, ds, rank: int, world: int, batch_size: int, seed: int):
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
