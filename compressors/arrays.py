"""Array plumbing for the selection algorithms: NumPy views on the CPU, torch tensors elsewhere.

Why NumPy on the CPU: the algorithms run a handful of small element-wise steps on candidate
sets of 10^4-10^6 elements. torch parallelises each of them with OpenMP, and on a machine whose
cores are shared every parallel region can stall for a scheduler time slice (milliseconds per
op); NumPy's single-threaded kernels (flatnonzero, argpartition, fancy indexing) are also several
times faster than torch's CPU equivalents here. CPU tensors are viewed without copying; results
go back through ``torch.from_numpy``. On other devices the same code runs on torch tensors.
The hottest loops (the candidate scan of :func:`above`, Top-k's steps on the candidates) run as
compiled kernels when numba is installed (compressors/_kernels.py), with the same results.
"""
from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

#: Elements per block of the cache-blocked scan (4 MiB of float32).
CHUNK = 1 << 20
NONFINITE = "gradient contains NaN/Inf values; cannot compress"
_NP_DTYPES = (torch.float32, torch.float64, torch.float16)
_KERNELS: list = []   # [compressors._kernels, or None without numba], filled on first use


def kernels():
    """The compiled kernels (compressors/_kernels.py), or None when numba cannot be imported (the
    NumPy code then runs, with the same results). Imported on first use: most processes that
    import compressors never scan a large array, and numba costs ~0.1 s to import."""
    if not _KERNELS:
        try:
            from . import _kernels as k
        except ImportError:
            k = None
        except Exception as e:  # numba present but unusable (e.g. no writable cache dir): say so
            warnings.warn(f"compressors: compiled kernels unavailable ({e!r}); using the NumPy code")
            k = None
        _KERNELS.append(k)
    return _KERNELS[0]


def kernels_for(a):
    """The compiled kernels if they take ``a`` (a 1-D NumPy array of a float dtype they know),
    else None: the one test every caller makes before using them."""
    k = kernels() if isinstance(a, np.ndarray) else None
    return k if k is not None and k.supports(a) else None


def native(x: Tensor):
    """What the algorithms run on: a zero-copy NumPy view of a CPU tensor (NumPy dtypes), else x."""
    if x.device.type == "cpu" and x.dtype in _NP_DTYPES:
        return x.detach().numpy()
    return x


def native_like(t: Tensor, a):
    """Tensor t (e.g. int64 indices) in the same kind of array as ``a``."""
    return t.numpy() if isinstance(a, np.ndarray) else t


def to_tensor(a, device) -> Tensor:
    """Back to torch (no copy for NumPy arrays that own contiguous memory)."""
    if isinstance(a, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(a)).to(device)
    return a


def _np_kth_smallest(a, j: int) -> float:
    """The j-th smallest (0-based) entry of a non-negative array. Zeros are counted, not
    partitioned: NumPy's partition slows down ~100x on a large tie (a gradient that is mostly exact
    zeros: 76 s instead of 0.8 s for 20M floats)."""
    zeros = a.shape[0] - int(np.count_nonzero(a))
    if j < zeros:
        return a.dtype.type(0)
    if zeros > a.shape[0] // 4:
        a, j = a[a != 0], j - zeros
    return np.partition(a, j)[j]


class _NumPyOps:
    """The few array operations the algorithms need, for NumPy arrays."""

    abs = staticmethod(np.abs)
    flatnonzero = staticmethod(np.flatnonzero)

    @staticmethod
    def count(mask) -> int:
        return int(np.count_nonzero(mask))

    @staticmethod
    def top(a, k: int):
        """Positions of the k largest of a non-negative array (0 < k < len); ties at the k-th value
        go to the lowest positions."""
        t = _np_kth_smallest(a, a.shape[0] - k)
        gt = np.flatnonzero(a > t)
        return np.concatenate([gt, np.flatnonzero(a == t)[:k - gt.shape[0]]])

    @staticmethod
    def bottom(a, d: int):
        """Positions of the d smallest of a non-negative array (0 < d < len); ties at the d-th value
        go to the highest positions, so what is left is what ``top`` would keep."""
        t = _np_kth_smallest(a, d - 1)
        lt = np.flatnonzero(a < t)
        eq = np.flatnonzero(a == t)
        return np.concatenate([lt, eq[eq.shape[0] - (d - lt.shape[0]):]])

    @staticmethod
    def cat(parts, like):
        return np.concatenate(parts) if parts else np.empty(0, dtype=like.dtype)

    @staticmethod
    def arange(n: int, like):
        return np.arange(n, dtype=np.int64)

    @staticmethod
    def ones_bool(n: int, like):
        return np.ones(n, dtype=np.bool_)


