"""Compiled (numba) kernels for the quantizers' element loops (compressors/packed.py): the affine
encode with its dither, clip and bit packing (:func:`affine_encode`), the sign bits of EF-SignSGD
(:func:`sign_pack`) and the decode (:func:`decode_codes`). Reached through
:func:`compressors.arrays.kernels` (compressors/_kernels.py re-exports them), which returns None
without numba; the NumPy code in packed.py then runs.

Why: the NumPy encode makes six to eight trips through every cache block (shift, multiply, add
the dither, add, cast, shift, clip, cast, pack) and the decode three to five; each kernel reads an
element once and writes its code (or value) once. Their results are the NumPy code's bit for bit
(tests/test_quant_kernel.py): the same float32 operations in the same order, each rounded to
float32 (no fastmath, so no reassociation and no fused multiply-add), and the float32 -> int32
truncation of x86 (NaN and values outside the int32 range give INT32_MIN, as NumPy's cast gives
there), so even NaN/Inf inputs without check give NumPy's codes.

The per-group scales (norms, max, mean, min/max) are still NumPy's (packed.group_scale and
group_min_max): their float64 sums follow NumPy's summation order, which a kernel would have to
copy exactly. The dither is still NumPy's PCG64: the caller draws each block's 64-bit words with
``random_raw`` and hands them in; element i of the block uses 16 bits i mod 4 of word i div 4.

Serial and ``nogil``, like compressors/_kernels.py: packed.in_parts runs them on its threads.
"""
from __future__ import annotations

import numpy as np
from numba import njit

#: Elements per chunk of the kernels: codes go through a small buffer (L1) between the float loop
#: and the bit packing. A multiple of 8, so chunks start on whole bytes of codes.
CHUNK = 4096
# Sign flags to bits, 8 at a time (as compressors/_kernels.scan): a word of 8 flag bytes (0 or 1)
# times _GATHER has flag i as bit i of its top byte.
_GATHER = np.uint64(0x0102040810204080)


def _unpack_table(bits: int, dtype) -> np.ndarray:
    """byte -> its 8/bits codes as bytes of one word of ``dtype`` (code q in byte q)."""
    per = 8 // bits
    b = np.arange(256)[:, None] >> (np.arange(per) * bits)[None, :]
    return ((b & ((1 << bits) - 1)).astype(np.uint8)).view(dtype)[:, 0].copy()


_UNPACK2, _UNPACK4, _UNPACK1 = _unpack_table(2, np.uint32), _unpack_table(4, np.uint16), _unpack_table(1, np.uint64)


@njit(nogil=True, cache=True, inline="always")
def _code(y, dither, top):
    """The code of float32 y: int32(y) truncated, >> 16 if ``dither``, clipped to [0, top]. NaN
    and y outside [-2^31, 2^31) truncate to INT32_MIN on x86 (NumPy's cast there), whose code is
    0, as y = 0's: they are replaced by 0 before the cast (a select, so the loop vectorises)."""
    ok = (y >= np.float32(-2147483648.0)) & (y < np.float32(2147483648.0))
    t = np.int32(y if ok else np.float32(0.0))
    if dither:
        t = t >> 16
    return min(max(t, np.int32(0)), top)


@njit(nogil=True, cache=True)
def _pack_into(codes, k, bits, out, b0):
    """out[b0:] = codes[:k] packed at ``bits`` (each < 2^bits; 2 and 4 bits as packed.pack combines
    them inside words, so the buffer's codes from k to the next word end are zeroed first)."""
    per = 8 // bits
    nb = (k + per - 1) // per
    if per == 1:
        o = out[b0:b0 + k]
        for i in range(k):
            o[i] = codes[i]
        return
    for i in range(k, nb * per):
        codes[i] = 0
    o = out[b0:b0 + nb]
    if per == 2:
        v = codes.view(np.uint16)
        for b in range(nb):
            w = v[b]
            o[b] = np.uint8((w & np.uint16(0x000F)) | ((w >> np.uint16(4)) & np.uint16(0x00F0)))
    else:
        v = codes.view(np.uint32)
        for b in range(nb):
            w = v[b]
            w = w | (w >> np.uint32(6))
            w = w & np.uint32(0x000F000F)
            w = w | (w >> np.uint32(12))
            o[b] = np.uint8(w & np.uint32(0xFF))


