"""Compiled (numba) kernels for the CPU hot loops of exact Top-k: the candidate scan (:func:`scan`)
and keep_top's steps on the candidates (:func:`band_pick`, :func:`drop_then`, :func:`remove_at`);
the quantizers' kernels live in compressors/_qkernels.py and are re-exported here (one module,
one import test, for :func:`compressors.arrays.kernels`).
Importing this module needs numba; callers go through :func:`compressors.arrays.kernels`, which
returns None without it (then the NumPy code runs).

Why: the NumPy scan makes five trips through every cache block (abs, max, compare, flatnonzero,
take) and cost ~3.6 passes at 10x; the kernel reads each element once. Their results are the
NumPy code's bit for bit (tests/test_topk_kernel.py): same positions in the same order, same
values, same band, same max.

How the scan stays exact without float compares: for IEEE floats with the sign bit cleared, the
integer order of the bit patterns is the float order, and every NaN lies above +Inf. So the scan
works on an integer view: ``u = bits & absmask`` is |x| (as np.abs gives it), ``max(u)`` is max|x|
(Inf is ``infbits``, NaN anything above it), and |x| >= t is ``u >= tb`` for the threshold's bits
``tb`` (see :func:`threshold_bits`). NaN is the one value where the integer and float compares
disagree, so a scan that saw one reports it and the caller reruns the NumPy code. (The one other
way they could: a process that turned on flush-to-zero, torch.set_flush_denormal(True), makes
float compares treat subnormals as 0; nothing here does.)

Serial and compiled with ``nogil``, like the NumPy code they replace: no threads of their own (the
suite runs one thread per worker process, forks and spawns workers, and numba's parallel layers
bring thread pools of their own). ``cache=True`` keeps the machine code in this package's
``__pycache__`` (numba's user cache dir when that is read-only): the first Top-k in a fresh clone
compiles for 2.5-4.3 s (per dtype; idle and loaded 2-core host), later processes load the code in
0.5-0.7 s (numba's start-up).
"""
from __future__ import annotations

import sys

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.cpython.unsafe.numbers import trailing_zeros
from numba.extending import intrinsic

if sys.byteorder != "little":   # the flag packing below reads bytes of words: little-endian only
    raise ImportError("compressors._kernels: big-endian host, the NumPy code runs")

from ._qkernels import (abs_chunk_sums, affine_encode, decode_codes, group_sums, ordered_sum,  # noqa: E402,F401
                        pcg64_fill, pcg64_state, row_abs_sums, sign_pack, sign_pack_abs_sums)  # (the quantizers' kernels)

#: Elements per block: the block and its flags stay in L1 while it is scanned twice.
BLOCK = 2048
_INT_OF = {np.dtype(np.float16): np.int16, np.dtype(np.float32): np.int32, np.dtype(np.float64): np.int64}


def supports(a: np.ndarray) -> bool:
    """Whether the kernels take this array: 1-D, of a float dtype they have an integer view for."""
    return a.ndim == 1 and a.dtype in _INT_OF


def int_view(a: np.ndarray):
    """(bits, absmask, infbits) of a float array: its bit patterns as signed integers of the same
    width, the mask that clears the sign bit, and the pattern of +Inf."""
    it = _INT_OF[a.dtype]
    return a.view(it), it(np.iinfo(it).max), np.array(np.inf, dtype=a.dtype).view(it)[()]


def threshold_bits(t, *, strict: bool, it) -> int:
    """The integer ``tb`` with ``u >= tb`` iff |x| >= t (|x| > t if strict), for every non-NaN x
    and any non-NaN threshold t of x's dtype (negative, -0.0, +Inf included)."""
    if t > 0:
        return int(np.array(t).view(it)[()]) + strict
    return 1 if strict and t == 0 else 0   # t <= 0: all of |x| >= t; |x| > 0 is u >= 1


def below_bits(t, *, it) -> int:
    """The integer ``hb`` with ``u < hb`` iff |x| < t, for non-NaN x and t."""
    return int(np.array(t).view(it)[()]) if t > 0 else 0


