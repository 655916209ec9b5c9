"""Payload, the Compressor interface, and the tensor helpers every compressor shares.

Everything here is pure tensor code (no torch.distributed, no ``.cuda()``): tensors stay on the
device they arrive on, randomness comes from a CPU ``torch.Generator`` seeded by the caller.
(The selection algorithms run on NumPy views of CPU tensors, see arrays.py.)
"""
from __future__ import annotations

import inspect
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import Tensor

from .arrays import NONFINITE, native, native_like, to_tensor
from gravac.core.registry import Registry
from gravac.core.schema import CompressorCfg

#: Bytes for the element count sent in front of a sparse payload.
COUNT_BYTES = 8


@dataclass
class Payload:
    """What one worker sends for one tensor: values at global ``indices`` (or dense values).

    ``indices is None`` means dense (``values`` is the whole tensor). ``shared`` means every
    worker has the same indices this step (seeded Random-k), so indices are never sent and the
    values can be all-reduced densely.
    """

    values: Tensor
    indices: Tensor | None
    numel: int
    shared: bool = False

    def __post_init__(self) -> None:
        if self.values.dim() != 1 or self.values.numel() < 1:
            raise ValueError(f"payload values must be a non-empty 1-D tensor, got shape {tuple(self.values.shape)}")
        if self.indices is None:
            if self.values.numel() != self.numel:
                raise ValueError(f"dense payload has {self.values.numel()} values for numel {self.numel}")
        elif self.indices.shape != self.values.shape:
            raise ValueError(f"payload indices {tuple(self.indices.shape)} and values {tuple(self.values.shape)} differ")

    @property
    def nnz(self) -> int:
        """Number of values sent (the paper's "floats sent")."""
        return self.values.numel()

    def index_bytes(self) -> int:
        """Bytes per index on the wire: int32 when every position fits, else int64."""
        return 4 if self.numel < 2**31 else 8

    def wire_bytes(self) -> int:
        """Bytes this worker transmits: values, plus indices and a count unless dense or shared."""
        vb = self.nnz * self.values.element_size()
        if self.indices is None or self.shared:
            return vb
        return vb + self.nnz * self.index_bytes() + COUNT_BYTES

    def dense(self) -> Tensor:
        """Decompress. For a dense payload this is ``values`` itself (not a copy)."""
        if self.indices is None:
            return self.values
        out = torch.zeros(self.numel, dtype=self.values.dtype, device=self.values.device)
        out[self.indices] = self.values
        return out


def target_k(n: int, cf: float) -> int:
    """Elements to keep at compression factor ``cf``: max(1, floor(n / cf))."""
    return max(1, min(n, math.floor(n / cf)))


def validate(x: Tensor, cf: float) -> None:
    """Reject what no compressor can handle: non-1-D, empty or non-float input, cf < 1 or NaN."""
    if not isinstance(x, Tensor) or x.dim() != 1:
        raise ValueError(f"compress expects a 1-D tensor, got {getattr(x, 'shape', type(x))}")
    if x.numel() == 0:
        raise ValueError("compress got an empty tensor")
    if not x.is_floating_point():
        raise ValueError(f"compress expects a floating-point tensor, got {x.dtype}")
    if not (cf >= 1):  # also catches NaN
        raise ValueError(f"compression factor must be >= 1, got {cf}")


def check_finite(x) -> float:
    """Raise ValueError on NaN/Inf; return max|x|. One min/max reduction (~1/5 of a pass):
    NumPy for small CPU arrays (no thread start-up), torch.aminmax (multi-threaded) otherwise."""
    x = native(x) if isinstance(x, Tensor) else x
    if isinstance(x, np.ndarray) and x.shape[0] <= 1 << 22:
        lo, hi = float(x.min()), float(x.max())
    else:
        mn, mx = torch.aminmax(torch.from_numpy(x) if isinstance(x, np.ndarray) else x)
        lo, hi = float(mn), float(mx)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(NONFINITE)
    return max(-lo, hi)


