"""Compiled (numba) kernels for the quantizers' loops (compressors/packed.py): the affine encode with
its dither, clip and bit packing (:func:`affine_encode`), the sign bits of EF-SignSGD
(:func:`sign_pack`), the decode (:func:`decode_codes`), the float64 sums behind the scales
(:func:`group_sums`, :func:`row_abs_sums`) and NumPy's PCG64 stream (:func:`pcg64_fill`).
Reached through :func:`compressors.arrays.kernels` (compressors/_kernels.py re-exports them),
which returns None without numba; the NumPy code in packed.py then runs.

Why: the NumPy encode makes six to eight trips through every cache block (shift, multiply, add
the dither, add, cast, shift, clip, cast, pack), the decode three to five, and the float64 scale
sums write a float64 temporary twice the tensor's size; each kernel reads an element once and
writes its code (or value) once. With groups of at most packed.FUSE_MAX elements the scales and
codes of a run of groups are computed while the run is in cache (packed.fused_encode): one read
of the tensor from memory instead of two.

Bit for bit the NumPy code's results (tests/test_quant_kernel.py):
  * the same float32 operations in the same order, each rounded to float32 (no fastmath: no
    reassociation, no fused multiply-add), and x86's float32 -> int32 truncation (NaN and values
    outside the int32 range give INT32_MIN, as NumPy's cast gives there), so NaN/Inf inputs
    without check give NumPy's codes;
  * the float64 sums in NumPy's summation order: reduceat's first term plus the pairwise sum of
    the rest (loops_utils.h), and for rows summed with a dtype, buffers of np.getbufsize()
    elements each summed pairwise and added in order (checked empirically on group lengths
    1..1100 and long ones: data spanning many binades, where another order shows in the bits);
    min/max and float32 einsum norms stay NumPy's own calls (on a run of groups when fused);
  * the dither is NumPy's PCG64 stream: the caller seeds and advances np.random.PCG64 as the
    NumPy code does and hands its state in; pcg64_fill steps it as random_raw does.

Serial and ``nogil``, like compressors/_kernels.py: packed.in_parts runs them on its threads.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

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


@intrinsic
def _mulhi(typingctx, a, b):
    """The high 64 bits of the 128-bit product of uint64 a and b (one mul; numba has no uint128)."""
    def codegen(context, builder, signature, args):
        i128 = ir.IntType(128)
        p = builder.mul(builder.zext(args[0], i128), builder.zext(args[1], i128))
        return builder.trunc(builder.lshr(p, ir.Constant(i128, 64)), ir.IntType(64))
    return types.uint64(types.uint64, types.uint64), codegen


_MUL_HI, _MUL_LO = np.uint64(0x2360ED051FC65DA4), np.uint64(0x4385DF649FCCF645)   # PCG_DEFAULT_MULTIPLIER_128


@njit(nogil=True, cache=True, inline="always")
def _mul128(ah, al, bh, bl):
    """(high, low) 64-bit halves of a * b mod 2^128."""
    return ah * bl + al * bh + _mulhi(al, bl), al * bl


@njit(nogil=True, cache=True, inline="always")
def _add128(ah, al, bh, bl):
    """(high, low) of a + b mod 2^128."""
    lo = al + bl
    return ah + bh + np.uint64(lo < al), lo


@njit(nogil=True, cache=True, inline="always")
def _output(sh, sl):
    """PCG's XSL-RR output of a 128-bit state: its halves xored, rotated right by its top 6 bits."""
    x = sh ^ sl
    r = sh >> np.uint64(58)
    return (x >> r) | (x << ((np.uint64(64) - r) & np.uint64(63)))


@njit(nogil=True, cache=True)
def _jump(sh, sl, ih, il, delta):
    """The state ``delta`` steps after (sh, sl) with increment (ih, il): NumPy's
    pcg_advance_lcg_128 (multiplier and increment of delta steps by squaring, then one step)."""
    mh, ml, ph, pl = _MUL_HI, _MUL_LO, ih, il
    ah, al, bh, bl = np.uint64(0), np.uint64(1), np.uint64(0), np.uint64(0)
    while delta > 0:
        if delta & 1:
            ah, al = _mul128(ah, al, mh, ml)
            bh, bl = _mul128(bh, bl, mh, ml)
            bh, bl = _add128(bh, bl, ph, pl)
        th, tl = _add128(mh, ml, np.uint64(0), np.uint64(1))
        ph, pl = _mul128(th, tl, ph, pl)
        mh, ml = _mul128(mh, ml, mh, ml)
        delta >>= 1
    sh, sl = _mul128(ah, al, sh, sl)
    return _add128(sh, sl, bh, bl)


