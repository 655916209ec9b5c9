"""QSGD (Alistarh et al., NeurIPS 2017): s levels, stochastic rounding, one L2 norm per bucket.

Each element x of a bucket with norm ||v|| is sent as sign(x)·||v||·l/s, the level l drawn between
floor and ceil of s|x|/||v|| with the probabilities that make it unbiased (E = x). Here the code
is the signed level plus s, floor(s·x/||v|| + u) + s in [0, 2s] (the same distribution), packed at
the smallest width of 2, 4 or 8 bits that holds 2s+1 values: s = 1 -> 2 bits, s <= 7 -> 4, s <= 127
-> 8. The paper's Elias coding of the levels is not used: fixed-width codes give every worker the
same payload size (an all-gather without padding) and decode at memory speed. Per-layer code
widths (L-GreCo, ``Quantizer.quantize_widths``) take each width at its most levels: 8 bits s = 127,
4 bits s = 7, 2 bits s = 1 (``at_width``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import COMPRESSORS, CompressorCfg
from .packed import Quantizer, finite, cf_option, encode_with, group_scale, safe_inverse
from gravac.core.registry import option


def qsgd_bits(levels: int) -> int:
    """Code width holding the 2s+1 signed levels of QSGD with s = levels."""
    return 2 if levels <= 1 else 4 if levels <= 7 else 8


def qsgd_levels(bits: int) -> int:
    """The most levels s a code of ``bits`` holds (2s+1 <= 2^bits): 8 -> 127, 4 -> 7, 2 -> 1."""
    return (1 << (int(bits) - 1)) - 1


@dataclass
class QSGDCfg(CompressorCfg):
    """levels: s (quantization levels per sign); bucket: elements per norm (0: one per tensor).
    Error feedback is off by default: QSGD is unbiased (set error_feedback=true to add it)."""
    cf: float = cf_option()
    error_feedback: bool = False
    levels: int = option(127, check=lambda v: int(v) == v and 1 <= v <= 127, valid="an integer in 1..127")
    bucket: int = option(512, check=lambda v: int(v) == v and v >= 0, valid="an integer >= 0 (0: one norm per tensor)")


@COMPRESSORS.register("qsgd", QSGDCfg, label="QSGD", order=5,
                      doc="QSGD: s levels, stochastic rounding, an L2 norm per bucket (unbiased)")
class QSGD(Quantizer):
    """QSGD with s = ``levels`` and one float32 norm per ``bucket`` elements (see module docstring)."""

    name = "qsgd"
    stochastic = True
    widths = (8, 4, 2)   # at s = 127, 7, 1 (at_width)

    def __init__(self, *, levels: int = 127, bucket: int = 512, check_finite: bool = True) -> None:
        super().__init__(bucket=bucket, check_finite=check_finite)
        if not (1 <= int(levels) <= 127):
            raise ValueError(f"QSGD needs levels in 1..127, got {levels}")
        self.levels = int(levels)
        self.bits, self.offset = qsgd_bits(self.levels), float(self.levels)

    @classmethod
    def code_bits(cls, cfg) -> int:
        return qsgd_bits(cfg.levels)

    @classmethod
    def default_width(cls, cfg) -> int | None:
        """A width to choose among is a width at its most levels (127, 7, 1): None for other levels."""
        return qsgd_bits(cfg.levels) if cfg.levels == qsgd_levels(qsgd_bits(cfg.levels)) else None

    @classmethod
    def width_text(cls, cfg) -> str:
        return f"compressor.levels={cfg.levels} ({qsgd_bits(cfg.levels)}-bit codes)"

    def _is_width(self, bits: int) -> bool:
        return bits == self.bits and self.levels == qsgd_levels(bits)

    def _with_width(self, bits: int) -> "QSGD":
        """QSGD with the most levels a ``bits``-bit code holds (s = 2^(bits-1) - 1), same bucket."""
        return QSGD(levels=qsgd_levels(bits), bucket=self.bucket, check_finite=self.check_finite)

    def _params(self, a, lens, check, rows=None):
        """Each group's (float32 norm, multiplier s / norm, no shift)."""
        norm = finite(group_scale(a, lens, "l2", rows).astype(np.float32), check)
        return norm, safe_inverse(norm, self.levels), None

    def _encode(self, a, lens, seed, check):
        s = self.levels
        return encode_with(self, a, lens, seed, check, add=s, top=2 * s, salt=0x95D)

    def _affine(self, scales):
        return scales / np.float32(self.levels), None
