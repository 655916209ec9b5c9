"""Random-k: k uniformly random positions (without replacement), values sent exactly.

With ``shared_indices=True`` (default) the positions come only from the seed, so every worker
passing the same seed gets the same positions: the payload is ``shared`` and the k values can be
all-reduced densely without sending indices. With ``shared_indices=False`` the caller passes a
different seed per worker (the reference code's independent draws) and indices are sent.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from dataclasses import dataclass

from .base import COMPRESSORS, Compressor, CompressorCfg, check_finite, generator


def _subset(n: int, k: int, gen: torch.Generator) -> np.ndarray:
    """O(k) expected work instead of randperm's O(n): draw with replacement until at least k
    distinct values appeared (their set is a uniform random subset of its size, by symmetry),
    then drop a uniform random surplus. k > n/2 draws the complement instead."""
    if k >= n:
        return np.arange(n, dtype=np.int64)
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    if 2 * k > n:
        keep = np.ones(n, dtype=np.bool_)
        keep[_subset(n, n - k, gen)] = False
        return np.flatnonzero(keep)
    if n <= 64:
        return np.sort(torch.randperm(n, generator=gen).numpy()[:k])
    want = k + 4.0 * math.sqrt(k) + 8
    m = math.ceil(-n * math.log1p(-min(want / n, 0.75)))  # draws expected to give `want` distinct
    u = _unique(torch.randint(0, n, (m,), generator=gen).numpy(), n)
    while u.shape[0] < k:  # rare: draw more
        more = torch.randint(0, n, (m // 4 + 16,), generator=gen).numpy()
        u = _unique(np.concatenate([u, more]), n)
    d = u.shape[0]
    if d > k:
        keep = np.ones(d, dtype=np.bool_)
        keep[_subset(d, d - k, gen)] = False
        u = u[keep]
    return u


def _unique(v: np.ndarray, n: int) -> np.ndarray:
    """Sorted distinct values of v in [0, n): a byte mask when v is dense in [0, n), else sort."""
    if v.shape[0] * 32 >= n:
        mask = np.zeros(n, dtype=np.bool_)
        mask[v] = True
        return np.flatnonzero(mask)
    v = np.sort(v)  # (np.unique's hash path in NumPy 2 is slower on large inputs)
    first = np.empty(v.shape[0], dtype=np.bool_)
    first[:1] = True
    np.not_equal(v[1:], v[:-1], out=first[1:])
    return v[first]


@dataclass
class RandomKCfg(CompressorCfg):
    """shared_indices: one seed for all workers, so indices agree and the k values are all-reduced;
    false draws per worker (as the reference code), which needs an all-gather of values + indices."""
    shared_indices: bool = True


@COMPRESSORS.register("randomk", RandomKCfg, label="Random-k", order=4, doc="k random coordinates (one seed for all workers by default)")
class RandomK(Compressor):
    """Random-k sparsification, shared (seeded, indices not sent) or independent per worker.

    Indices are sorted. NaN/Inf are detected with one aminmax (~1/5 of a memory pass), as
    nothing else here reads the whole tensor.
    """

    name = "randomk"

    def __init__(self, *, shared_indices: bool = True, check_finite: bool = True) -> None:
        super().__init__(check_finite=check_finite)
        self.shared_indices = bool(shared_indices)

    @property
    def shared(self) -> bool:
        return self.shared_indices

    @property
    def per_rank_seed(self) -> bool:
        return not self.shared_indices

    def _select(self, a, k: int, cf: float, seed: int, check: bool):
        if check:
            check_finite(a)
        idx = _subset(a.shape[0], k, generator(seed, 0x4A4D))
        if isinstance(a, np.ndarray):
            return idx, a[idx]
        pos = torch.from_numpy(idx).to(a.device)
        return pos, a.index_select(0, pos)