@njit(nogil=True, cache=True)
def pcg64_fill(rng, words, n):
    """words[:n] = the next n outputs of NumPy's PCG64 (pcg_setseq_128_xsl_rr_64, what
    ``np.random.PCG64.random_raw`` returns) from the generator state ``rng`` = (state high,
    state low, increment high, increment low) as uint64, which advances past them: each output
    steps the 128-bit LCG (state * multiplier + increment), then takes _output of the new state.
    The same words as random_raw (tests/test_quant_kernel.py), without its call per word, and
    four quarters of words at once (each from its own jumped-ahead state: the LCG's steps are a
    chain of dependent multiplies, four chains keep the multiplier busy)."""
    sh, sl, ih, il = rng[0], rng[1], rng[2], rng[3]
    q = n // 4 if n >= 64 else 0
    if q:
        s1h, s1l = _jump(sh, sl, ih, il, q)
        s2h, s2l = _jump(sh, sl, ih, il, 2 * q)
        s3h, s3l = _jump(sh, sl, ih, il, 3 * q)
        w0, w1, w2, w3 = words[0:q], words[q:2 * q], words[2 * q:3 * q], words[3 * q:4 * q]
        for i in range(q):
            sh, sl = _mul128(sh, sl, _MUL_HI, _MUL_LO)
            sh, sl = _add128(sh, sl, ih, il)
            s1h, s1l = _mul128(s1h, s1l, _MUL_HI, _MUL_LO)
            s1h, s1l = _add128(s1h, s1l, ih, il)
            s2h, s2l = _mul128(s2h, s2l, _MUL_HI, _MUL_LO)
            s2h, s2l = _add128(s2h, s2l, ih, il)
            s3h, s3l = _mul128(s3h, s3l, _MUL_HI, _MUL_LO)
            s3h, s3l = _add128(s3h, s3l, ih, il)
            w0[i] = _output(sh, sl)
            w1[i] = _output(s1h, s1l)
            w2[i] = _output(s2h, s2l)
            w3[i] = _output(s3h, s3l)
        sh, sl = s3h, s3l     # the last quarter's state: 4q steps from the start
    for i in range(4 * q, n):
        sh, sl = _mul128(sh, sl, _MUL_HI, _MUL_LO)
        sh, sl = _add128(sh, sl, ih, il)
        words[i] = _output(sh, sl)
    rng[0], rng[1] = sh, sl


def pcg64_state(bg) -> np.ndarray:
    """The (state high, state low, increment high, increment low) of np.random.PCG64 ``bg`` for
    pcg64_fill."""
    st = bg.state["state"]
    m = (1 << 64) - 1
    return np.array([st["state"] >> 64, st["state"] & m, st["inc"] >> 64, st["inc"] & m], dtype=np.uint64)


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