@njit(nogil=True, cache=True)
def affine_encode(a, lo, hi, starts, mult, shift, raw, plus, top, bits, out):
    """Codes of a[lo:hi] packed at ``bits`` into out[lo // per : ceil(hi / per)] (per = 8 // bits;
    lo a multiple of 8): packed.affine_codes for one range. Element j of group g (starts[g] <= j
    < starts[g + 1]) is, in float32, y = (a[j] + shift[g]) * mult[g] (no shift when ``shift`` is
    None), + the dither (raw's 16-bit integer j - lo, raw a uint16 view, when given), + plus;
    t = int32(y) (truncation), >> 16 with the dither, clipped to [0, top]."""
    per = 8 // bits
    codes = np.empty(CHUNK + 8, np.uint8)
    g = np.searchsorted(starts, lo, side="right") - 1
    top32 = np.int32(top)
    c0 = lo
    while c0 < hi:
        c1 = min(c0 + CHUNK, hi)
        j = c0
        while j < c1:
            while starts[g + 1] <= j:
                g += 1
            e = min(c1, starts[g + 1])
            m = mult[g]
            x = a[j:e]            # slices and loops from 0: no negative-index checks, so they vectorise
            c = codes[j - c0:e - c0]
            if raw is not None:
                r = raw[j - lo:e - lo]
            if shift is not None:
                sh = shift[g]
                for i in range(e - j):
                    y = np.float32(np.float32(x[i] + sh) * m)
                    if raw is not None:
                        y = np.float32(y + np.float32(r[i]))
                    c[i] = np.uint8(_code(np.float32(y + plus), raw is not None, top32))
            else:
                for i in range(e - j):
                    y = np.float32(x[i] * m)
                    if raw is not None:
                        y = np.float32(y + np.float32(r[i]))
                    c[i] = np.uint8(_code(np.float32(y + plus), raw is not None, top32))
            j = e
        _pack_into(codes, c1 - c0, bits, out, c0 // per)
        c0 = c1


@njit(nogil=True, cache=True)
def sign_pack(a, lo, hi, out):
    """out[lo // 8 : ceil(hi / 8)] = the bits a[j] >= 0 of a[lo:hi] (NaN: 0), little-end first,
    the last byte zero-padded: np.packbits(a >= 0, bitorder='little') for one range (lo a
    multiple of 8)."""
    flags = np.zeros(CHUNK, np.uint8)
    words = flags.view(np.uint64)
    c0 = lo
    while c0 < hi:
        k = min(CHUNK, hi - c0)
        x = a[c0:c0 + k]
        for i in range(k):
            flags[i] = x[i] >= 0
        for i in range(k, (k + 7) // 8 * 8):
            flags[i] = 0
        o = out[c0 // 8:c0 // 8 + (k + 7) // 8]
        for b in range((k + 7) // 8):
            o[b] = np.uint8((words[b] * _GATHER) >> np.uint64(56))
        c0 += k


@njit(nogil=True, cache=True)
def decode_codes(codes, bits, offset, starts, step, base, lo, hi, out):
    """out[lo:hi] = the decoded values of the codes of elements lo..hi-1 (packed at ``bits``, lo a
    multiple of 8): in float32, (code - offset) * step[g] + base[g] (no base when ``base`` is
    None), as Quantizer.decode's NumPy code rounds it (code - offset is exact). The codes of a
    chunk are first unpacked to bytes (a table per packed byte)."""
    per = 8 // bits
    off = np.float32(offset)
    buf = np.empty(CHUNK + 8, np.uint8)
    g = np.searchsorted(starts, lo, side="right") - 1
    c0 = lo
    while c0 < hi:
        c1 = min(c0 + CHUNK, hi)
        nb, b0 = (c1 - c0 + per - 1) // per, c0 // per
        src = codes[b0:b0 + nb]
        if per == 1:
            cb = src
        else:
            if per == 2:
                w2 = buf.view(np.uint16)
                for b in range(nb):
                    w2[b] = _UNPACK4[src[b]]
            elif per == 4:
                w4 = buf.view(np.uint32)
                for b in range(nb):
                    w4[b] = _UNPACK2[src[b]]
            else:
                w8 = buf.view(np.uint64)
                for b in range(nb):
                    w8[b] = _UNPACK1[src[b]]
            cb = buf
        j = c0
        while j < c1:
            while starts[g + 1] <= j:
                g += 1
            e = min(c1, starts[g + 1])
            s = step[g]
            c = cb[j - c0:e - c0]
            y = out[j:e]
            if base is not None:
                bs = base[g]
                for i in range(e - j):
                    y[i] = np.float32(np.float32(np.float32(c[i]) - off) * s) + bs
            else:
                for i in range(e - j):
                    y[i] = np.float32(np.float32(c[i]) - off) * s
            j = e
        c0 = c1
