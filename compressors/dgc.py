"""DGC (Deep Gradient Compression, Lin et al. 2018) threshold sparsification and its warm-up.

Selection as in the DGC reference code / GRACE: sample ``sample_ratio`` of |x|, take the minimum of
the sample's top ceil(sample_size / cf) as the threshold, select |x| >= thr; while the count is
above ``up``·k multiply thr by ``up`` (1.3), while below ``down``·k multiply by ``down`` (0.7), at
most ``max_adjust`` (10) times; if more than k remain, keep the exact top-k of the selected.

Guaranteed band: down·k <= nnz <= k (so at least ceil(0.7k), and never empty). When the
adjustments end below down·k (rare; the reference would send that few) we send the exact top-k.

Speed: every count the reference makes is a pass over the whole tensor. Here one cache-blocked
pass collects the pool |x| >= thr0 and counts for thresholds at or above the pool's floor are
taken from the pool (the count at the floor is the pool's size), so the result is identical with
~1 pass instead of up to 11. When the first count is in the band (the usual case: the sample
predicts it well) the pool is the selection, with no second pass over it; a step below the
pool's floor re-scans the tensor down to ``down`` times that threshold. Outputs (positions, order,
values, tie choices) are those of the pass-per-count algorithm, whose fallback pool floor
(down·thr0, lowered on a step below it) is tracked for the exact-top-k case.
Momentum correction (the other half of DGC) lives in :class:`ErrorFeedback` (``momentum=``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass


from .arrays import above, kth_largest, ops, sample_abs, top_positions
from .base import COMPRESSORS, Compressor, CompressorCfg, generator
from gravac.core.registry import option
from .topk import keep_top, topk_select


def dgc_warmup_cf(cf: float, epoch: float, warmup_epochs: float, *, factor: float | None = 4.0) -> float:
    """CF to use during DGC's exponential sparsity warm-up.

    In warm-up epoch e (floor of a fractional epoch, 0-based) the CF is ``factor**(e+1)``
    capped at ``cf``: sparsity 75%, 93.75%, 98.4375%, 99.6%, ... as in the DGC paper; from epoch
    ``warmup_epochs`` on it is ``cf``. ``factor=None`` instead uses the DGC code's geometric
    schedule cf**((e+1)/(warmup_epochs+1)), which ends exactly at cf.
    """
    if cf < 1:
        raise ValueError(f"compression factor must be >= 1, got {cf}")
    if warmup_epochs <= 0 or epoch >= warmup_epochs:
        return float(cf)
    e = max(0, math.floor(epoch))
    if factor is None:
        return float(cf) ** ((e + 1) / (warmup_epochs + 1))
    return min(float(cf), float(factor) ** (e + 1))


@dataclass
class DGCCfg(CompressorCfg):
    """sample_ratio: share of |g| sampled for the threshold; momentum_correction: the momentum
    moves from the optimizer into the error-feedback memory (DGC's u, v); warmup_epochs: DGC's
    exponential sparsity warm-up (CF 4, 16, 64, ... capped at cf) over that many epochs."""
    sample_ratio: float = option(0.01, check=lambda v: 0 < v <= 1, valid="in (0, 1]")
    momentum_correction: bool = False
    warmup_epochs: float = option(0.0, check=lambda v: v >= 0, valid=">= 0")


@COMPRESSORS.register("dgc", DGCCfg, label="DGC", order=2, doc="Deep Gradient Compression: sampled threshold, adjusted to about k")
class DGC(Compressor):
    """DGC threshold selection: nnz in [down·k, k] (see module docstring)."""

    name = "dgc"

    @classmethod
    def memory_momentum(cls, cfg: DGCCfg, momentum: float) -> float:
        return momentum if cfg.momentum_correction else 0.0

    @classmethod
    def scheduled_cf(cls, cfg: DGCCfg, cf: float, epoch: float) -> float:
        return dgc_warmup_cf(cf, epoch, cfg.warmup_epochs) if cfg.warmup_epochs > 0 else cf

    def __init__(self, *, sample_ratio: float = 0.01, min_samples: int = 256, up: float = 1.3,
                 down: float = 0.7, max_adjust: int = 10, check_finite: bool = True) -> None:
        super().__init__(check_finite=check_finite)
        if not (0 < sample_ratio <= 1) or min_samples < 1 or up <= 1 or not (0 < down < 1) or max_adjust < 0:
            raise ValueError("DGC needs 0 < sample_ratio <= 1, min_samples >= 1, up > 1, 0 < down < 1, max_adjust >= 0")
        self.sample_ratio = float(sample_ratio)
        self.min_samples = int(min_samples)
        self.up = float(up)
        self.down = float(down)
        self.max_adjust = int(max_adjust)

    def _threshold(self, a, cf: float, seed: int) -> float:
        """Minimum of the top ceil(s / cf) of a random sample of s = sample_ratio·n values of |a|."""
        s = max(self.min_samples, int(a.shape[0] * self.sample_ratio))
        sv = sample_abs(a, s, generator(seed, 0xD6C))
        return kth_largest(sv, max(1, math.ceil(sv.shape[0] / cf)))[0]

    def _select(self, a, k: int, cf: float, seed: int, check: bool):
        xp = ops(a)
        thr = self._threshold(a, cf, seed)
        # The pool {|x| >= floor} starts at thr itself: when the first count is in the band (the
        # usual case) the pool is the selection, with no second pass over it. ``ref_floor`` follows
        # the floor the pass-per-count description's pool would have (down·thr, lowered to down·t
        # below it): the exact-top-k fallback picks from that pool, so ties come out the same.
        floor, ref_floor = thr, thr * self.down
        idx, vals = above(a, floor, check=check)[:2]
        av = None  # |vals|, made when a count needs it

        def count(t: float) -> int:
            nonlocal floor, ref_floor, idx, vals, av
            if t < ref_floor:
                ref_floor = t * self.down
            if t < floor:  # below the pool: rescan with room for one more step down
                floor = t * self.down
                idx, vals = above(a, floor)[:2]
                av = None
            if t == floor:  # the whole pool, no comparison needed
                return idx.shape[0]
            if av is None:
                av = xp.abs(vals)
            return xp.count(av >= t)

        cnt = count(thr)
        for _ in range(self.max_adjust):
            if cnt > self.up * k:
                thr *= self.up
            elif cnt < self.down * k:
                thr *= self.down
            else:
                break
            cnt = count(thr)

        if cnt < self.down * k:  # adjustments ran out below the band: exact top-k instead
            if ref_floor != floor:  # the reference pool {|x| >= ref_floor}, in index order
                if ref_floor > floor:
                    keep = xp.flatnonzero((xp.abs(vals) if av is None else av) >= ref_floor)
                    idx, vals = idx[keep], vals[keep]
                else:
                    idx, vals = above(a, ref_floor)[:2]
            if idx.shape[0] < k:
                idx, vals = topk_select(a, k, seed=seed)
            else:  # the pool {|x| >= floor} holds at least k: it contains the top-k
                idx, vals = keep_top(idx, vals, k)
        elif thr == floor:  # the pool is the selection
            if cnt > k:  # as the reference: exact top-k among the selected
                pos = top_positions(xp.abs(vals) if av is None else av, k)
                idx, vals = idx[pos], vals[pos]
        else:
            if av is None:
                av = xp.abs(vals)
            pos = xp.flatnonzero(av >= thr)
            if pos.shape[0] > k:  # as the reference: exact top-k among the selected
                pos = pos[top_positions(av[pos], k)]
            idx, vals = idx[pos], vals[pos]
        return idx, vals