@njit(nogil=True, cache=True, inline="always")
def _group_run(starts, g, j, end):
    """(g, e): the group holding element j (searching forward from group g) and where its run in
    the chunk ends, at the group's end or the chunk's (``end``), whichever comes first."""
    while starts[g + 1] <= j:
        g += 1
    return g, min(end, starts[g + 1])


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
def affine_encode(a, lo, hi, starts, mult, shift, rng, plus, top, bits, out):
    """Codes of a[lo:hi] packed at ``bits`` into out[lo // per : ceil(hi / per)] (per = 8 // bits;
    lo a multiple of 8): packed.affine_codes for one range. Element j of group g (starts[g] <= j
    < starts[g + 1]) is, in float32, y = (a[j] + shift[g]) * mult[g] (no shift when ``shift`` is
    None), + the dither r_j when ``rng`` (a PCG64 state, see pcg64_fill) is given, + plus;
    t = int32(y) (truncation), >> 16 with the dither, clipped to [0, top]. r_j: 16 bits
    (j - lo) mod 4 of the generator's ((j - lo) div 4)-th next output (rng advances past them)."""
    per = 8 // bits
    codes = np.empty(CHUNK + 8, np.uint8)
    words = np.empty(CHUNK // 4 + 2, np.uint64)
    raw = words.view(np.uint16)
    g = np.searchsorted(starts, lo, side="right") - 1
    top32 = np.int32(top)
    c0 = lo
    while c0 < hi:
        c1 = min(c0 + CHUNK, hi)
        if rng is not None:
            pcg64_fill(rng, words, (c1 - c0 + 3) // 4)
        j = c0
        while j < c1:
            g, e = _group_run(starts, g, j, c1)
            m = mult[g]
            x = a[j:e]            # slices and loops from 0: no negative-index checks, so they vectorise
            c = codes[j - c0:e - c0]
            if rng is not None:
                r = raw[j - c0:e - c0]
            if shift is not None:
                sh = shift[g]
                for i in range(e - j):
                    y = np.float32(np.float32(x[i] + sh) * m)
                    if rng is not None:
                        y = np.float32(y + np.float32(r[i]))
                    c[i] = np.uint8(_code(np.float32(y + plus), rng is not None, top32))
            else:
                for i in range(e - j):
                    y = np.float32(x[i] * m)
                    if rng is not None:
                        y = np.float32(y + np.float32(r[i]))
                    c[i] = np.uint8(_code(np.float32(y + plus), rng is not None, top32))
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
            g, e = _group_run(starts, g, j, c1)
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



@njit(nogil=True, cache=True, inline="always")
def _term(x, square):
    """float64(x)^2 (``square``) or |float64(x)|: np.square / np.abs of x with dtype=float64."""
    y = np.float64(x)
    return y * y if square else abs(y)


@njit(nogil=True, cache=True)
def _pairwise(a, lo, n, square):
    """NumPy's pairwise float64 sum (loops_utils.h, PW_BLOCKSIZE 128) of _term(a[lo:lo + n]):
    under 8 terms in order from 0.0; up to 128 in 8 running sums combined as ((r0 + r1) +
    (r2 + r3)) + ((r4 + r5) + (r6 + r7)), then the rest in order; longer ones as two halves,
    the first a multiple of 8 long."""
    x = a[lo:lo + n]      # a slice indexed from 0: no negative-index checks in the loops
    if n < 8:
        res = 0.0
        for i in range(n):
            res += _term(x[i], square)
        return res
    if n <= 128:
        r0, r1, r2, r3 = _term(x[0], square), _term(x[1], square), _term(x[2], square), _term(x[3], square)
        r4, r5, r6, r7 = _term(x[4], square), _term(x[5], square), _term(x[6], square), _term(x[7], square)
        m = n - n % 8
        for b in range(1, m // 8):
            i = 8 * b
            r0 += _term(x[i], square)
            r1 += _term(x[i + 1], square)
            r2 += _term(x[i + 2], square)
            r3 += _term(x[i + 3], square)
            r4 += _term(x[i + 4], square)
            r5 += _term(x[i + 5], square)
            r6 += _term(x[i + 6], square)
            r7 += _term(x[i + 7], square)
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        for i in range(m, n):
            res += _term(x[i], square)
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise(a, lo, n2, square) + _pairwise(a, lo + n2, n - n2, square)


@njit(nogil=True, cache=True)
def group_sums(a, starts, g0, g1, square, out):
    """out[g] for the groups g0 <= g < g1 (group g is a[starts[g]:starts[g + 1]], not empty): the
    float64 sum of _term(x) as np.add.reduceat(f(a), starts) gives it, bit for bit (f: np.square
    or np.abs with dtype=float64; packed.group_reduce's NumPy code): the first term, plus the
    pairwise sum of the others."""
    for g in range(g0, g1):
        lo, n = starts[g], starts[g + 1] - starts[g]
        first = _term(a[lo], square)
        out[g] = first + _pairwise(a, lo + 1, n - 1, square) if n > 1 else first


@njit(nogil=True, cache=True)
def row_abs_sums(a, length, r0, r1, buf, out):
    """out[r] for rows r0 <= r < r1 of a seen as rows of ``length``: the float64 sum of |x| as
    ``np.abs(rows).sum(axis=1, dtype=np.float64)`` gives it, bit for bit (packed.group_scale's
    'mean' on rows): NumPy casts each row through buffers of ``buf`` elements (np.getbufsize())
    from the row's start, and adds each buffer's pairwise sum to a total that starts at 0."""
    for r in range(r0, r1):
        acc = 0.0
        for c in range(r * length, (r + 1) * length, buf):
            acc += _pairwise(a, c, min(buf, (r + 1) * length - c), False)
        out[r] = acc


@njit(nogil=True, cache=True)
def abs_chunk_sums(a, lo, hi, buf, sums):
    """sums[c // buf] = the pairwise float64 sum of |x| over a[c:c + buf], for the chunks c of
    [lo, hi) (lo a multiple of buf): one row's buffer sums, for row_abs_sums' total on one long
    row split over threads (the total then adds them in order, see ordered_sum)."""
    for c in range(lo, hi, buf):
        sums[c // buf] = _pairwise(a, c, min(buf, hi - c), False)


@njit(nogil=True, cache=True)
def ordered_sum(v):
    """0.0 + v[0] + v[1] + ... in this order (float64)."""
    acc = 0.0
    for x in v:
        acc += x
    return acc


@njit(nogil=True, cache=True)
def sign_pack_abs_sums(a, lo, hi, buf, sums, out):
    """abs_chunk_sums and sign_pack of a[lo:hi] in one read: chunk by chunk (``buf`` elements,
    in cache), its pairwise sum of |x| and its sign bits (lo a multiple of buf and of 8)."""
    for c in range(lo, hi, buf):
        e = min(c + buf, hi)
        sums[c // buf] = _pairwise(a, c, e - c, False)
        sign_pack(a, c, e, out)