class _TorchOps:
    """The same operations for torch tensors (any device)."""

    @staticmethod
    def abs(a):
        return a.abs()

    @staticmethod
    def flatnonzero(mask):
        return mask.nonzero().view(-1)

    @staticmethod
    def count(mask) -> int:
        return int(torch.count_nonzero(mask))

    @staticmethod
    def top(a, k: int):
        t = torch.kthvalue(a, a.shape[0] - k + 1).values
        gt = (a > t).nonzero().view(-1)
        return torch.cat([gt, (a == t).nonzero().view(-1)[:k - gt.shape[0]]])

    @staticmethod
    def bottom(a, d: int):
        t = torch.kthvalue(a, d).values
        lt = (a < t).nonzero().view(-1)
        eq = (a == t).nonzero().view(-1)
        return torch.cat([lt, eq[eq.shape[0] - (d - lt.shape[0]):]])

    @staticmethod
    def cat(parts, like):
        return torch.cat(parts) if parts else like.new_empty(0)

    @staticmethod
    def arange(n: int, like):
        return torch.arange(n, device=like.device)

    @staticmethod
    def ones_bool(n: int, like):
        return torch.ones(n, dtype=torch.bool, device=like.device)


def ops(a):
    """The operation set for array ``a``."""
    return _NumPyOps if isinstance(a, np.ndarray) else _TorchOps


def top_positions(av, k: int):
    """Positions of the k largest entries of a non-negative 1-D array. Ties at the k-th value go to
    the lowest positions: one set on every host (NumPy's argpartition picks among ties by the
    CPU's SIMD level) and fast when most entries are tied at 0."""
    xp, c = ops(av), av.shape[0]
    if k >= c:
        return xp.arange(c, av)
    if k <= 0:
        return xp.arange(0, av)
    return xp.top(av, k)


def finite_max(a) -> float:
    """max of a as a float, NaN if a holds NaN (NumPy and torch both propagate it)."""
    return float(a.max())


def sample_abs(a, size: int, gen: torch.Generator):
    """|a| at ``size`` positions drawn uniformly with replacement (all of |a| if size >= len)."""
    n = a.shape[0]
    if size >= n:
        return ops(a).abs(a)
    pos = torch.randint(0, n, (size,), generator=gen)
    if isinstance(a, np.ndarray):
        return np.abs(a[pos.numpy()])
    return a.index_select(0, pos.to(a.device)).abs_()


def kth_largest(v, *ranks: int) -> list[float]:
    """The j-th largest entries (1-based ranks, clamped to [1, len]) of a 1-D array, as floats."""
    m = v.shape[0]
    kth = [m - min(max(j, 1), m) for j in ranks]  # ascending positions
    srt = np.partition(v, kth) if isinstance(v, np.ndarray) else torch.sort(v).values
    return [float(srt[i]) for i in kth]


class Scan(NamedTuple):
    """Result of :func:`above`: selected positions (ascending) and values, max|x|, sum|x| (or nan)
    and, when a ``hi`` threshold was given, the positions *within idx/vals* of |v| < hi."""

    idx: object
    vals: object
    absmax: float
    abssum: float
    band: object = None


def above(a, thr: float, *, strict: bool = False, check: bool = False, abs_sum: bool = False,
          hi: float | None = None, expect: int = 0) -> Scan:
    """One pass over a: positions and values where |a| >= thr (> thr if strict).

    With ``check`` raises ValueError on NaN/Inf (from the per-block max, no extra pass). For
    NumPy arrays the scan is cache-blocked: |a| and the mask of a block never leave the cache,
    and the selected positions and values go straight into output arrays sized for ``expect``
    selected elements (grown if needed), not into per-block pieces joined at the end. It is the
    compiled kernel's (one read of each element) unless numba is missing or ``abs_sum`` is asked
    for (its float64 sum is NumPy's, block by block, whose rounding the kernel would not repeat).
    """
    if not isinstance(a, np.ndarray):
        av = a.abs()
        amax = finite_max(av)
        if check and not math.isfinite(amax):
            raise ValueError(NONFINITE)
        idx = (av > thr if strict else av >= thr).nonzero().view(-1)
        band = None if hi is None else (av[idx] < hi).nonzero().view(-1)
        total = float(av.sum(dtype=torch.float64)) if abs_sum else math.nan
        return Scan(idx, a[idx], amax, total, band)
    k = kernels_for(a) if a.shape[0] and not abs_sum else None
    scan = None
    if k is not None and not math.isnan(thr) and (hi is None or not math.isnan(hi)):
        scan = _above_compiled(k, a, thr, strict, hi, expect)
    if scan is None:   # no numba, a sum wanted, a NaN seen (or a NaN threshold): the NumPy scan
        scan = _above_numpy(a, thr, strict, abs_sum, hi, expect)
    if check and not math.isfinite(scan.absmax):
        raise ValueError(NONFINITE)
    return scan


