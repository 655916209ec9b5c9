"""Quantizers' shared machinery: the packed payload, bit packing, scale groups, seeded dithers.

A quantizer sends every element as a b-bit code (b in 1, 2, 4, 8) plus a few float32 numbers per
*group* of elements (a bucket, or a whole tensor): QSGD's norms, TernGrad's and EF-SignSGD's
scales, min-max quantization's (min, step). Every element decodes as

    value = (code - offset) * step[g] + base[g]                 (g: the element's group)

with ``offset`` fixed by the quantizer (QSGD: s, TernGrad: 1, EF-SignSGD: 1/2, min-max: 0), so a
zero code of a symmetric quantizer decodes to exactly 0. Groups never cross a layer boundary
(granularity=layer) and follow from the layout and the bucket size, which every worker knows: they
are not sent. The payload's size therefore depends only on the layout, identical on every worker,
and an all-gather needs neither counts nor padding.

Wire format (``QuantPayload.to_bytes``), what ``wire_bytes()`` counts exactly: the codes packed
little-end first (code i in bits (i mod 8/b)*b of byte i div (8/b); the last byte zero-padded),
then each group's float32 scales. Floats-sent convention: value-equivalents = wire bits / 32, so
CF = numel / floats = 32 / (wire bits per element).

Randomness (stochastic rounding) is 16-bit: code = floor(y + u), u = (r + 1/2) / 2^16 with r a
uniform 16-bit integer, so E[code] = y up to 2^-17 of a level (float32 rounding of y is of the
same order for 8-bit codes). The integers come from NumPy's PCG64 seeded by the caller's torch
CPU generator (compressors.base.generator): a deterministic function of the seed, so simulated and
real workers draw identically, several times faster than torch's own CPU generator (its uniform
floats cost about two memory passes at the ResNet101 size). The encode and decode loops run in
cache-sized blocks on torch.get_num_threads() threads; each block's work and draws depend on its
position only, so the bytes do not depend on the thread count.

Per-layer code widths (``Quantizer.quantize_widths``, for L-GreCo's per-layer levels): a quantizer
that offers several ``widths`` (min-max quant: 8/4/2 bits; QSGD: 8/4/2-bit codes at s = 127/7/1)
encodes segment i of a flat tensor at its own width. When every segment has one width the payload
is that width's ``quantize`` of the whole tensor (byte for byte a uniform quantizer's). Otherwise
every non-empty segment is its own piece (``MixedPayload``): its own scale groups (as they always
are), its codes packed from a fresh byte, its stochastic rounding from ``mix_seed(seed, i)``; the
wire format is the pieces' wire formats one after another, so its size follows from the layout and
the widths alone (``segment_bytes``), the same on every worker that uses the same widths.

The arithmetic is on the CPU: a tensor on another device is copied to the CPU and the decoded
tensor back (no device kernels yet). With numba installed the element loops, the float64 scale
sums and the dither stream run as compiled kernels (compressors/_qkernels.py, through
arrays.kernels_for), bucketed scales and codes in one read of the tensor (``fused_encode``);
the results are the NumPy code's bit for bit, and the NumPy code runs without numba.
"""
from __future__ import annotations

import threading
from abc import abstractmethod
from concurrent.futures import wait
from dataclasses import fields

import numpy as np
import torch
from torch import Tensor

from .arrays import NONFINITE, kernels_for
from .base import Compressor, CompressorCfg, generator, mix_seed, validate
from gravac.core.registry import option

#: Unused value of compressor.cf for quantizers: the base config's default (cf is not set).
CF_UNSET = {f.name: f.default for f in fields(CompressorCfg)}["cf"]


