"""Exact Top-k by magnitude, fast on large tensors.

torch.topk over tens of millions of elements is far from memory speed on a CPU. Instead: estimate
from a random sample a threshold ``lo`` safely below the k-th largest |x| and ``hi`` safely above
it, collect the candidates |x| >= lo in one cache-blocked pass (noting which lie in the band
[lo, hi)), and finish on the small candidate set: everything >= hi is in, and only the band needs
a partial sort. The result is the exact top-k set, ties at the k-th magnitude going to the lowest
positions (so one set on every host); a sample that misses
(fewer than k candidates, or more than k above hi) only costs a retry or a wider selection.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .arrays import CHUNK, NONFINITE, above, finite_max, kernels_for, kth_largest, ops, sample_abs, top_positions
from .base import COMPRESSORS, Compressor, generator


def keep_top(idx, vals, k: int, band=None):
    """The k entries of (idx, vals) with the largest |vals|, in no particular order.

    ``band``: positions of the only entries that may be dropped (all others are known to be in
    the top k), or None for all. Dropped entries are removed by moving kept ones from the tail
    into their slots: O(dropped) work; the inputs are modified and the results are views.
    """
    xp, c = ops(idx), idx.shape[0]
    if c <= k:
        return idx, vals
    if band is None or c - band.shape[0] > k:  # no band, or the band guess failed
        band = xp.arange(c, idx)
    nb = band.shape[0]
    need = k - (c - nb)  # band entries to keep
    if need <= nb - need:  # few to keep: everything outside the band, then the band's best
        keep = band_pick(vals, band, need, top=True)
        if nb == c:
            return idx[keep], vals[keep]
        return without_then(idx, vals, band, keep)
    return remove_positions(idx, vals, band_pick(vals, band, nb - need, top=False))


def band_pick(vals, band, count: int, *, top: bool):
    """The band entries (positions into vals) of the ``count`` largest |vals[band]| (top: ties at
    the count-th to the lowest positions, see top_positions) or of the smallest (ties to the
    highest): with the compiled kernel when there is one, else NumPy's partition."""
    k = kernels_for(vals)
    if k is not None:
        bits, absmask, infbits = k.int_view(vals)
        ok, got = k.band_pick(bits, band, absmask, infbits, count, top)
        if ok:
            return got
    bav = ops(vals).abs(vals[band])
    return band[top_positions(bav, count) if top else ops(vals).bottom(bav, count)]


def without_then(idx, vals, band, keep):
    """idx and vals without the entries at positions ``band``, followed by those at ``keep`` (a
    subset of band), in the inputs' memory: with the compiled kernel when band is ascending (as a
    scan returns it), else via :func:`outside_then`."""
    k = kernels_for(vals)
    if k is not None:
        e = k.drop_then(idx, k.int_view(vals)[0], band, keep)
        if e >= 0:
            return idx[:e], vals[:e]
    out = ops(idx).ones_bool(idx.shape[0], idx)
    out[band] = False
    return outside_then(idx, out, keep), outside_then(vals, out, keep)


def outside_then(v, mask, keep):
    """v[mask] followed by v[keep] (keep: positions where mask is False). NumPy: in place in v's
    memory, block by block (writes never pass the reads), returning a view: no new array of the
    candidates' size (fresh memory costs page faults on every call)."""
    if not isinstance(v, np.ndarray):
        return torch.cat([v[mask], v[keep]])
    tail = v[keep]                                  # read before the compaction overwrites it
    w = 0
    for lo in range(0, v.shape[0], CHUNK):
        part = v[lo:lo + CHUNK][mask[lo:lo + CHUNK]]   # a copy: safe to write over its source
        v[w:w + part.shape[0]] = part
        w += part.shape[0]
    v[w:w + tail.shape[0]] = tail
    return v[:w + tail.shape[0]]


