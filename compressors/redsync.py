"""RedSync threshold sparsification (Fang et al. 2019), as in the public reference code.

Binary search of r in [0, 1] for thr = mean|x| + r·(max|x| − mean|x|), selecting |x| > thr, until
k <= nnz <= band·k (band 2). The reference's search has two flaws we do not copy: it moves the
wrong bound when k/2 <= nnz < k, and its r-tolerance 0.2 stops it after three halvings whatever
the count. Here the search is a plain bisection on the count, stopped when the count is in the
band, after ``max_iters`` (20) halvings, or when r_hi − r_lo <= ``r_tol`` (default 0: off; 0.2
reproduces the reference's budget). If it ends outside the band, or no threshold ever exceeds
k elements (ties, e.g. a constant tensor), we send the exact top-k.

Guaranteed: k <= nnz <= band·k (nnz == k after the fallback); never empty.

Speed: one cache-blocked pass gives sum|x| and a pool {|x| > T0}, T0 taken from a sample so the
pool holds more than band·k elements; any threshold below T0 is then known to select too many,
and counts above it come from the pool (shrunk as the lower bound rises). The decisions, hence
the result, are those of the full-tensor search.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .arrays import above, kth_largest, ops, sample_abs
from .base import COMPRESSORS, Compressor, CompressorCfg, generator
from gravac.core.registry import option
from .topk import keep_top, topk_select


@dataclass
class RedSyncCfg(CompressorCfg):
    """max_iters: bisection steps of the threshold search."""
    max_iters: int = option(20, check=lambda v: v >= 1, valid=">= 1")


@COMPRESSORS.register("redsync", RedSyncCfg, label="RedSync", order=3, doc="RedSync: threshold by bisection until k <= nnz <= 2k")
class RedSync(Compressor):
    """RedSync bisection threshold: nnz in [k, band·k] (see module docstring)."""

    name = "redsync"

    def __init__(self, *, max_iters: int = 20, band: float = 2.0, r_tol: float = 0.0,
                 sample_size: int = 1 << 16, check_finite: bool = True) -> None:
        super().__init__(check_finite=check_finite)
        if max_iters < 0 or band < 1 or not (0 <= r_tol < 1) or sample_size < 1:
            raise ValueError("RedSync needs max_iters >= 0, band >= 1, 0 <= r_tol < 1, sample_size >= 1")
        self.max_iters = int(max_iters)
        self.band = float(band)
        self.r_tol = float(r_tol)
        self.sample_size = int(sample_size)

    def _select(self, a, k: int, cf: float, seed: int, check: bool):
        xp, n = ops(a), a.shape[0]
        upper = self.band * k
        # Pool floor: a sample value with (whp) more than band*k elements of |x| above it.
        sv = sample_abs(a, self.sample_size, generator(seed, 0x4ED))
        s = sv.shape[0]
        mu = s * min(1.0, upper / n)
        j = math.ceil(mu + 4.0 * math.sqrt(mu)) + 1
        floor = kth_largest(sv, j)[0] if j < s else 0.0
        idx, vals, mx, asum, _ = above(a, floor, strict=True, check=check, abs_sum=True)
        mean = min(asum / n, mx)
        if idx.shape[0] <= upper and floor > mean:
            floor = mean  # every threshold tried is >= mean: all counts exact from this pool
            idx, vals = above(a, floor, strict=True)[:2]
        av = xp.abs(vals)

        lo, hi = 0.0, 1.0
        for _ in range(self.max_iters):
            if hi - lo <= self.r_tol:
                break
            mid = (lo + hi) / 2
            thr = mean + mid * (mx - mean)
            if thr < floor:  # pool holds > band*k elements above floor: too many here
                lo = mid
                continue
            sel = av > thr
            cnt = xp.count(sel)
            if k <= cnt <= upper:
                pos = xp.flatnonzero(sel)
                return idx[pos], vals[pos]
            if cnt < k:
                hi = mid
            else:
                lo = mid
                if cnt < av.shape[0] // 2:  # shrink the pool to what later thresholds can select
                    pos = xp.flatnonzero(sel)
                    idx, vals, av, floor = idx[pos], vals[pos], av[pos], thr

        if idx.shape[0] >= k:  # pool = {|x| > floor} with >= k elements contains the top-k
            return keep_top(idx, vals, k)
        return topk_select(a, k, seed=seed)
