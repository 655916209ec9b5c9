"""16-bit casts (``fp16``, ``bf16``): the gradient all-reduced in half precision, CF 2.

What torch's ``fp16_compress_hook`` / ``bf16_compress_hook`` do, as a compressor: every element is
cast to the 16-bit type (round to nearest even), the cast values are summed over the workers *in
16 bits* by an ordinary all-reduce, and the mean is cast back. Unlike a quantizer's codes the
payload is summable in its wire format (no scales), so it keeps the dense all-reduce and its
overlap. The communication layer divides each worker's 16-bit values by the number of workers
*before* the sum (gravac/cluster/comm.py: ``Group.aggregate_half``, as the torch hook does after
its cast),
so the sum cannot overflow where the mean would not: fp16's largest finite value is 65504, and 8
workers sending 10000 each would overflow a 16-bit sum of the undivided values. bf16 has fp32's
range (and 8 bits of mantissa against fp16's 11), so it never overflows where fp32 does not.

A gradient element beyond the type's largest finite value cannot be sent at all: with
``check_finite`` (the default) that is refused in one line naming bf16, instead of an infinite
average. Floats sent = wire bits / 32 = M / 2 (docs/DEFINITIONS.md), wire bytes 2 per element.
Error feedback is off by default (torch's hooks keep none; the residual would be the rounding
error, at most 2^-11 of an element in fp16, 2^-8 in bf16); compressor.error_feedback=true keeps it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .base import COMPRESSORS, Compressor, CompressorCfg, check_finite, validate
from .packed import CF_UNSET
from gravac.core.registry import option


@dataclass
class HalfCfg(CompressorCfg):
    """A 16-bit cast: its CF is 2 (32 / 16 bits); error feedback off by default (as torch's hook)."""
    cf: float = option(CF_UNSET, check=lambda v: v == CF_UNSET,
                       valid="left unset: a 16-bit cast sends at CF 2 (32 / 16 bits)")
    error_feedback: bool = option(False, doc="keep the cast's rounding error for the next step "
                                             "(off: as torch's fp16/bf16 compress hooks)")


def cast(t: Tensor, dtype: torch.dtype) -> Tensor:
    """t.to(dtype); a CPU result goes into NumPy-allocated memory (NumPy asks the kernel for huge
    pages for large arrays: first touching it costs about a quarter of torch's own allocation here,
    which was most of a cast's time). Same values as t.to(dtype)."""
    if t.device.type != "cpu" or t.dtype == dtype:
        return t.to(dtype)
    out = torch.from_numpy(np.empty(t.numel() * dtype.itemsize, dtype=np.uint8)).view(dtype)
    return out.view(t.shape).copy_(t)


class HalfPayload:
    """What one worker sends under a 16-bit cast: ``wire``, the flat gradient in 16 bits.

    Duck-types a dense Payload where a consumer needs values: ``values`` and ``dense()`` are the
    wire values cast back to the gradient's dtype (the error feedback's residual is then exactly
    the rounding error), ``indices`` is None. ``half`` marks it for the communication layer, which
    all-reduces ``wire`` divided by the world size (``Group.aggregate_half``).
    """

    half = True
    packed = False
    indices = None
    shared = False

    def __init__(self, wire: Tensor, dtype: torch.dtype) -> None:
        self.wire, self.dtype, self.numel = wire, dtype, int(wire.numel())
        self._dense: Tensor | None = None

    @property
    def nnz(self) -> int:
        """Elements the payload represents (every one)."""
        return self.numel

    @property
    def floats(self) -> float:
        """Float32 value-equivalents sent: wire bits / 32 = numel / 2."""
        return self.wire_bytes() / 4

    def wire_bytes(self) -> int:
        return self.numel * self.wire.element_size()

    def index_bytes(self) -> int:
        return 0

    @property
    def values(self) -> Tensor:
        return self.dense()

    def dense(self) -> Tensor:
        """The sent values in the gradient's dtype (cast once; later calls return the same tensor)."""
        if self._dense is None:
            self._dense = cast(self.wire, self.dtype)
        return self._dense

    def __repr__(self) -> str:
        return f"HalfPayload({self.wire.dtype}, numel={self.numel})"


class CastOverflow(ValueError):
    """A finite gradient element the 16-bit type cannot hold (the run stops with this one line)."""


class Half(Compressor):
    """Cast to ``wire_dtype`` (a subclass sets it); ``compress(x, cf)`` ignores cf (CF 2)."""

    wire_dtype = torch.float16
    segmented = True      # Layerwise hands over the whole tensor: a cast has no per-layer state

    @classmethod
    def fixed_cf(cls, cfg) -> float:
        return 32.0 / (8 * torch.tensor([], dtype=cls.wire_dtype).element_size())

    @classmethod
    def setting(cls, cfg) -> str:
        return f"{cls.fixed_cf(cfg):g}x"

    @torch.no_grad()
    def compress_checked(self, x: Tensor, cf=None, *, seed: int = 0, check: bool = True) -> HalfPayload:
        validate(x, 1.0)
        if check:
            top = check_finite(x)
            limit = torch.finfo(self.wire_dtype).max
            if top > limit:
                raise CastOverflow(f"a gradient element of magnitude {top:.4g} exceeds {self.name}'s largest value "
                                 f"{limit:g}: use compressor=bf16 (fp32's range) or clip the gradient")
        return HalfPayload(cast(x.detach(), self.wire_dtype), x.dtype)

    def quantize(self, x: Tensor, sizes, *, seed: int = 0, check: bool = True) -> HalfPayload:
        """Layer-wise granularity: the same cast (an element's rounding ignores its layer)."""
        return self.compress_checked(x, seed=seed, check=check)

    def decode(self, p: HalfPayload) -> Tensor:
        """The sent values in the gradient's dtype (a fresh cast: what a receiver does)."""
        return cast(p.wire, p.dtype)

    def _select(self, a, k, cf, seed, check):  # pragma: no cover - compress_checked is overridden
        raise NotImplementedError

    def recompress(self, p, cs, *, seed: int = 0):
        raise ValueError(f"{self.name} cannot compress a payload further (multi-level compression needs a "
                         "sparsifier)")


@COMPRESSORS.register("fp16", HalfCfg, label="FP16", order=7,
                      doc="cast to IEEE half precision and all-reduce in 16 bits (torch's fp16_compress_hook)")
class FP16(Half):
    """IEEE binary16: 11 significant bits, largest finite value 65504."""
    name = "fp16"
    wire_dtype = torch.float16


@COMPRESSORS.register("bf16", HalfCfg, label="BF16", order=7,
                      doc="cast to bfloat16 and all-reduce in 16 bits (torch's bf16_compress_hook)")
class BF16(Half):
    """bfloat16: 8 significant bits, fp32's exponent range."""
    name = "bf16"
    wire_dtype = torch.bfloat16

