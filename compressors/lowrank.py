"""The tensor algebra of PowerSGD (Vogels et al., NeurIPS 2019): pure tensor code, no communication.

A gradient tensor of shape (n, ...) is viewed as an n × m matrix M (m = the product of the other
dimensions, as torch's powerSGD_hook does). One power-iteration step with a shared m × r matrix Q
gives P = M Q; after the workers' Ps are averaged and orthogonalised, Q = Mᵀ P, and after the Qs
are averaged the approximation is P Qᵀ. The communication between these steps belongs to the
method (gravac/methods/powersgd.py); this module holds only the pieces each worker computes.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .base import generator


def matrix_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """(n, m) of the matrix a tensor of `shape` is viewed as: first dimension × the rest."""
    n = int(shape[0]) if shape else 1
    return n, math.prod(shape[1:]) if len(shape) > 1 else 1


def compresses(shape: tuple[int, ...], rank: int, min_rate: float) -> bool:
    """torch's rule (powerSGD_hook._should_compress): compress iff (n + m)·r·min_rate < n·m with
    r = min(n, m, rank); 1-D tensors (biases, norms) never, whatever min_rate (see the method)."""
    if len(shape) < 2:
        return False
    n, m = matrix_shape(shape)
    return (n + m) * min(n, m, rank) * min_rate < n * m


def effective_rank(shape: tuple[int, ...], rank: int) -> int:
    """The rank actually used for a tensor: at most min(n, m)."""
    n, m = matrix_shape(shape)
    return min(n, m, rank)


def orthogonalise(a: Tensor, eps: float = 0.0) -> Tensor:
    """A copy of `a` (rows × r) with orthonormal columns, by Gram–Schmidt as torch's hook does:
    each column is divided by (its norm + eps), then removed from the later columns. eps > 0 keeps
    an all-zero column zero instead of NaN."""
    out = a.clone()
    for i in range(out.shape[1]):
        col = out[:, i:i + 1]
        col /= torch.linalg.vector_norm(col) + eps
        if i + 1 < out.shape[1]:
            rest = out[:, i + 1:]
            rest -= (col * rest).sum(dim=0, keepdim=True) * col
    return out


def random_q(m: int, rank: int, seed: int, *salt: int, dtype=torch.float32, device=None) -> Tensor:
    """A standard-normal m × rank matrix from (seed, salts): the same on every worker."""
    q = torch.randn(m, rank, generator=generator(seed, *salt), dtype=dtype)
    return q.to(device) if device is not None else q
