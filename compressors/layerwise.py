"""Layer-wise granularity: compress each layer's segment of the flat gradient separately.

The flat tensor is cut into consecutive segments of the given sizes (the model's parameter
numels), each compressed at the same CF by the inner compressor (each sends at least one
element; an empty segment, a parameter of no elements, sends nothing), and the pieces are joined into ONE payload with global indices, grouped by segment.
A quantizer (compressors/packed.py) gets the whole tensor and the sizes instead: its scale
groups stay inside each segment, and its payload is one packed payload (``quantize_widths``: each
segment at its own code width, for L-GreCo).
Segments run through the inner compressor's native-array selection, so a model with hundreds of
parameter tensors costs one NaN/Inf check and one concatenation, not hundreds of payloads.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from .arrays import native, native_like, ops, to_tensor
from .base import Compressor, Payload, check_finite, mix_seed, target_k, validate


class Layerwise(Compressor):
    """Apply ``inner`` per segment; the payload is shared when the inner compressor's are."""

    def __init__(self, inner: Compressor, sizes: Sequence[int]) -> None:
        super().__init__(check_finite=inner.check_finite)
        sizes = [int(s) for s in sizes]
        if not sizes or min(sizes) < 0 or sum(sizes) < 1:
            raise ValueError("Layerwise needs segment sizes >= 0, at least one of them positive")
        if isinstance(inner, Layerwise):
            raise ValueError("Layerwise cannot wrap another Layerwise")
        self.inner = inner
        self.sizes = sizes
        self.offsets = [0]
        for s in sizes:
            self.offsets.append(self.offsets[-1] + s)
        self.name = f"layerwise_{inner.name}"

    @property
    def numel(self) -> int:
        return self.offsets[-1]

    @property
    def shared(self) -> bool:
        return self.inner.shared

    @property
    def per_rank_seed(self) -> bool:
        return self.inner.per_rank_seed

    def _cfs(self, cf) -> list[float]:
        """One CF per segment: a number applies to all, a sequence gives each its own."""
        if isinstance(cf, (int, float)):
            cfs = [float(cf)] * len(self.sizes)
        else:
            cfs = [float(c) for c in cf]
            if len(cfs) != len(self.sizes):
                raise ValueError(f"got {len(cfs)} compression factors for {len(self.sizes)} segments")
        for c in cfs:
            if not c >= 1:
                raise ValueError(f"compression factor must be >= 1, got {c}")
        return cfs

    @torch.no_grad()
    def compress_checked(self, x: Tensor, cf, *, seed: int = 0, check: bool = True) -> Payload:
        """As Compressor.compress; ``cf`` may also be a sequence with one CF per segment (Accordion)."""
        if getattr(self.inner, "segmented", False):  # a quantizer: its groups stay inside each layer
            return self.inner.quantize(x, self.sizes, seed=seed, check=check)
        cfs = self._cfs(cf)
        validate(x, 1.0)
        if x.numel() != self.numel:
            raise ValueError(f"Layerwise sizes sum to {self.numel}, tensor has {x.numel()} elements")
        if check:
            check_finite(x)  # once for the whole tensor, not per segment
        a = native(x)
        segments = [(off, a[off:off + size], None) for off, size in zip(self.offsets, self.sizes)]
        return self._run(segments, cfs, seed, x, self.numel, shared=self.shared)

    @torch.no_grad()
    def quantize_widths(self, x: Tensor, bits, *, seed: int = 0):
        """A quantizer's payload with segment i at code width ``bits[i]`` (Quantizer.quantize_widths)."""
        if not getattr(self.inner, "widths", ()):
            raise ValueError(f"{self.inner.name} has no code widths to choose (compressor=quant or qsgd have)")
        return self.inner.quantize_widths(x, self.sizes, bits, seed=seed, check=self.check_finite)

    def segment_bytes(self, bits) -> np.ndarray:
        """Wire bytes of each segment alone at its code width (Quantizer.segment_bytes)."""
        return self.inner.segment_bytes(self.sizes, bits)

    def _select(self, a, k, cf, seed, check):  # pragma: no cover - compress_checked is overridden
        raise NotImplementedError

    @torch.no_grad()
    def recompress(self, p: Payload, cs, *, seed: int = 0) -> Payload:
        """Per-segment multi-level compression of a layer-wise payload (global indices);
        ``cs`` may be a sequence with one factor per segment."""
        if getattr(self.inner, "segmented", False):
            return self.inner.recompress(p, cs, seed=seed)
        if p.indices is None:
            return self.compress(p.values, cs, seed=seed)
        css = self._cfs(cs)
        validate(p.values, 1.0)
        if self.check_finite:
            check_finite(p.values)
        a = native(p.values)
        gi = native_like(p.indices, a)
        if isinstance(a, np.ndarray):
            counts = self._grouped_counts(gi)
            if counts is None:  # not grouped by segment (not made by Layerwise): sort it
                seg = np.searchsorted(np.asarray(self.offsets[1:-1], dtype=np.int64), gi, side="right")
                order = np.argsort(seg, kind="stable")
                a, gi = a[order], gi[order]
                counts = np.bincount(seg, minlength=len(self.sizes)).tolist()
        else:
            bounds = torch.tensor(self.offsets[1:-1], dtype=gi.dtype, device=gi.device)
            seg = torch.bucketize(gi, bounds, right=True)
            if seg.numel() > 1 and not bool((seg[1:] >= seg[:-1]).all()):
                order = torch.sort(seg, stable=True).indices
                seg, a, gi = seg[order], a[order], gi[order]
            counts = torch.bincount(seg, minlength=len(self.sizes)).tolist()
        segments, start = [], 0
        for c in counts:
            segments.append((0, a[start:start + c], gi[start:start + c]))
            start += c
        return self._run(segments, css, seed, p.values, p.numel, shared=self.shared and p.shared)

    def _grouped_counts(self, gi: np.ndarray) -> list[int] | None:
        """Entries per segment if gi lists segment 0's indices, then segment 1's, ... else None.

        Binary search works on such block-ordered indices (the predicate "index >= offset" is
        monotone); per-block min/max (one O(k) pass) then confirm every block is in its range.
        """
        off = np.asarray(self.offsets, dtype=np.int64)
        b = np.searchsorted(gi, off, side="left")
        counts = np.diff(b)
        if b[0] != 0 or b[-1] != gi.shape[0] or (counts < 0).any():
            return None
        full = counts > 0
        starts = b[:-1][full]
        if (np.minimum.reduceat(gi, starts) < off[:-1][full]).any() or \
                (np.maximum.reduceat(gi, starts) >= off[1:][full]).any():
            return None
        return counts.tolist()

    def _run(self, segments, cfs: list[float], seed: int, like: Tensor, numel: int, *, shared: bool) -> Payload:
        """Select in every (offset, values, global indices or None) segment and join the pieces."""
        pos_parts, val_parts, dense = [], [], True
        for i, ((off, sa, gi), cf) in enumerate(zip(segments, cfs)):
            m = sa.shape[0]
            if m == 0:
                continue
            k = target_k(m, cf)
            if k >= m:
                pos, vals = ops(sa).arange(m, sa), sa.copy() if isinstance(sa, np.ndarray) else sa.clone()
            else:
                dense = False
                pos, vals = self.inner._select(sa, k, cf, mix_seed(seed, i), False)
            pos_parts.append(gi[pos] if gi is not None else pos + off)
            val_parts.append(vals)
        xp = ops(val_parts[0])
        vals = to_tensor(xp.cat(val_parts, val_parts[0]), like.device)
        if dense and segments[0][2] is None:
            return Payload(vals, None, numel)
        idx = to_tensor(xp.cat(pos_parts, pos_parts[0]), like.device)
        return Payload(vals, idx, numel, shared=shared)

    def __repr__(self) -> str:
        return f"Layerwise({self.inner!r}, {len(self.sizes)} segments, numel={self.numel})"