def remove_positions(idx, vals, drop):
    """idx and vals without the entries at the distinct positions ``drop``; order not kept."""
    k = kernels_for(vals)
    if k is not None:
        last = k.remove_at(idx, k.int_view(vals)[0], drop)
        if last >= 0:
            return idx[:last], vals[:last]
    xp = ops(idx)
    last = idx.shape[0] - drop.shape[0]
    in_head = drop < last
    holes = drop[in_head]
    tail = xp.ones_bool(drop.shape[0], idx)
    tail[drop[~in_head] - last] = False
    movers = xp.flatnonzero(tail) + last  # kept entries beyond the new end fill the holes
    idx[holes] = idx[movers]
    vals[holes] = vals[movers]
    return idx[:last], vals[:last]


def topk_select(a, k: int, *, seed: int = 0, sample_size: int = 1 << 16, z: float = 4.0,
                exact_below: int = 1 << 16, check: bool = False):
    """Positions and values of the k largest |a| of a native array (exact; ties at the k-th |a| to
    the lowest positions; no fixed order).

    With ``check``, NaN/Inf raise ValueError (detected during the candidate scan).
    """
    xp, n = ops(a), a.shape[0]
    if k >= n or n <= exact_below:
        av = xp.abs(a)
        if check and not math.isfinite(finite_max(av)):
            raise ValueError(NONFINITE)
        pos = top_positions(av, k)
        return pos, a[pos]
    sv = sample_abs(a, min(sample_size, max(1024, n // 16)), generator(seed, 0x70C))
    s = sv.shape[0]  # all of |a| when sample_size >= n: the ranks below stay valid
    p = k / n
    mu, sd = s * p, math.sqrt(s * p * (1.0 - p))
    j_hi = math.floor(mu - z * sd)
    j_lo = math.ceil(mu + z * sd) + 1
    for _ in range(3):
        if j_lo >= s:
            break
        lo, hi = kth_largest(sv, j_lo, j_hi)
        expect = int(n * (j_lo + 4 * math.sqrt(j_lo) + 16) / s)   # the candidates, with margin
        scan = above(a, lo, check=check, hi=hi if j_hi >= 1 else None, expect=expect)
        check = False  # the first scan saw every element
        if scan.idx.shape[0] >= k:
            return keep_top(scan.idx, scan.vals, k, scan.band)
        j_lo = 2 * j_lo + 16  # unlucky sample: lower the threshold and rescan
    # The threshold would be the sample's minimum: every element is a candidate.
    av = xp.abs(a)
    if check and not math.isfinite(finite_max(av)):
        raise ValueError(NONFINITE)
    pos = top_positions(av, k)
    return pos, a[pos]


@COMPRESSORS.register("topk", label="Top-k", order=1, doc="exact Top-k: the n/cf largest magnitudes")
class TopK(Compressor):
    """Exact Top-k: the k = max(1, floor(n/cf)) largest magnitudes, values sent exactly.

    Options: ``sample_size`` (threshold sample, drawn with replacement), ``z`` (margin of the
    sampled thresholds in binomial standard deviations), ``exact_below`` (plain selection for
    tensors up to this size). Multi-level ``recompress`` is Top-k of the Top-k values, which
    equals direct Top-k at the product CF for integer factors (same index set, ties aside).
    Indices are not sorted.
    """

    name = "topk"

    def __init__(self, *, sample_size: int = 1 << 16, z: float = 4.0, exact_below: int = 1 << 16,
                 check_finite: bool = True) -> None:
        super().__init__(check_finite=check_finite)
        if sample_size < 1 or z < 0 or exact_below < 0:
            raise ValueError("TopK needs sample_size >= 1, z >= 0, exact_below >= 0")
        self.sample_size = int(sample_size)
        self.z = float(z)
        self.exact_below = int(exact_below)

    def _select(self, a, k: int, cf: float, seed: int, check: bool):
        return topk_select(a, k, seed=seed, sample_size=self.sample_size, z=self.z,
                           exact_below=self.exact_below, check=check)