def cf_option():
    """compressor.cf for a quantizer: fixed by its code width, so setting it is an error (one line)."""
    return option(CF_UNSET, check=lambda v: v == CF_UNSET,
                  valid="left unset: a quantizer's CF is fixed by its code width (CF = 32 / wire bits per "
                        "element); choose its bits or levels instead")


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes (each < 2**bits) packed 8/bits per byte, little-end first; last byte zero-padded.
    2 and 4 bits combine neighbouring codes inside uint32 / uint16 words (a few whole-array ops)."""
    if bits == 8:
        return codes
    if bits == 1:
        return np.packbits(codes, bitorder="little")
    per, n = 8 // bits, codes.shape[0]
    if n % per:
        codes = np.concatenate([codes, np.zeros(per - n % per, dtype=np.uint8)])
    if not np.little_endian:  # pragma: no cover - the word trick assumes little-endian words
        body = codes.reshape(-1, per).astype(np.uint16) << (np.arange(per, dtype=np.uint16) * bits)
        return np.bitwise_or.reduce(body, axis=1).astype(np.uint8)
    if bits == 4:                       # c0 + c1 << 8  ->  c0 | c1 << 4
        v = codes.view(np.uint16)
        return ((v & 0x000F) | ((v >> 4) & 0x00F0)).astype(np.uint8)
    v = codes.view(np.uint32)           # c0 | c1 << 8 | c2 << 16 | c3 << 24
    w = v | (v >> 6)                    # c0 | c1 << 2 in byte 0, c2 | c3 << 2 in byte 2
    w &= 0x000F000F
    w |= w >> 12
    return w.astype(np.uint8)


def sign_bits(a: np.ndarray) -> np.ndarray:
    """The bits a >= 0 (NaN: 0) of float array a packed at 1 bit (see pack): EF-SignSGD's codes.
    With numba the kernel ``sign_pack`` (compressors/_qkernels.py) writes the bytes straight from
    a, on the module's threads (one read, no byte-per-element temporary); same bytes."""
    k = quant_kernels(a)
    if k is None:
        return pack(np.greater_equal(a, 0).view(np.uint8), 1)
    out = np.empty(-(-a.shape[0] // 8), dtype=np.uint8)

    def part(blocks):
        if blocks:
            k.sign_pack(a, blocks[0][0], blocks[-1][1], out)
    in_parts(kernel_blocks(a.shape[0]), part)
    return out


def sign_bits_abs_sum(a: np.ndarray):
    """(sign_bits(a), the float64 sum of |a| as ``np.abs(a[None]).sum(axis=1, dtype=np.float64)``
    gives it) in one read of a, or None without the kernels or for a shorter than a NumPy buffer:
    EF-SignSGD with one scale per tensor (its mean |x|) needs both, and a second read of a
    large tensor costs as much as the first."""
    k, buf = quant_kernels(a), np.getbufsize()
    n = a.shape[0]
    if k is None or n <= buf or BLOCK % buf or buf % 8:
        return None
    out = np.empty(-(-n // 8), dtype=np.uint8)
    sums = np.empty(-(-n // buf), dtype=np.float64)

    def part(blocks):       # blocks start at multiples of BLOCK, so of buf and 8
        if blocks:
            k.sign_pack_abs_sums(a, blocks[0][0], blocks[-1][1], buf, sums, out)
    in_parts(kernel_blocks(n), part)
    return out, k.ordered_sum(sums)


def unpack(packed: np.ndarray, bits: int, n: int) -> np.ndarray:
    """The n uint8 codes of ``pack(codes, bits)``."""
    return np.take(code_table(bits, np.uint8, 0), packed, axis=0).reshape(-1)[:n]


def nibbles(packed: np.ndarray) -> np.ndarray:
    """The 2n 4-bit codes of n bytes, as uint8: each byte widened to a little-endian uint16 with
    its high nibble moved to the second byte (NumPy's take on a 2-float table is ~10x slower)."""
    w = packed.astype(np.uint16)
    w = (w & 0x000F) | ((w & 0x00F0) << 4)
    return w.view(np.uint8) if np.little_endian else w.byteswap().view(np.uint8)


def code_table(bits: int, dtype, offset: float) -> np.ndarray:
    """(256, 8/bits) table: the codes a byte holds, minus ``offset``, as ``dtype``."""
    per = 8 // bits
    b = np.arange(256)[:, None] >> (np.arange(per) * bits)[None, :]
    return ((b & ((1 << bits) - 1)) - offset).astype(dtype)


def group_lengths(sizes, bucket: int) -> np.ndarray:
    """Lengths of the scale groups of a flat tensor made of segments of ``sizes``: each segment
    cut into buckets of ``bucket`` elements (the last one shorter), or whole with bucket=0; empty
    segments have no group."""
    parts = []
    for m in sizes:
        m = int(m)
        if m <= 0:
            continue
        if bucket <= 0 or bucket >= m:
            parts.append(np.array([m], dtype=np.int64))
        else:
            full, rest = divmod(m, bucket)
            parts.append(np.full(full + (rest > 0), bucket, dtype=np.int64))
            if rest:
                parts[-1][-1] = rest
    return np.concatenate(parts)


#: Elements per block of the blocked encode/decode loops (their temporaries stay in cache).
BLOCK = 1 << 16


class Spread:
    """One value per group, read per element over a block [lo, hi) of the flat tensor.

    One group: a scalar. Groups of one length L: blocks are cut at multiples of L and the values
    broadcast over a (groups, L) view. Otherwise the values of the groups meeting the block are
    repeated per element (a block-sized temporary)."""

    def __init__(self, vals: np.ndarray, lens: np.ndarray, n: int) -> None:
        self.vals = vals
        L = int(lens[0])
        if lens.shape[0] == 1:
            self.kind, self.L = "one", 1
        elif (lens[:-1] == L).all() and int(lens[-1]) <= L:
            self.kind, self.L = "uniform", L       # the last group may be shorter
        else:
            self.kind, self.L = "repeat", 1
            self.bounds = np.concatenate([[0], np.cumsum(lens)])

    def blocks(self, n: int):
        """Block bounds (lo, hi), about BLOCK elements each, multiples of 8 (whole bytes of codes)
        and for uniform groups of L."""
        unit = int(np.lcm(self.L, 8)) if self.kind == "uniform" else 8
        step = max(BLOCK // unit, 1) * unit
        return [(lo, min(n, lo + step)) for lo in range(0, n, step)]

    def apply(self, ufunc, y: np.ndarray, lo: int, hi: int, src: np.ndarray | None = None) -> None:
        """y = ufunc(src, value) for the block [lo, hi) (src: y itself, in place, by default)."""
        x = y if src is None else src
        if self.kind == "one":
            ufunc(x, self.vals[0], out=y)
        elif self.kind == "repeat":                   # the groups meeting [lo, hi), repeated
            g0 = int(np.searchsorted(self.bounds, lo, side="right")) - 1
            g1 = int(np.searchsorted(self.bounds, hi, side="left"))
            b = np.clip(self.bounds[g0:g1 + 1], lo, hi)
            ufunc(x, np.repeat(self.vals[g0:g1], np.diff(b)), out=y)
        else:
            g0, L = lo // self.L, self.L
            full = (hi - lo) // L
            if full:
                v = y[:full * L].reshape(full, L)
                ufunc(x[:full * L].reshape(full, L), self.vals[g0:g0 + full, None], out=v)
            if hi - lo > full * L:                  # the short last group
                ufunc(x[full * L:], self.vals[g0 + full], out=y[full * L:])


def grouped(a: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """a reshaped (groups, length) when all groups have one length, else a (for reductions)."""
    if lens.shape[0] == 1 or (a.shape[0] % lens[0] == 0 and lens.shape[0] == a.shape[0] // lens[0]
                              and (lens == lens[0]).all()):
        return a.reshape(lens.shape[0], -1)
    return a


def group_reduce(ufunc, a: np.ndarray, lens: np.ndarray, pre=None):
    """ufunc.reduceat over each group of the flat array a, of ``pre(a, dtype=float64)`` if given
    (np.square, np.abs); ``ufunc`` may be a tuple of ufuncs (one result each, one read of a).
    Groups of at most BLOCK elements go in blocks of whole groups on the module's threads, the
    transform staying in cache; each group is still one reduceat segment, so the result is the
    one of a single reduceat over the whole array.

    Sums of np.square or np.abs of float32 a go to the kernel ``group_sums`` when numba is there
    (compressors/_qkernels.py: reduceat's summation order, the same float64 bits, no float64
    temporary)."""
    funcs = ufunc if isinstance(ufunc, tuple) else (ufunc,)
    k = quant_kernels(a) if ufunc is np.add and (pre is np.square or pre is np.abs) else None
    if k is not None:
        bounds, sums = group_starts(lens), np.empty(lens.shape[0], dtype=np.float64)

        def run(blocks):
            for g0, g1 in blocks:
                k.group_sums(a, bounds, g0, g1, pre is np.square, sums)
        in_parts(group_blocks(lens.shape[0], int(lens.max())), run, a.shape[0])
        return sums
    starts = np.zeros(lens.shape[0], dtype=np.int64)
    np.cumsum(lens[:-1], out=starts[1:])
    if a.shape[0] < PARALLEL_MIN or int(lens.max()) > BLOCK:
        v = a if pre is None else pre(a, dtype=np.float64)
        outs = [f.reduceat(v, starts) for f in funcs]
        return tuple(outs) if isinstance(ufunc, tuple) else outs[0]
    outs = [np.empty(lens.shape[0], dtype=np.float64 if pre is not None else a.dtype) for _ in funcs]

    def part(blocks):
        for g0, g1 in blocks:
            lo, hi = int(starts[g0]), int(starts[g1 - 1] + lens[g1 - 1])
            v = a[lo:hi] if pre is None else pre(a[lo:hi], dtype=np.float64)
            for f, out in zip(funcs, outs):
                f.reduceat(v, starts[g0:g1] - lo, out=out[g0:g1])
    in_parts(group_blocks(lens.shape[0], int(lens.max())), part, a.shape[0])
    return tuple(outs) if isinstance(ufunc, tuple) else outs[0]


def group_blocks(groups: int, length: int) -> list[tuple[int, int]]:
    """Ranges [g0, g1) of whole groups of at most ``length`` elements, about BLOCK elements each."""
    per = max(BLOCK // length, 1)
    return [(g, min(g + per, groups)) for g in range(0, groups, per)]


def dither_seed(seed: int, salt: int) -> int:
    """Seed of the 16-bit dither stream of (seed, salt), drawn from a torch CPU generator
    (compressors.base.generator): NumPy's PCG64 from it is the same on every host, and element
    i's 16 bits are bits 16(i mod 4).. of the stream's (i div 4)-th 64-bit output."""
    return int(torch.randint(0, 2**62, (1,), generator=generator(seed, salt)))


def affine_codes(a: np.ndarray, lens: np.ndarray, mult: np.ndarray, add: float, top: int, *,
                 seed: int | None, salt: int = 0, shift: np.ndarray | None = None, bits: int = 8) -> np.ndarray:
    """Codes of y = (a + shift[g]) * mult[g] + add (y in [0, top] by construction), packed at
    ``bits`` (see pack): floor(y + u) with u uniform 16-bit (stochastic, E[code] = y) when ``seed``
    is given, else round(y) (nearest). The shift comes first so that data far from 0 keeps its
    precision.

    Stochastic: t = y * 2^16 + r + 1/2 in float32 (below 2^24 for top <= 255, so the 16 random
    bits keep their weight), truncated to int32 and shifted right by 16. Codes a float rounding
    outside [0, top] are clipped. Runs in blocks of about BLOCK elements (cache-resident
    temporaries, each block packed before it leaves the cache); block b of the dither is the
    stream's next (block length) 16-bit integers.

    With numba, the compiled kernel ``affine_encode`` (compressors/_qkernels.py) does each block's
    element work in one read (same float32 operations, same bytes); else the NumPy code below."""
    n, scale = a.shape[0], 65536.0 if seed is not None else 1.0
    mult32 = (mult * scale).astype(np.float32)
    shift32 = shift.astype(np.float32) if shift is not None else None
    s0 = dither_seed(seed, salt) if seed is not None else None
    plus = np.float32(add * scale + 0.5)
    per = 8 // bits
    out = np.empty(-(-n // per), dtype=np.uint8)
    k = quant_kernels(a)
    if k is not None:
        _affine_kernel(k, a, group_starts(lens), mult32, shift32, s0, plus, top, bits, out)
        return out
    m = Spread(mult32, lens, n)
    sh = Spread(shift32, lens, n) if shift is not None else None

    def part(blocks):
        if not blocks:
            return
        size = max(hi - lo for lo, hi in blocks)     # a block of whole groups may exceed BLOCK
        ybuf, tbuf = np.empty(size, dtype=np.float32), np.empty(size, dtype=np.int32)
        cbuf = np.empty(size, dtype=np.uint8) if per > 1 else None
        bg = None
        if s0 is not None:          # the stream from this part's first draw: blocks start at multiples of 8
            bg = np.random.PCG64(s0)
            bg.advance(blocks[0][0] // 4)
        for lo, hi in blocks:
            y, t = ybuf[:hi - lo], tbuf[:hi - lo]
            if sh is not None:
                sh.apply(np.add, y, lo, hi, src=a[lo:hi])
                m.apply(np.multiply, y, lo, hi)
            else:
                m.apply(np.multiply, y, lo, hi, src=a[lo:hi])
            if bg is not None:
                y += bg.random_raw((hi - lo + 3) // 4).view(np.uint16)[:hi - lo]
            y += plus
            np.copyto(t, y, casting="unsafe")      # truncation = floor for y >= 0
            if bg is not None:
                t >>= 16
            np.clip(t, 0, top, out=t)
            if cbuf is None:
                np.copyto(out[lo:hi], t, casting="unsafe")
            else:                                  # blocks start on a byte: pack them one by one
                c = cbuf[:hi - lo]
                np.copyto(c, t, casting="unsafe")
                out[lo // per:-(-hi // per)] = pack(c, bits)
    in_parts(m.blocks(n), part)
    return out


def quant_kernels(a: np.ndarray):
    """The compiled kernels (compressors/_qkernels.py, through arrays.kernels_for) if they take
    ``a``: a contiguous 1-D float32 NumPy array (what Quantizer.quantize hands on); else None."""
    k = kernels_for(a)
    return k if k is not None and a.dtype == np.float32 and a.flags.c_contiguous else None


def group_starts(lens: np.ndarray) -> np.ndarray:
    """Group bounds of the flat tensor: 0, then each group's end (int64, groups + 1 entries)."""
    starts = np.zeros(lens.shape[0] + 1, dtype=np.int64)
    np.cumsum(lens, out=starts[1:])
    return starts


def kernel_blocks(n: int) -> list[tuple[int, int]]:
    """Blocks [lo, hi) of BLOCK elements (the last shorter) for the kernels' thread split; BLOCK
    is a multiple of 8, so every block starts on a whole byte of codes and a whole dither word."""
    return [(lo, min(n, lo + BLOCK)) for lo in range(0, n, BLOCK)]


def _affine_kernel(k, a, starts, mult32, shift32, s0, plus, top, bits, out) -> None:
    """affine_codes' blocks through the kernel, one call per thread's run of blocks. The dither:
    NumPy's PCG64 seeded and advanced to the run's start (as the NumPy code does), whose state the
    kernel steps on (``pcg64_fill``: the words random_raw would return, in the same order)."""
    n = a.shape[0]

    def part(blocks):
        if not blocks:
            return
        rng = None
        if s0 is not None:
            bg = np.random.PCG64(s0)
            bg.advance(blocks[0][0] // 4)
            rng = k.pcg64_state(bg)
        k.affine_encode(a, blocks[0][0], blocks[-1][1], starts, mult32, shift32, rng, plus, top, bits, out)
    in_parts(kernel_blocks(n), part)


#: Longest group fused_encode takes. NumPy's buffered row sums (einsum, sums with a dtype) cut
#: longer rows at buffer (np.getbufsize(): 8192) boundaries that depend on where the call starts:
#: a run of rows could then sum a row in another order than the whole tensor's call did.
FUSE_MAX = 8192
#: Elements per run of whole groups in fused_encode (its scales and codes, while in cache).
FUSE_RUN = 4 * BLOCK


def encode_with(q, a: np.ndarray, lens: np.ndarray, seed: int | None, check: bool, *, add: float = 0.0,
                top: int = 0, salt: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A quantizer's (codes, scales): ``q._params`` gives each group's (scales, mult, shift) and the
    codes are affine_codes(mult, add, top, shift), or the sign bits for 1-bit ``q`` (EF-SignSGD).
    With the kernels and groups of at most FUSE_MAX elements, fused_encode (the scales and codes of
    a run of groups in one read from memory); else the scales of the whole tensor, then its codes."""
    seed = seed if q.stochastic else None
    k = quant_kernels(a)
    if k is not None and lens.shape[0] > 1 and int(lens.max()) <= min(FUSE_MAX, np.getbufsize()):
        return fused_encode(k, q, a, lens, seed, check, add=add, top=top, salt=salt)
    scales, mult, shift = q._params(a, lens, check)
    if q.bits == 1:
        return sign_bits(a), scales
    return affine_codes(a, lens, mult, add, top, seed=seed, salt=salt, shift=shift, bits=q.bits), scales


def fused_encode(k, q, a, lens, seed, check, *, add, top, salt) -> tuple[np.ndarray, np.ndarray]:
    """encode_with's codes and scales, the same bytes, by runs of about FUSE_RUN elements of whole
    groups: a run's scales by ``q._params`` on the run (the NumPy route the whole tensor takes,
    kept by ``rows``: every group's scale is reduced alone, so it does not depend on the run),
    then the codes up to the run's last multiple of 8 by the kernel, while the run is in cache.

    Each thread's part starts at a multiple of 8 (its dither stream advanced there) and computes
    the scales of the group it starts in too (a group two parts share: both write the same values).
    A run (at most FUSE_RUN + FUSE_MAX elements) stays under PARALLEL_MIN, so the NumPy scale
    code it calls runs on the calling pool thread (no nested thread split).
    """
    n, G = a.shape[0], lens.shape[0]
    starts = group_starts(lens)
    rows = grouped(a, lens).ndim == 2
    scale = 65536.0 if seed is not None else 1.0
    plus = np.float32(add * scale + 0.5)
    s0 = dither_seed(seed, salt) if seed is not None else None
    out = np.empty(-(-n // (8 // q.bits)), dtype=np.uint8)
    scales = np.empty((G, q.scale_count) if q.scale_count > 1 else G, dtype=np.float32)
    mult32 = np.empty(G, dtype=np.float32)
    shift32 = np.empty(G, dtype=np.float32) if q.shifted else None

    def part(blocks):
        if not blocks:
            return
        p0, p1 = blocks[0][0], blocks[-1][1]
        rng = None
        if s0 is not None:
            bg = np.random.PCG64(s0)
            bg.advance(p0 // 4)
            rng = k.pcg64_state(bg)
        g0 = int(np.searchsorted(starts, p0, side="right")) - 1
        c = p0
        while c < p1:
            g1 = min(G, max(g0 + 1, int(np.searchsorted(starts, starts[g0] + FUSE_RUN, side="right")) - 1))
            lo, hi = int(starts[g0]), int(starts[g1])
            sc, mu, sh = q._params(a[lo:hi], lens[g0:g1], check, rows)
            scales[g0:g1] = sc
            if mu is not None:
                mult32[g0:g1] = (mu * scale).astype(np.float32)
            if sh is not None:
                shift32[g0:g1] = sh.astype(np.float32)
            end = min(p1, hi if g1 == G else hi - hi % 8)
            if end > c:
                if q.bits == 1:
                    k.sign_pack(a, c, end, out)
                else:
                    k.affine_encode(a, c, end, starts, mult32, shift32, rng, plus, top, q.bits, out)
                c = end
            g0 = g1
    in_parts(kernel_blocks(n), part)
    return out, scales


#: Below this many elements the blocked loops run on the calling thread only.
PARALLEL_MIN = 1 << 20
POOL_PREFIX = "quantize"   # the pool's thread names (in_parts runs inline on them)
_POOL = None


def in_parts(blocks: list, fn, n: int | None = None) -> None:
    """fn(contiguous run of blocks) for torch.get_num_threads() runs at once (NumPy releases the
    GIL in its loops); the result does not depend on the number of runs (each block's work and
    random draws follow from its position alone). ``n``: elements the blocks cover (default:
    the last block's end). Called from one of the pool's own threads (fused_encode's scales) it
    runs inline: a nested split would wait on parts queued behind the threads that wait for them."""
    k = min(torch.get_num_threads(), len(blocks), 8)
    if k <= 1 or (blocks[-1][1] if n is None else n) < PARALLEL_MIN or \
            threading.current_thread().name.startswith(POOL_PREFIX):
        fn(blocks)
        return
    pool = _pool(k)
    cut = [round(i * len(blocks) / k) for i in range(k + 1)]
    futures = [pool.submit(fn, blocks[cut[i]:cut[i + 1]]) for i in range(k)]
    wait(futures)               # all parts end before an error is raised (none runs on afterwards)
    for f in futures:
        f.result()


def _pool(k: int):
    """The module's thread pool, with at least k threads."""
    global _POOL
    if _POOL is None or _POOL._max_workers < k:
        from concurrent.futures import ThreadPoolExecutor
        _POOL = ThreadPoolExecutor(max_workers=k, thread_name_prefix=POOL_PREFIX)
    return _POOL


class QuantPayload:
    """What one worker sends for one tensor under a quantizer: packed codes and group scales.

    Duck-types Payload where a consumer needs the values: ``values`` and ``dense()`` are the
    decoded tensor (computed once), ``indices`` is None. ``packed`` marks it for the
    communication layer, which all-gathers ``to_bytes()`` (the payload's size is the same on
    every worker for one layout) and decodes each worker's bytes with ``from_bytes``.
    """

    packed = True
    indices = None
    shared = False

    def __init__(self, codes: np.ndarray, scales: np.ndarray, numel: int, quantizer: "Quantizer",
                 lens: np.ndarray, dtype: torch.dtype, device) -> None:
        self.codes, self.scales, self.numel = codes, scales, int(numel)
        self.quantizer, self.lens, self.dtype, self.device = quantizer, lens, dtype, device
        self._dense: Tensor | None = None

    @property
    def bits(self) -> int:
        return self.quantizer.bits

    @property
    def nnz(self) -> int:
        """Elements the payload represents (every one: quantizers do not select)."""
        return self.numel

    @property
    def floats(self) -> float:
        """Float32 value-equivalents sent: wire bits / 32 (the suite's floats-sent convention)."""
        return self.wire_bytes() / 4

    def wire_bytes(self) -> int:
        """Exact bytes sent: the packed codes plus 4 bytes per scale."""
        return int(self.codes.nbytes + self.scales.nbytes)

    def index_bytes(self) -> int:
        return 0

    def to_bytes(self) -> Tensor:
        """The wire format as one uint8 tensor of wire_bytes() bytes (codes, then float32 scales)."""
        buf = np.empty(self.wire_bytes(), dtype=np.uint8)
        buf[:self.codes.nbytes] = self.codes
        buf[self.codes.nbytes:] = self.scales.reshape(-1).view(np.uint8)
        return torch.from_numpy(buf).to(self.device)

    def from_bytes(self, buf: Tensor) -> "QuantPayload":
        """Another worker's payload of the same layout, from its to_bytes()."""
        b = buf.cpu().numpy()
        if b.shape[0] != self.wire_bytes():
            raise ValueError(f"packed payload of {b.shape[0]} bytes, expected {self.wire_bytes()}")
        nc = self.codes.nbytes
        scales = b[nc:].copy().view(np.float32).reshape(self.scales.shape)
        return QuantPayload(b[:nc].copy(), scales, self.numel, self.quantizer, self.lens, self.dtype, self.device)

    @property
    def values(self) -> Tensor:
        return self.dense()

    def dense(self) -> Tensor:
        """Decode (once; later calls return the same tensor)."""
        if self._dense is None:
            self._dense = self.quantizer.decode(self)
        return self._dense

    def __repr__(self) -> str:
        return (f"QuantPayload({self.quantizer.name}, numel={self.numel}, bits={self.bits}, "
                f"groups={self.lens.shape[0]}, wire_bytes={self.wire_bytes()})")


class MixedPayload:
    """A payload whose layers (segments) are quantized at different code widths: one QuantPayload
    per non-empty segment (``pieces``, starting at element ``offsets``), sent one after another.
    Duck-types QuantPayload for the communication layer (``packed``, ``to_bytes``, ``from_bytes``,
    ``wire_bytes``, ``floats``) and for error feedback and errors (``values``, ``dense()``)."""

    packed = True
    indices = None
    shared = False

    def __init__(self, pieces: list[QuantPayload], offsets: list[int], numel: int, dtype: torch.dtype, device) -> None:
        self.pieces, self.offsets, self.numel = list(pieces), [int(o) for o in offsets], int(numel)
        self.dtype, self.device = dtype, device
        self._dense: Tensor | None = None

    @property
    def widths(self) -> list[int]:
        """Each piece's code width."""
        return [p.bits for p in self.pieces]

    @property
    def nnz(self) -> int:
        return self.numel

    @property
    def floats(self) -> float:
        """Float32 value-equivalents sent: wire bits / 32 (the suite's floats-sent convention)."""
        return self.wire_bytes() / 4

    def wire_bytes(self) -> int:
        """Exact bytes sent: every piece's packed codes and scales."""
        return sum(p.wire_bytes() for p in self.pieces)

    def index_bytes(self) -> int:
        return 0

    def to_bytes(self) -> Tensor:
        """The pieces' wire formats one after another, as one uint8 tensor of wire_bytes() bytes."""
        buf = np.concatenate([p.to_bytes().cpu().numpy() for p in self.pieces])
        return torch.from_numpy(buf).to(self.device)

    def from_bytes(self, buf: Tensor) -> "MixedPayload":
        """Another worker's payload of the same layout and widths, from its to_bytes()."""
        if buf.shape[0] != self.wire_bytes():
            raise ValueError(f"packed payload of {buf.shape[0]} bytes, expected {self.wire_bytes()}")
        out, lo = [], 0
        for p in self.pieces:
            out.append(p.from_bytes(buf[lo:lo + p.wire_bytes()]))
            lo += p.wire_bytes()
        return MixedPayload(out, self.offsets, self.numel, self.dtype, self.device)

    @property
    def values(self) -> Tensor:
        return self.dense()

    def dense(self) -> Tensor:
        """Decode every piece into its place (once; later calls return the same tensor)."""
        if self._dense is None:
            out = torch.zeros(self.numel, dtype=self.dtype, device=self.device)
            for o, p in zip(self.offsets, self.pieces):
                out[o:o + p.numel] = p.dense()
            self._dense = out
        return self._dense

    def __repr__(self) -> str:
        return (f"MixedPayload({self.pieces[0].quantizer.name}, numel={self.numel}, widths={self.widths}, "
                f"wire_bytes={self.wire_bytes()})")


class Quantizer(Compressor):
    """A compressor sending b-bit codes plus per-group float32 scales (see the module docstring).

    ``compress(x, cf)`` ignores cf (the code width fixes the CF; configs refuse a set
    compressor.cf). Layer-wise granularity (Layerwise) calls ``quantize`` with the layer sizes:
    groups never cross a layer. Subclasses set ``bits``, ``offset``, ``bucket``, and implement
    ``_encode`` (codes and scales) and ``_affine`` (each group's step and base from its scales).
    """

    bits: int = 8
    offset: float = 0.0
    bucket: int = 0
    stochastic: bool = False
    segmented = True    # Layerwise hands the whole tensor and its layer sizes to quantize()
    scale_count = 1     # float32 scales per group
    shifted = False     # _params gives a per-group shift (added before the multiplier)
    widths: tuple = ()  # code widths at_width() can set (empty: one width, nothing to choose)

    def __init__(self, *, bucket: int = 0, check_finite: bool = True) -> None:
        super().__init__(check_finite=check_finite)
        if int(bucket) != bucket or bucket < 0:
            raise ValueError(f"{type(self).__name__} needs an integer bucket >= 0 (0: one group per tensor), got {bucket}")
        self.bucket = int(bucket)
        self._at: dict[int, Quantizer] = {}      # at_width's quantizers at other widths, built once

    @property
    def per_rank_seed(self) -> bool:
        """Stochastic rounding draws independently on every worker (as the papers' workers do):
        the errors of the average then shrink with the number of workers."""
        return self.stochastic

    @classmethod
    def code_bits(cls, cfg) -> int:
        """Bits per code the config gives."""
        return cls.bits

    @classmethod
    def scales_per_group(cls, cfg) -> int:
        return cls.scale_count

    @classmethod
    def default_width(cls, cfg) -> int | None:
        """The code width of the configured quantizer as one of ``widths``, or None when the
        config's width is not one at_width() gives (or the quantizer has none to choose)."""
        return cls.code_bits(cfg) if cls.code_bits(cfg) in cls.widths else None

    @classmethod
    def width_text(cls, cfg) -> str:
        """The config's code width as its options set it, for messages."""
        return f"{cls.code_bits(cfg)}-bit codes"

    def at_width(self, bits: int) -> "Quantizer":
        """This quantizer with code width ``bits`` (one of ``widths``): itself when it is that
        quantizer already, else one built once by ``_with_width`` and kept."""
        if self._is_width(bits):
            return self
        if bits not in self._at:
            self._at[bits] = self._with_width(bits)
        return self._at[bits]

    def _is_width(self, bits: int) -> bool:
        """Whether this quantizer is already what ``at_width(bits)`` stands for."""
        return bits == self.bits

    def _with_width(self, bits: int) -> "Quantizer":
        """The same quantizer (its other options kept) at code width ``bits``."""
        raise ValueError(f"{type(self).__name__} has one code width ({self.bits} bits), not {bits}")

    def segment_bytes(self, sizes, bits) -> np.ndarray:
        """Wire bytes of each segment of ``sizes`` encoded alone at its width ``bits[i]`` (a piece of
        a MixedPayload): its codes packed from a fresh byte plus its groups' float32 scales."""
        out = np.zeros(len(sizes), dtype=np.int64)
        for i, (n, b) in enumerate(zip(sizes, bits)):
            n = int(n)
            if n > 0:
                out[i] = -(-n * int(b) // 8) + 4 * self.scale_count * group_lengths([n], self.bucket).shape[0]
        return out

    @torch.no_grad()
    def quantize_widths(self, x: Tensor, sizes, bits, *, seed: int = 0, check: bool = True):
        """Encode flat x made of segments of ``sizes``, segment i at code width ``bits[i]``: one
        width for all gives that width's quantize() of the whole (a QuantPayload), else a
        MixedPayload of one piece per non-empty segment (see the module docstring)."""
        sizes, bits = [int(s) for s in sizes], [int(b) for b in bits]
        if len(bits) != len(sizes):
            raise ValueError(f"got {len(bits)} code widths for {len(sizes)} segments")
        bad = sorted(set(bits) - set(self.widths or (self.bits,)))
        if bad:
            raise ValueError(f"{type(self).__name__} encodes at code widths {list(self.widths or (self.bits,))}, "
                             f"not {bad}")
        if len(set(bits)) == 1:
            return self.at_width(bits[0]).quantize(x, sizes, seed=seed, check=check)
        validate(x, 1.0)
        if x.numel() != sum(sizes):
            raise ValueError(f"segment sizes sum to {sum(sizes)}, tensor has {x.numel()} elements")
        pieces, offsets, off = [], [], 0
        for i, (n, b) in enumerate(zip(sizes, bits)):
            if n > 0:
                pieces.append(self.at_width(b).quantize(x[off:off + n], [n], seed=mix_seed(seed, i), check=check))
                offsets.append(off)
            off += n
        return MixedPayload(pieces, offsets, x.numel(), x.dtype, x.device)

    @classmethod
    def fixed_cf(cls, cfg) -> float:
        """CF = 32 / bits per element on a tensor much larger than a bucket (scales included;
        a per-tensor scale is counted as nothing)."""
        bucket = getattr(cfg, "bucket", 0)
        bits = cls.code_bits(cfg) + (32 * cls.scales_per_group(cfg) / bucket if bucket else 0.0)
        return 32.0 / bits

    @classmethod
    def setting(cls, cfg) -> str:
        """How plots and tables name the configured quantizer beside its label."""
        bucket = getattr(cfg, "bucket", 0)
        return f"{cls.code_bits(cfg)}-bit" + (f", bucket {bucket}" if bucket else "")

    @torch.no_grad()
    def compress_checked(self, x: Tensor, cf=None, *, seed: int = 0, check: bool = True) -> QuantPayload:
        validate(x, 1.0)
        return self.quantize(x, [x.numel()], seed=seed, check=check)

    @torch.no_grad()
    def quantize(self, x: Tensor, sizes, *, seed: int = 0, check: bool = True) -> QuantPayload:
        """Encode flat x made of segments of ``sizes`` (groups stay inside a segment)."""
        validate(x, 1.0)
        if x.numel() != sum(int(s) for s in sizes):
            raise ValueError(f"segment sizes sum to {sum(sizes)}, tensor has {x.numel()} elements")
        a = x.detach().to("cpu", torch.float32).numpy()
        lens = group_lengths(sizes, self.bucket)
        codes, scales = self._encode(a, lens, seed, check)
        return QuantPayload(codes, scales.astype(np.float32, copy=False), a.shape[0], self,
                            lens, x.dtype, x.device)

    def decode(self, p: QuantPayload) -> Tensor:
        """The dense tensor p stands for: (code - offset) * step + base per group, in blocks: with
        numba by the kernel ``decode_codes`` (compressors/_qkernels.py; same float32 roundings,
        same values), else by the NumPy code below."""
        n = p.numel
        step, base = self._affine(p.scales)
        out = np.empty(n, dtype=np.float32)
        k = quant_kernels(out)
        codes = p.codes
        if k is not None and isinstance(codes, np.ndarray) and codes.dtype == np.uint8 and codes.flags.c_contiguous:
            starts, step32 = group_starts(p.lens), step.astype(np.float32)
            base32 = base.astype(np.float32) if base is not None else None

            def run(blocks):
                if blocks:
                    k.decode_codes(codes, self.bits, self.offset, starts, step32, base32,
                                   blocks[0][0], blocks[-1][1], out)
            in_parts(kernel_blocks(n), run)
            return torch.from_numpy(out).to(device=p.device, dtype=p.dtype)
        st = Spread(step.astype(np.float32), p.lens, n)
        bs = Spread(base.astype(np.float32), p.lens, n) if base is not None else None
        per, blocks = 8 // self.bits, st.blocks(n)
        lut = code_table(self.bits, np.float32, self.offset)   # byte -> its codes minus the offset
        if st.kind == "one" and per > 2:    # one group: the table holds the decoded values (same roundings)
            lut *= st.vals[0]
            if bs is not None:
                lut += bs.vals[0]
            st = bs = None

        def part(blocks):
            for lo, hi in blocks:
                y = out[lo:hi]
                nb, b0 = (hi - lo) // per, lo // per          # whole bytes; blocks start on a byte
                if per <= 2:                                  # 8 and 4 bits: casts (faster than the table)
                    codes = p.codes[lo:hi] if per == 1 else nibbles(p.codes[b0:b0 + nb])
                    np.copyto(y[:nb * per], codes, casting="unsafe")
                    if self.offset:
                        y -= np.float32(self.offset)
                else:
                    np.take(lut, p.codes[b0:b0 + nb], axis=0, out=y[:nb * per].reshape(nb, per))
                if nb * per < hi - lo:
                    y[nb * per:] = lut[p.codes[b0 + nb]][:hi - lo - nb * per]
                if st is not None:
                    st.apply(np.multiply, y, lo, hi)
                if bs is not None:
                    bs.apply(np.add, y, lo, hi)
        in_parts(blocks, part)
        return torch.from_numpy(out).to(device=p.device, dtype=p.dtype)

    @abstractmethod
    def _encode(self, a: np.ndarray, lens: np.ndarray, seed: int, check: bool) -> tuple[np.ndarray, np.ndarray]:
        """(codes packed at ``bits`` (see pack), float32 scales of shape (groups,) or (groups, m)) of float32 array a;
        with ``check``, raise ValueError on NaN/Inf (``finite(scales)``: the scales see every element)."""

    @abstractmethod
    def _affine(self, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Each group's (step, base or None) from its scales."""

    def _select(self, a, k, cf, seed, check):  # pragma: no cover - compress_checked is overridden
        raise NotImplementedError

    def recompress(self, p, cs, *, seed: int = 0):
        raise ValueError(f"{self.name} cannot compress a payload further (multi-level compression needs a "
                         "sparsifier: topk, dgc, redsync, randomk)")


def by_rows(fn, g: np.ndarray, exact_combine=None) -> np.ndarray:
    """fn(g) for a (groups, L) array, one result per row, on torch.get_num_threads() threads.

    Row ranges go to the threads, each row reduced whole by one call, so the result does not
    depend on the split; for sums each range holds two rows or more (float32 np.einsum sums a lone
    row in another order than the same row among others). One long row is split into column ranges
    only when ``exact_combine`` (np.maximum, np.minimum: exact in any order) joins the parts; sums
    are never split."""
    k = min(torch.get_num_threads(), 8)
    if k <= 1 or g.size < PARALLEL_MIN:
        return fn(g)
    rows, cols = g.shape
    if exact_combine is None:               # sums: parts of two rows or more (see above)
        k = min(k, rows // 2)
        if k <= 1:
            return fn(g)
    pool = _pool(k)
    if rows >= k:
        cut = [i * rows // k for i in range(k + 1)]          # k <= rows // 2: each part >= 2 rows
        return np.concatenate(list(pool.map(lambda i: fn(g[cut[i]:cut[i + 1]]), range(k))))
    cut = [round(i * cols / k) for i in range(k + 1)]
    return exact_combine.reduce(np.stack(list(pool.map(lambda i: fn(g[:, cut[i]:cut[i + 1]]), range(k)))), axis=0)


def laid_out(a: np.ndarray, lens: np.ndarray, rows: bool | None) -> np.ndarray:
    """grouped(a, lens), or with ``rows`` given a as (groups, length) rows (True) or flat (False):
    how the whole tensor's groups were laid out, for a run of its groups (fused_encode), so the
    run's scales take the NumPy route the whole tensor's took."""
    if rows is None:
        return grouped(a, lens)
    return a.reshape(lens.shape[0], -1) if rows else a


def group_min_max(a: np.ndarray, lens: np.ndarray, rows: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-group (min, max) of a (float32), threaded where the groups allow (see by_rows); ``rows``:
    see laid_out."""
    g = laid_out(a, lens, rows)
    if g.ndim == 1:
        return group_reduce((np.minimum, np.maximum), a, lens)
    if g.shape[0] < min(torch.get_num_threads(), 8) or g.shape[1] > BLOCK:   # few long groups
        return (by_rows(lambda v: v.min(axis=1), g, np.minimum), by_rows(lambda v: v.max(axis=1), g, np.maximum))
    lo, hi = np.empty(g.shape[0], dtype=a.dtype), np.empty(g.shape[0], dtype=a.dtype)

    def part(blocks):                       # rows as by_rows reduces them, min and max in one read
        for r0, r1 in blocks:
            np.minimum.reduce(g[r0:r1], axis=1, out=lo[r0:r1])
            np.maximum.reduce(g[r0:r1], axis=1, out=hi[r0:r1])
    in_parts(group_blocks(g.shape[0], g.shape[1]), part, a.shape[0])
    return lo, hi


def group_scale(a: np.ndarray, lens: np.ndarray, kind: str, rows: bool | None = None) -> np.ndarray:
    """Per-group float64 L2 norm ('l2'), max |a| ('max') or mean |a| ('mean') of float32 a;
    ``rows``: see laid_out. With numba the float64 sums of the flat layout (group_reduce) and the
    mean's row sums (row_abs_sums) are kernels giving NumPy's bits; the float32 einsum norms of
    rows and min/max stay NumPy's."""
    g = laid_out(a, lens, rows)
    if kind == "l2":
        if g.ndim == 2 and g.shape[1] <= 1 << 16:   # float32 sums of short rows: accurate enough
            out = np.sqrt(by_rows(lambda v: np.einsum("ij,ij->i", v, v), g).astype(np.float64))
        elif g.ndim == 2:
            out = np.sqrt(np.einsum("ij,ij->i", g, g, dtype=np.float64))
        else:
            out = np.sqrt(group_reduce(np.add, a, lens, pre=np.square))
        return out
    if kind == "max":
        lo, hi = group_min_max(a, lens, g.ndim == 2)
        return np.maximum(hi.astype(np.float64), -lo.astype(np.float64))
    if kind == "mean":
        if g.ndim == 2 and quant_kernels(a) is not None:
            s = row_abs_sums(quant_kernels(a), a, g.shape[0], g.shape[1])
        elif g.ndim == 2:
            s = by_rows(lambda v: np.abs(v).sum(axis=1, dtype=np.float64), g)
        else:
            s = group_reduce(np.add, a, lens, pre=np.abs)
        return s / lens
    raise ValueError(kind)


def row_abs_sums(k, a: np.ndarray, rows: int, length: int) -> np.ndarray:
    """Each row's float64 sum of |a| (a as (rows, length)), the bits of NumPy's
    ``np.abs(g).sum(axis=1, dtype=np.float64)`` (see _qkernels.row_abs_sums), on the module's
    threads: rows split over them, or one row's buffer sums, then added in order."""
    buf, out = np.getbufsize(), np.empty(rows, dtype=np.float64)
    if rows == 1 and length > buf:
        sums = np.empty(-(-length // buf), dtype=np.float64)
        step = max(BLOCK // buf, 1) * buf

        def chunks(blocks):
            if blocks:
                k.abs_chunk_sums(a, blocks[0][0], blocks[-1][1], buf, sums)
        in_parts([(lo, min(length, lo + step)) for lo in range(0, length, step)], chunks)
        out[0] = k.ordered_sum(sums)
        return out

    def run(blocks):
        for r0, r1 in blocks:
            k.row_abs_sums(a, length, r0, r1, buf, out)
    in_parts(group_blocks(rows, length), run, a.shape[0])
    return out


def finite(scales: np.ndarray, check: bool) -> np.ndarray:
    """scales, after raising ValueError when ``check`` and one is NaN/Inf (every scale reduces its
    group's elements, so a NaN/Inf element shows in its group's scale)."""
    if check and not np.isfinite(scales).all():
        raise ValueError(NONFINITE)
    return scales


def safe_inverse(scale: np.ndarray, factor: float) -> np.ndarray:
    """factor / scale as float32, 0 where scale is 0 (an all-zero group encodes as zero codes)."""
    out = np.zeros(scale.shape, dtype=np.float64)
    np.divide(factor, scale, out=out, where=scale > 0)
    return out.astype(np.float32)


