"""EF-SignSGD (Karimireddy et al., ICML 2019): scaled sign with error feedback (biased).

Each tensor (or bucket) p is sent as (||p||_1 / d)·sign(p): one bit per element, packed 8 per
byte, plus its float32 mean |p|. The compressor is biased; the method is the compressor *with*
error feedback, so compressor.error_feedback must stay true. sign(0) is sent as +1 (one bit has
no zero; the residual keeps the difference).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import COMPRESSORS, CompressorCfg
from .packed import Quantizer, finite, cf_option, encode_with, group_scale, sign_bits_abs_sum
from gravac.core.registry import option


@dataclass
class EFSignSGDCfg(CompressorCfg):
    """bucket: elements per scale (0: one per tensor, as the paper's layer-wise scaled sign)."""
    cf: float = cf_option()
    error_feedback: bool = option(True, check=lambda v: v is True,
                                  valid="true: EF-SignSGD is the scaled sign with error feedback")
    bucket: int = option(0, check=lambda v: int(v) == v and v >= 0, valid="an integer >= 0 (0: one scale per tensor)")


@COMPRESSORS.register("efsignsgd", EFSignSGDCfg, label="EF-SignSGD", order=7,
                      doc="EF-SignSGD: sign x mean|g| per tensor, 1 bit per element, error feedback")
class EFSignSGD(Quantizer):
    """Scaled sign: 1-bit codes (1: +, 0: -), one float32 mean |x| per tensor or bucket."""

    name = "efsignsgd"
    bits = 1
    offset = 0.5

    def __init__(self, *, bucket: int = 0, check_finite: bool = True) -> None:
        super().__init__(bucket=bucket, check_finite=check_finite)

    def _params(self, a, lens, check, rows=None):
        """Each group's (float32 mean |x|, no multiplier, no shift): the codes are the signs."""
        return finite(group_scale(a, lens, "mean", rows).astype(np.float32), check), None, None

    def _encode(self, a, lens, seed, check):
        if lens.shape[0] == 1:          # one scale per tensor: with the kernels, signs and sum in one read
            both = sign_bits_abs_sum(a)
            if both is not None:
                return both[0], finite((np.array([both[1]]) / lens).astype(np.float32), check)
        return encode_with(self, a, lens, seed, check)

    def _affine(self, scales):
        return 2 * scales, None                # (b - 1/2) * 2m = +-m