@intrinsic
def _store_u64(typingctx, buf, offset, value):
    """buf[offset:offset + 8] = the 8 bytes of uint64 ``value`` (little-endian, any alignment) for a
    uint8 array ``buf``: one store, which numba cannot express (a view per store costs ~100x)."""
    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        ptr = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(64).as_pointer())
        builder.store(args[2], ptr).align = 1
        return context.get_dummy_value()
    return types.void(buf, offset, value), codegen


# Flag bytes to positions, 8 at a time: a word of 8 flag bytes (each 0 or 1) times _GATHER has flag
# i as bit i of its top byte, the mask; _PACKED[mask] holds the positions (0-7) of the mask's set
# bits as bytes, lowest first, and _COUNT[mask] how many there are.
_GATHER = np.uint64(0x0102040810204080)
_PACKED = np.array([sum(p << (8 * r) for r, p in enumerate(i for i in range(8) if m >> i & 1))
                    for m in range(256)], dtype=np.uint64)
_COUNT = np.array([bin(m).count("1") for m in range(256)], dtype=np.int64)
_BYTES = np.uint64(0x0101010101010101)
_SUB = 256   # positions within a sub-block fit a byte


@njit(nogil=True, cache=True)
def scan(bits, start, absmask, tb, hb, idx, vals, band, c, nb):
    """Scan bits[start:] block by block: append each position i with u >= tb to idx and its bits
    to vals (from slot c on), and for those with u < hb their slot in idx to band (from slot nb).

    Returns (stop, c, nb, umax): it stops early, at a block boundary, when the next block might
    not fit in idx/vals or band (the caller grows them and calls again from ``stop``); umax is
    the largest u seen. Per block: one vectorised loop (max, a 0/1 flag per element), then the
    flagged positions, found 8 flags per step: if the previous block was dense (over 1/32 flagged)
    without branches (a table lookup and one 8-byte store of packed positions), else by skipping
    empty words and taking the set flags of the others one by one; then the appends, in order.
    """
    n = bits.shape[0]
    flags = np.zeros(BLOCK, np.uint8)
    words = flags.view(np.uint64)
    pos = np.zeros(_SUB + 8, np.uint8)
    umax = absmask & 0
    dense = False
    i = start
    while i < n:
        m = min(BLOCK, n - i)
        if c + m > idx.shape[0] or nb + m > band.shape[0]:
            break
        blk = bits[i:i + m]
        for j in range(m):
            u = blk[j] & absmask
            umax = max(umax, u)
            flags[j] = u >= tb
        for j in range(m, BLOCK):   # only in the last, short block: no stale flags
            flags[j] = 0
        c0 = c
        for s in range(0, m, _SUB):
            p = 0
            if dense:
                for w in range(s // 8, min(s + _SUB, m + 7) // 8):
                    mask = (words[w] * _GATHER) >> np.uint64(56)
                    _store_u64(pos, p, _PACKED[mask] + np.uint64(8 * w - s) * _BYTES)
                    p += _COUNT[mask]
            else:
                for w in range(s // 8, min(s + _SUB, m + 7) // 8):
                    word = words[w]
                    while word:
                        pos[p] = 8 * w - s + (trailing_zeros(word) >> 3)
                        p += 1
                        word &= word - np.uint64(1)
            for q in range(p):
                j = s + pos[q]
                x = blk[j]
                idx[c] = i + j
                vals[c] = x
                band[nb] = c
                nb += (x & absmask) < hb
                c += 1
        dense = c - c0 > m // 32
        i += m
    return i, c, nb, umax


@njit(nogil=True, cache=True)
def drop_then(idx, vals, drop, keep):
    """idx and vals without the entries at the positions ``drop``, order kept, followed by the
    entries at ``keep`` (each array's result is its first ``w`` slots; returns w). In place: a
    keep-flag per slot and one branch-free sweep, about a copy of the arrays, where NumPy's
    mask-and-copy cost three. Returns -1, changing nothing, unless drop is strictly ascending
    and within the arrays (as a scan's band is) and keep is within the arrays."""
    n, nd = idx.shape[0], drop.shape[0]
    for d in range(nd):
        if drop[d] >= n or drop[d] < (drop[d - 1] + 1 if d else 0):
            return -1
    for j in keep:
        if j < 0 or j >= n:
            return -1
    tail_i, tail_v = idx[keep], vals[keep]   # read before the sweep overwrites them
    start = drop[0] if nd else n
    kept = np.ones(n - start, np.uint8)
    for d in range(nd):
        kept[drop[d] - start] = 0
    w = start
    for r in range(start, n):   # w <= r: the writes never pass the reads
        idx[w] = idx[r]
        vals[w] = vals[r]
        w += kept[r - start]
    for j in range(keep.shape[0]):
        idx[w + j] = tail_i[j]
        vals[w + j] = tail_v[j]
    return w + keep.shape[0]


@njit(nogil=True, cache=True)
def remove_at(idx, vals, drop):
    """compressors.topk.remove_positions in place: idx and vals without the entries at the distinct
    positions ``drop`` (any order), the kept entries beyond the new end moving, in order, into the
    holes, in drop's order; the results are idx[:w] and vals[:w], returns w. Returns -1, changing
    nothing, if drop has a position out of range or one beyond the new end twice."""
    n, nd = idx.shape[0], drop.shape[0]
    last = n - nd
    gone = np.zeros(nd, np.uint8)   # which of the last nd slots are dropped
    for d in drop:
        if d < 0 or d >= n or (d >= last and gone[d - last]):
            return -1
        if d >= last:
            gone[d - last] = 1
    m = last
    for d in drop:
        if d < last:
            while gone[m - last]:
                m += 1
            idx[d] = idx[m]
            vals[d] = vals[m]
            m += 1
    return last


@njit(nogil=True, cache=True)
def _kth_smallest(u, j):
    """The j-th smallest (0-based) of the non-negative integers u: radix select on 16-bit digits
    from the top (2 passes over u for float32's bits, 4 for float64's)."""
    hist = np.zeros(1 << 16, np.int64)
    shift = max(u.itemsize * 8 - 17, 0)   # the sign bit is 0: 31 (63, 15) bits to resolve
    width = u.itemsize * 8 - 1 - shift
    prefix, known = 0, 0                  # the digits fixed so far, and their bits
    while True:
        digits = (1 << width) - 1
        for d in range(digits + 1):
            hist[d] = 0
        for v in u:
            if (v & known) == prefix:
                hist[(v >> shift) & digits] += 1
        d = 0
        while j >= hist[d]:
            j -= hist[d]
            d += 1
        prefix |= d << shift
        known |= digits << shift
        if shift == 0:
            return prefix
        width = min(16, shift)
        shift -= width


@njit(nogil=True, cache=True)
def band_pick(bits, band, absmask, infbits, count, top):
    """With u = |bits[band]| (sign bit cleared): the band entries at the positions that
    compressors.arrays' ``top_positions(u, count)`` (top) or ``_NumPyOps.bottom(u, count)``
    (not top) return, in their order: the ``count`` largest, ties at the count-th value to the
    lowest positions, or the smallest, ties to the highest. Returns (ok, entries); not ok, and
    nothing done, if u holds a NaN (the float and integer orders differ there) or, for the smallest,
    unless 0 < count < len(band) (the NumPy code's range)."""
    nb = band.shape[0]
    u = np.empty(nb, bits.dtype)
    umax = absmask & 0
    for b in range(nb):
        u[b] = bits[band[b]] & absmask
        umax = max(umax, u[b])
    out = np.empty(max(0, min(count, nb)), np.int64)
    if umax > infbits or (not top and not 0 < count < nb):
        return False, out
    if top and count >= nb:
        for b in range(nb):
            out[b] = band[b]
        return True, out
    if count <= 0:
        return True, out
    t = _kth_smallest(u, nb - count if top else count - 1)
    ahead, ties = 0, 0                     # entries strictly beyond t (> for top, < for bottom), at t
    for v in u:
        ahead += v > t if top else v < t
        ties += v == t
    skip = 0 if top else ties - (count - ahead)   # bottom keeps the last of the ties
    w, e = 0, 0
    for b in range(nb):
        v = u[b]
        if (v > t) if top else (v < t):
            out[w] = band[b]
            w += 1
        elif v == t:
            if skip <= e < skip + count - ahead:
                out[ahead + e - skip] = band[b]
            e += 1
    return True, out
