"""TernGrad (Wen et al., NeurIPS 2017): ternary {-1, 0, 1}·scale, stochastic, unbiased.

Each element x of a tensor (or bucket) with scale m = max|x| is sent as m·sign(x)·b, b ~
Bernoulli(|x|/m): E = x. The code floor(x/m + u) + 1 in {0, 1, 2} has that distribution and is
packed 4 per byte (2 bits); m travels as one float32. The paper's gradient clipping (at 2.5
standard deviations) is not applied: it makes TernGrad biased, and the issue asks for the
unbiased scheme (layer-wise scaling, the paper's other refinement, is granularity=layer).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import COMPRESSORS, CompressorCfg
from .packed import Quantizer, finite, cf_option, encode_with, group_scale, safe_inverse
from gravac.core.registry import option


@dataclass
class TernGradCfg(CompressorCfg):
    """bucket: elements per scale (0: one scale per tensor, the paper's). Error feedback is off by
    default: TernGrad is unbiased (set error_feedback=true to add it)."""
    cf: float = cf_option()
    error_feedback: bool = False
    bucket: int = option(0, check=lambda v: int(v) == v and v >= 0, valid="an integer >= 0 (0: one scale per tensor)")


@COMPRESSORS.register("terngrad", TernGradCfg, label="TernGrad", order=6,
                      doc="TernGrad: stochastic ternary {-1,0,1} x max|g| per tensor (unbiased)")
class TernGrad(Quantizer):
    """TernGrad: 2-bit ternary codes, one float32 max-abs scale per tensor or bucket."""

    name = "terngrad"
    stochastic = True
    bits = 2
    offset = 1.0

    def __init__(self, *, bucket: int = 0, check_finite: bool = True) -> None:
        super().__init__(bucket=bucket, check_finite=check_finite)

    def _params(self, a, lens, check, rows=None):
        """Each group's (float32 max |x|, multiplier 1 / max, no shift)."""
        m = finite(group_scale(a, lens, "max", rows).astype(np.float32), check)
        return m, safe_inverse(m, 1.0), None

    def _encode(self, a, lens, seed, check):
        return encode_with(self, a, lens, seed, check, add=1.0, top=2, salt=0x7E6)

    def _affine(self, scales):
        return scales, None