def _above_compiled(k, a, thr: float, strict: bool, hi: float | None, expect: int) -> Scan | None:
    """:func:`above` on a NumPy array with the compiled scan (compressors/_kernels.py), or None when
    a holds a NaN (the integer compares would select it; the NumPy scan then decides)."""
    n = a.shape[0]
    bits, absmask, infbits = k.int_view(a)
    it = bits.dtype.type
    tb = it(k.threshold_bits(a.dtype.type(thr), strict=strict, it=it))
    hb = it(0 if hi is None else k.below_bits(a.dtype.type(hi), it=it))
    out = _Growing(min(n, max(expect, CHUNK // 16)), a.dtype)
    band = torch_empty(out.idx.shape[0] if hi is not None else k.BLOCK, np.int64)
    i, nb, umax = 0, 0, 0
    while True:
        i, out.count, nb, m = k.scan(bits, i, absmask, tb, hb, out.idx, out.vals.view(bits.dtype), band, out.count, nb)
        umax = max(umax, int(m))
        if i == n:
            break
        out.reserve(out.count + k.BLOCK)
        if nb + k.BLOCK > band.shape[0]:
            band = np.concatenate([band[:nb], np.empty(max(k.BLOCK, band.shape[0]), dtype=np.int64)])
    if umax > infbits:
        return None
    amax = math.inf if umax == infbits else float(np.array(umax, dtype=bits.dtype).view(a.dtype)[()])
    return Scan(*out.arrays(), amax, math.nan, band[:nb] if hi is not None else None)


def _above_numpy(a, thr: float, strict: bool, abs_sum: bool, hi: float | None, expect: int) -> Scan:
    """:func:`above` on a NumPy array with NumPy's kernels, block by block (see there)."""
    n = a.shape[0]
    cmp = np.greater if strict else np.greater_equal
    t = a.dtype.type(thr)
    th = None if hi is None else a.dtype.type(hi)
    ab = np.empty(min(n, CHUNK), dtype=a.dtype)
    mb = np.empty(min(n, CHUNK), dtype=np.bool_)
    out = _Growing(min(n, max(expect, CHUNK // 16)), a.dtype)
    bands, maxes, sums = [], [], []
    for off in range(0, n, CHUNK):
        c = a[off:off + CHUNK]
        m = c.shape[0]
        ac, mk = ab[:m], mb[:m]
        np.abs(c, out=ac)
        maxes.append(ac.max())
        if abs_sum:
            sums.append(ac.sum(dtype=np.float64))
        cmp(ac, t, out=mk)
        nz = np.flatnonzero(mk)
        if nz.size:
            if th is not None:
                bands.append(np.flatnonzero(ac[nz] < th) + out.count)
            out.add(nz, off, c)
    amax = float(np.max(maxes))  # np.max propagates NaN, Python's max does not
    total = float(sum(sums)) if abs_sum else math.nan
    band = None if th is None else _NumPyOps.cat(bands, np.empty(0, np.int64))
    return Scan(*out.arrays(), amax, total, band)


def torch_empty(n: int, dtype) -> np.ndarray:
    """np.empty(n, dtype) in memory from torch's allocator. NumPy asks the kernel for huge pages for
    large arrays; on a loaded host first touching them stalled for tens of ms (page compaction) in
    one call out of three, torch's plain pages cost about the same on average without the stalls."""
    return torch.empty(n, dtype=torch.from_numpy(np.empty(0, dtype=dtype)).dtype).numpy()


class _Growing:
    """Positions (int64) and values of a scan, appended block by block into preallocated arrays
    (doubled when full): one write of the result instead of pieces and a concatenation."""

    def __init__(self, capacity: int, dtype) -> None:
        self.idx = torch_empty(max(capacity, 1), np.int64)
        self.vals = torch_empty(max(capacity, 1), dtype)
        self.count = 0

    def add(self, nz: np.ndarray, off: int, c: np.ndarray) -> None:
        """Append positions nz + off and values c[nz]."""
        lo, hi = self.count, self.count + nz.shape[0]
        self.reserve(hi)
        np.add(nz, off, out=self.idx[lo:hi])
        np.take(c, nz, out=self.vals[lo:hi])
        self.count = hi

    def reserve(self, need: int) -> None:
        """Room for ``need`` entries in all (at least doubling the capacity when it grows)."""
        if need > self.idx.shape[0]:
            lo, cap = self.count, max(need, 2 * self.idx.shape[0])
            self.idx = np.concatenate([self.idx[:lo], np.empty(cap - lo, dtype=np.int64)])
            self.vals = np.concatenate([self.vals[:lo], np.empty(cap - lo, dtype=self.vals.dtype)])

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The positions and values so far: views, or copies when most of the capacity is unused
        (a payload keeps its arrays' memory alive)."""
        idx, vals = self.idx[:self.count], self.vals[:self.count]
        if self.idx.shape[0] > self.count + self.count // 4 + 4096:
            return idx.copy(), vals.copy()
        return idx, vals