def mix_seed(seed: int, *salt: int) -> int:
    """Deterministic 63-bit seed from ``seed`` and salts (splitmix64), for independent streams."""
    z = int(seed) & 0xFFFFFFFFFFFFFFFF
    for s in (*salt, 0x9E3779B97F4A7C15):
        z = (z + (int(s) & 0xFFFFFFFFFFFFFFFF) + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        z ^= z >> 31
    return z & 0x7FFFFFFFFFFFFFFF


def generator(seed: int, *salt: int) -> torch.Generator:
    """A CPU generator seeded from (seed, salts): identical on every worker for the same seed."""
    return torch.Generator(device="cpu").manual_seed(mix_seed(seed, *salt))


@dataclass(frozen=True)
class CompressorSpec:
    """What a compressor registers beside its config: `order`, its place in tables and legends."""
    order: int = 9


#: Every compressor, by name: its class and its config dataclass (see registry.py).
COMPRESSORS = Registry("compressor", CompressorCfg, spec=CompressorSpec, package="compressors")
#: compressor.name of a run that compresses nothing (method=dense): not a registered compressor.
NO_COMPRESSOR = "none"


class Compressor(ABC):
    """Compress a flat gradient at a compression factor (CF = dense size / elements sent).

    ``compress(x, cf)`` keeps k = max(1, floor(n / cf)) elements (adaptive compressors: close to
    k, see each class). When k == n (cf == 1, or n == 1) the result is a dense payload holding a
    copy of x. ``seed`` makes any randomness reproducible and, for shared Random-k, common to all
    workers. Subclasses implement :meth:`_select` on native arrays (see arrays.py).
    """

    name: str = "compressor"

    def __init__(self, *, check_finite: bool = True) -> None:
        self.check_finite = check_finite

    @property
    def shared(self) -> bool:
        """True when the selected positions depend only on the seed (same on every worker)."""
        return False

    @property
    def per_rank_seed(self) -> bool:
        """True when each worker must draw its own randomness (independent Random-k); otherwise
        every worker gets the same seed each step (e.g. DGC's threshold sample agrees)."""
        return False

    # --- what a config means for this compressor (overridden where a compressor needs more) ---
    @classmethod
    def from_config(cls, cfg: CompressorCfg) -> "Compressor":
        """The compressor for `cfg`: its fields that are constructor keywords are passed on."""
        params = inspect.signature(cls.__init__).parameters
        return cls(**{f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name in params})

    @classmethod
    def memory_momentum(cls, cfg: CompressorCfg, momentum: float) -> float:
        """Momentum the error-feedback memory takes over from the optimizer (DGC's momentum
        correction); 0 leaves momentum to the optimizer."""
        return 0.0

    @classmethod
    def scheduled_cf(cls, cfg: CompressorCfg, cf: float, epoch: float) -> float:
        """The CF to use at `epoch` when the configured CF is `cf` (DGC's sparsity warm-up)."""
        return cf

    @classmethod
    def fixed_cf(cls, cfg: CompressorCfg) -> float | None:
        """The CF the compressor's own options fix (quantizers: 32 / bits per element), or None
        when compressor.cf sets it."""
        return None

    @classmethod
    def setting(cls, cfg: CompressorCfg) -> str | None:
        """How tables name a compressor whose options fix its CF ("8-bit, bucket 512"), else None."""
        return None

    def compress(self, x: Tensor, cf: float, *, seed: int = 0) -> Payload:
        return self.compress_checked(x, cf, seed=seed, check=self.check_finite)

    @torch.no_grad()
    def compress_checked(self, x: Tensor, cf: float, *, seed: int = 0, check: bool = True) -> Payload:
        """compress with the NaN/Inf check switched explicitly (Layerwise checks once overall)."""
        validate(x, cf)
        n = x.numel()
        k = target_k(n, cf)
        if k >= n:
            if check:
                check_finite(x)
            return Payload(x.clone(), None, n)
        pos, vals = self._select(native(x), k, cf, seed, check)
        return Payload(to_tensor(vals, x.device), to_tensor(pos, x.device), n, shared=self.shared)

    @abstractmethod
    def _select(self, a, k: int, cf: float, seed: int, check: bool):
        """(positions, values) of about k of the n > k elements of native array ``a``; with
        ``check``, raise ValueError on NaN/Inf (from a reduction computed anyway where possible)."""

    @torch.no_grad()
    def recompress(self, p: Payload, cs: float, *, seed: int = 0) -> Payload:
        """Multi-level compression: select from p's values only (never the dense tensor) at a
        further factor cs, k = max(1, floor(p.nnz / cs)), and map back to global indices."""
        validate(p.values, cs)
        k1 = p.nnz
        k = target_k(k1, cs)
        if k >= k1:
            return Payload(p.values.clone(), None if p.indices is None else p.indices.clone(), p.numel,
                           shared=p.shared)
        a = native(p.values)
        pos, vals = self._select(a, k, cs, seed, self.check_finite)
        idx = pos if p.indices is None else native_like(p.indices, a)[pos]
        shared = self.shared and (p.shared or p.indices is None)
        return Payload(to_tensor(vals, p.values.device), to_tensor(idx, p.values.device), p.numel, shared=shared)

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({opts})"
