"""Bucketed min-max quantization (CGX / Bagua style): b-bit codes between each bucket's min and max.

A bucket with minimum lo and maximum hi is sent as codes c in [0, 2^b - 1] with value lo + c·step,
step = (hi - lo) / (2^b - 1), plus (lo, step) as two float32. Rounding is to the nearest level by
default: with error feedback (on by default) the residual carries the rounding error, nearest
rounding halves the worst-case error of stochastic rounding (step/2 instead of step) and needs no
random bits (the costliest part of a stochastic quantizer). rounding=stochastic makes it unbiased
(CGX's choice, for runs without error feedback).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import COMPRESSORS, CompressorCfg
from .packed import Quantizer, cf_option, encode_with, finite, group_min_max
from gravac.core.registry import option


@dataclass
class QuantCfg(CompressorCfg):
    """bits: code width (8, 4 or 2); bucket: elements per (min, step) pair (0: one per tensor);
    rounding: nearest (deterministic, with error feedback) or stochastic (unbiased)."""
    cf: float = cf_option()
    bits: int = option(8, choices=(8, 4, 2))
    bucket: int = option(1024, check=lambda v: int(v) == v and v >= 0, valid="an integer >= 0 (0: one pair per tensor)")
    rounding: str = option("nearest", choices=("nearest", "stochastic"))


@COMPRESSORS.register("quant", QuantCfg, label="Min-max quant", order=8,
                      doc="bucketed min-max quantization to 8, 4 or 2 bits (CGX/Bagua style)")
class Quant(Quantizer):
    """Min-max quantization: ``bits``-bit codes, a float32 (min, step) per ``bucket`` elements."""

    name = "quant"
    scale_count = 2     # (min, step)
    shifted = True      # codes of x - min
    widths = (8, 4, 2)

    def __init__(self, *, bits: int = 8, bucket: int = 1024, rounding: str = "nearest",
                 check_finite: bool = True) -> None:
        super().__init__(bucket=bucket, check_finite=check_finite)
        if bits not in (8, 4, 2) or rounding not in ("nearest", "stochastic"):
            raise ValueError(f"Quant needs bits in 8/4/2 and rounding nearest|stochastic; "
                             f"got bits={bits}, rounding={rounding!r}")
        self.bits, self.rounding = int(bits), rounding
        self.stochastic = rounding == "stochastic"

    @classmethod
    def code_bits(cls, cfg) -> int:
        return cfg.bits

    @classmethod
    def width_text(cls, cfg) -> str:
        return f"compressor.bits={cfg.bits}"

    def _with_width(self, bits: int) -> "Quant":
        """The same quantizer (bucket, rounding) at ``bits`` (8, 4 or 2)."""
        return Quant(bits=bits, bucket=self.bucket, rounding=self.rounding, check_finite=self.check_finite)

    def _params(self, a, lens, check, rows=None):
        """Each group's ((min, step) as float32, multiplier 1 / step, shift -min)."""
        lo, hi = group_min_max(a, lens, rows)
        top = (1 << self.bits) - 1
        lo = finite(lo.astype(np.float32), check)
        step = finite(((hi.astype(np.float64) - lo) / top).astype(np.float32), check)
        inv = np.zeros(step.shape, dtype=np.float64)
        np.divide(1.0, step, out=inv, where=step > 0)
        return np.stack([lo, step], axis=1), inv, -lo

    def _encode(self, a, lens, seed, check):
        return encode_with(self, a, lens, seed, check, add=0.0, top=(1 << self.bits) - 1, salt=0x0B7)

    def _affine(self, scales):
        return scales[:, 1], scales[:, 0]

