"""The quantizers' compiled kernels (compressors/_qkernels.py) against the NumPy code they replace:
the same packed code bytes, float32 scales and decoded tensor bit for bit, for every quantizer and
option, segmented inputs, sizes off the byte and block grid, 1 and 2 threads, L-GreCo's per-layer
widths and non-finite data; and the NumPy code when numba is missing."""
from __future__ import annotations

import contextlib
import hashlib
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import compressors.arrays as carrays
import compressors.packed as packed
from compressors.efsignsgd import EFSignSGD
from compressors.packed import BLOCK, PARALLEL_MIN, pack, unpack
from compressors.qsgd import QSGD
from compressors.quant import Quant
from compressors.terngrad import TernGrad

K = pytest.importorskip("compressors._kernels", reason="numba is not installed")
Q = pytest.importorskip("compressors._qkernels", reason="numba is not installed")
ROOT = Path(__file__).resolve().parents[1]

QUANTIZERS = {
    "qsgd127-b512": lambda: QSGD(),
    "qsgd7-b100": lambda: QSGD(levels=7, bucket=100),
    "qsgd3-b1": lambda: QSGD(levels=3, bucket=1),
    "qsgd1-b0": lambda: QSGD(levels=1, bucket=0),
    "qsgd127-b0": lambda: QSGD(bucket=0),
    "terngrad-b0": lambda: TernGrad(),
    "terngrad-b333": lambda: TernGrad(bucket=333),
    "efsign-b0": lambda: EFSignSGD(),
    "efsign-b64": lambda: EFSignSGD(bucket=64),
    "efsign-b13": lambda: EFSignSGD(bucket=13),
    "quant8-b1024": lambda: Quant(),
    "quant4-b0": lambda: Quant(bits=4, bucket=0),
    "quant2-b77": lambda: Quant(bits=2, bucket=77),
    "quant8-b1024-st": lambda: Quant(rounding="stochastic"),
    "quant4-b5-st": lambda: Quant(bits=4, bucket=5, rounding="stochastic"),
    "quant2-b0-st": lambda: Quant(bits=2, bucket=0, rounding="stochastic"),
}


from test_topk_kernel import kernels_set  # noqa: E402  (one switch for both kernel suites)


@contextlib.contextmanager
def threads(k: int):
    saved = torch.get_num_threads()
    torch.set_num_threads(k)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def gradient(n: int, seed: int = 0, kind: str = "heavy") -> torch.Tensor:
    """Heavy-tailed (randn * exp(randn)), or 'edge': zeros of both signs, equal runs, subnormals,
    huge and tiny magnitudes mixed in."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.randn(n, generator=g).exp()
    if kind == "edge":
        v = torch.tensor([0.0, -0.0, 1e-40, -1e-42, 3e38, -3e38, 1e-30, 7.0, 7.0, 7.0], dtype=torch.float32)
        pick = torch.randint(0, 3 * v.shape[0], (n,), generator=g)
        mask = pick < v.shape[0]
        x[mask] = v[pick[mask]]
    return x


def segments(n: int, seed: int) -> list[int]:
    """Irregular segment sizes summing to n (empty ones included): groups of unequal lengths."""
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.integers(0, n + 1, size=min(6, n)))
    return [int(s) for s in np.diff(np.concatenate([[0], cuts, [n]]))]


def encoded(q, x, sizes, seed=7, check=True, k=None, widths=None):
    """(codes bytes, scales bytes, decoded bytes) of q on x with kernels ``k`` (None: NumPy)."""
    with kernels_set(k):
        p = q.quantize(x, sizes, seed=seed, check=check) if widths is None else \
            q.quantize_widths(x, sizes, widths, seed=seed, check=check)
        pieces = p.pieces if widths is not None and hasattr(p, "pieces") else [p]
        codes = b"".join(c.codes.tobytes() for c in pieces)
        scales = b"".join(c.scales.tobytes() for c in pieces)
        return codes, scales, p.dense().numpy().tobytes()


def assert_same(q, x, sizes, **kw):
    want = encoded(q, x, sizes, k=None, **kw)
    got = encoded(q, x, sizes, k=K, **kw)
    for name, g, w in zip(("codes", "scales", "decoded"), got, want):
        assert g == w, f"{name} differ"


SIZES = [1, 7, 8, 9, 1000, BLOCK - 3, BLOCK + 9, 200_003]


@pytest.mark.parametrize("name", list(QUANTIZERS))
@pytest.mark.parametrize("n", SIZES)
def test_same_as_numpy(name, n):
    assert_same(QUANTIZERS[name](), gradient(n, seed=n), [n])


@pytest.mark.parametrize("name", list(QUANTIZERS))
@pytest.mark.parametrize("n", [50, 9_001, 150_011])
def test_segmented_same_as_numpy(name, n):
    assert_same(QUANTIZERS[name](), gradient(n, seed=n + 1), segments(n, n))


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_edge_values_same_as_numpy(name):
    """Zeros of both signs, runs of one value, subnormals, +-3e38 (whose squares overflow: no
    check, the NumPy path's codes for an infinite norm)."""
    n = 30_011
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert_same(QUANTIZERS[name](), gradient(n, seed=3, kind="edge"), segments(n, 5), check=False)


@pytest.mark.parametrize("name", ["qsgd127-b512", "terngrad-b0", "efsign-b0", "quant8-b1024", "quant2-b77", "quant4-b5-st",
                                  "qsgd7-b100"])
@pytest.mark.parametrize("k", [1, 2])
def test_threaded_same_as_numpy(name, k):
    """Over PARALLEL_MIN: the blocks split over k threads; the bytes are the 1-thread NumPy ones."""
    n = PARALLEL_MIN + 12_345
    x = gradient(n, seed=11)
    with threads(1):
        want = encoded(QUANTIZERS[name](), x, segments(n, 2), k=None)
    with threads(k):
        got = encoded(QUANTIZERS[name](), x, segments(n, 2), k=K)
    assert got == want


@pytest.mark.parametrize("quantizer", [lambda: Quant(bucket=300), lambda: Quant(bucket=0, rounding="stochastic"),
                                       lambda: QSGD(bucket=128)])
@pytest.mark.parametrize("widths", [[8, 4, 2, 4, 8, 2, 2], [4] * 7])
def test_widths_same_as_numpy(quantizer, widths):
    n = 40_003
    sizes = segments(n, 9)
    sizes = (sizes + [0] * 7)[:7]
    sizes[-1] += n - sum(sizes)
    assert_same(quantizer(), gradient(n, seed=4), sizes, widths=widths)


@pytest.mark.parametrize("name", list(QUANTIZERS))
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_same_as_numpy(name, bad):
    """check=False: NumPy's codes whatever a NaN/Inf does to its group (x86's INT32_MIN cast);
    check=True: the same ValueError."""
    n = 5_003
    x = gradient(n, seed=6)
    x[[0, 17, 2_500, n - 1]] = bad
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # NumPy's invalid casts and overflows
        assert_same(QUANTIZERS[name](), x, segments(n, 1), check=False)
    for k in (None, K):
        with kernels_set(k), pytest.raises(ValueError):
            QUANTIZERS[name]().quantize(x, [n], seed=1, check=True)


def test_huge_inverse_scale_same_as_numpy():
    """A group whose min-max step is tiny but not 0 (1/step overflows float32: inf * 0 = NaN
    inside the encode) and values far outside the int32 range after scaling."""
    x = torch.tensor([1.0, np.nextafter(np.float32(1.0), np.float32(2.0))] * 8 + [0.0, 1e-38] * 8
                     + [-3e38, 3e38, 0.0, 1.0] * 4 + [0.0, 1e-45, -1e-45, 0.0] * 4, dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for q in (Quant(bucket=16), Quant(bits=2, bucket=16, rounding="stochastic"), QSGD(bucket=4), TernGrad(bucket=2),
                  QSGD(levels=7, bucket=4), EFSignSGD(bucket=4)):
            assert_same(q, x, [x.numel()], check=False)


def test_decode_of_received_bytes():
    """A payload rebuilt from another worker's bytes decodes to the same tensor on both paths."""
    n = 10_007
    for q in (QSGD(levels=7, bucket=100), EFSignSGD(bucket=64), Quant(bits=2, bucket=33)):
        with kernels_set(None):
            p = q.quantize(gradient(n), [n], seed=2)
            want = p.from_bytes(p.to_bytes()).dense().numpy().tobytes()
        with kernels_set(K):
            got = p.from_bytes(p.to_bytes()).dense().numpy().tobytes()
        assert got == want


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("n", [1, 3, 8, 13, 4096, 4100, 9_000])
def test_pack_order(bits, n):
    """The kernel's packing is packed.pack's (code i in bits (i mod 8/b)*b of byte i div 8/b) and
    its decode's unpacking is unpack's, straight through the kernels (identity scales)."""
    rng = np.random.default_rng(n + bits)
    top = (1 << bits) - 1
    codes = rng.integers(0, top + 1, n).astype(np.uint8)
    out = np.full(-(-n // (8 // bits)), 0xAA, np.uint8)
    starts = np.array([0, n], dtype=np.int64)
    a = codes.astype(np.float32)    # y = a * 1 + 0.5 rounds to the code
    Q.affine_encode(a, 0, n, starts, np.ones(1, np.float32), None, None, np.float32(0.5), top, bits, out)
    assert out.tobytes() == pack(codes, bits).tobytes()
    dec = np.empty(n, np.float32)
    Q.decode_codes(out, bits, 0.0, starts, np.ones(1, np.float32), None, 0, n, dec)
    assert (dec == unpack(out, bits, n)).all()


@pytest.mark.parametrize("n", [1, 7, 8, 9, 4095, 4097, 10_001])
def test_sign_pack_is_packbits(n):
    a = gradient(n, seed=n, kind="edge").numpy().copy()
    a[::7] = np.nan
    out = np.full(-(-n // 8), 0xAA, np.uint8)
    Q.sign_pack(a, 0, n, out)
    with np.errstate(invalid="ignore"):
        assert out.tobytes() == np.packbits(a >= 0, bitorder="little").tobytes()


def test_dither_draws_are_numpys():
    """The kernel path's 16-bit dither is the one the docstrings state: element i uses bits
    16(i mod 4).. of PCG64's (i div 4)-th output. With y = 0.5 for every element, the code
    (2^15 + r + 1/2) >> 16 is 1 exactly when r >= 2^15: each code shows its draw's top bit."""
    n = 3 * BLOCK + 11
    a = np.zeros(n, np.float32)
    lens = np.array([n])
    with kernels_set(K):
        got = unpack(packed.affine_codes(a, lens, np.zeros(1), 0.5, 1, seed=5, salt=9, bits=2), 2, n)
    r = np.random.PCG64(packed.dither_seed(5, 9)).random_raw(-(-n // 4)).view(np.uint16)[:n]
    assert (got == (r >> 15)).all()


def test_kernel_path_runs_compiled(monkeypatch):
    """The comparisons above compare something: with kernels set, the NumPy element loops
    (Spread) are not used by encode or decode."""
    def boom(*a, **k):
        raise AssertionError("NumPy path used")
    monkeypatch.setattr(packed.Spread, "__init__", boom)
    with kernels_set(K):
        for q in (QSGD(), TernGrad(), Quant(bits=4, rounding="stochastic")):
            q.quantize(gradient(5000), [5000], seed=1).dense()


def test_without_numba_numpy_path():
    """With numba unimportable, compressors import and every quantizer runs on the NumPy code,
    giving the kernels' bytes."""
    code = ("import sys, hashlib; sys.modules['numba'] = None\n"
            "import torch, compressors.arrays as A\n"
            "from compressors.qsgd import QSGD\nfrom compressors.quant import Quant\n"
            "from compressors.efsignsgd import EFSignSGD\nfrom compressors.terngrad import TernGrad\n"
            "g = torch.Generator().manual_seed(0)\n"
            "x = torch.randn(100_003, generator=g) * torch.randn(100_003, generator=g).exp()\n"
            "h = hashlib.sha256()\n"
            "for q in (QSGD(), TernGrad(), EFSignSGD(), Quant(bits=2, rounding='stochastic')):\n"
            "    p = q.quantize(x, [100_003], seed=1)\n"
            "    h.update(p.codes.tobytes()); h.update(p.scales.tobytes()); h.update(p.dense().numpy().tobytes())\n"
            "assert A.kernels() is None\n"
            "print(h.hexdigest())\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    g = torch.Generator().manual_seed(0)
    x = torch.randn(100_003, generator=g) * torch.randn(100_003, generator=g).exp()
    h = hashlib.sha256()
    with kernels_set(K):
        for q in (QSGD(), TernGrad(), EFSignSGD(), Quant(bits=2, rounding="stochastic")):
            p = q.quantize(x, [100_003], seed=1)
            h.update(p.codes.tobytes()), h.update(p.scales.tobytes()), h.update(p.dense().numpy().tobytes())
    assert out.stdout.strip() == h.hexdigest()


@pytest.mark.parametrize("seed", [0, 1, 2**62 - 1, 0x95D])
@pytest.mark.parametrize("advance", [0, 1, 3, 2**40 + 5])
@pytest.mark.parametrize("n", [1, 63, 64, 67, 1024, 5003])
def test_pcg64_fill_is_random_raw(seed, advance, n):
    """The kernels' PCG64 steps (four jumped-ahead quarters from 64 words on) give NumPy's
    random_raw words, and leave the state where random_raw would."""
    bg = np.random.PCG64(seed)
    bg.advance(advance)
    st = Q.pcg64_state(bg)
    w = np.empty(max(n, 7), np.uint64)
    Q.pcg64_fill(st, w, n)
    assert (w[:n] == bg.random_raw(n)).all()
    Q.pcg64_fill(st, w, 7)
    assert (w[:7] == bg.random_raw(7)).all()


GROUP_LENGTHS = list(range(1, 1101)) + [2047, 4096, 4097, 8191, 8192, 8193, 65535, 65536, 65537, 100_003, 262_147]


@pytest.mark.parametrize("pre", [np.square, np.abs])
def test_group_sums_same_as_reduceat(pre):
    """float64 sums of squares / |x| per group in reduceat's order, bit for bit, on every group
    length up to 1100 and long ones (data spanning many binades, so the order shows in the bits)."""
    rng = np.random.default_rng(1)
    lens = np.array(GROUP_LENGTHS, dtype=np.int64)
    rng.shuffle(lens)
    starts = packed.group_starts(lens)
    a = (rng.standard_normal(starts[-1]) * np.exp(3 * rng.standard_normal(starts[-1]))).astype(np.float32)
    out = np.empty(lens.shape[0])
    Q.group_sums(a, starts, 0, lens.shape[0], pre is np.square, out)
    assert out.tobytes() == np.add.reduceat(pre(a, dtype=np.float64), starts[:-1]).tobytes()


@pytest.mark.parametrize("kind", ["l2", "mean", "max"])
@pytest.mark.parametrize("k", [1, 2])
def test_group_scale_same_as_numpy(kind, k):
    n = PARALLEL_MIN + 4099
    a = gradient(n, seed=8).numpy()
    for lens in (packed.group_lengths(segments(n, 3), 1000), packed.group_lengths([n], 777)):
        with threads(1), kernels_set(None):
            want = packed.group_scale(a, lens, kind)
        with threads(k), kernels_set(K):
            got = packed.group_scale(a, lens, kind)
        assert got.tobytes() == want.tobytes()


FUSED = [lambda b: QSGD(bucket=b), lambda b: QSGD(levels=1, bucket=b), lambda b: TernGrad(bucket=b),
         lambda b: EFSignSGD(bucket=b), lambda b: Quant(bucket=b), lambda b: Quant(bits=2, bucket=b, rounding="stochastic")]


@pytest.mark.parametrize("make", FUSED)
@pytest.mark.parametrize("bucket", [8, 333, 1024, 8192, 8193])
@pytest.mark.parametrize("exact", [True, False])
def test_fused_same_as_numpy(make, bucket, exact):
    """fused_encode (bucket <= FUSE_MAX) and the scales-then-codes kernel path (8193), on groups
    laid out as rows (n a multiple of the bucket) or flat (not), over PARALLEL_MIN: the 2-thread
    kernel bytes are the 1-thread NumPy ones (runs and thread parts cut inside groups)."""
    n = (PARALLEL_MIN // bucket + 3) * bucket + (0 if exact else 5)
    x = gradient(n, seed=bucket)
    with threads(1):
        want = encoded(make(bucket), x, [n], k=None)
    with threads(2):
        got = encoded(make(bucket), x, [n], k=K)
    assert got == want


def test_fused_path_taken(monkeypatch):
    """Bucketed quantizers go through fused_encode with the kernels (no whole-tensor scales), a
    per-tensor scale or a bucket over FUSE_MAX does not."""
    calls = []
    real = packed.fused_encode
    monkeypatch.setattr(packed, "fused_encode", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    with kernels_set(K):
        for q in (QSGD(), TernGrad(bucket=64), EFSignSGD(bucket=64), Quant()):
            q.quantize(gradient(5000), [5000], seed=1)
        assert len(calls) == 4
        for q in (QSGD(bucket=0), TernGrad(), EFSignSGD(), Quant(bucket=packed.FUSE_MAX + 1)):
            q.quantize(gradient(20_000), [20_000], seed=1)
        assert len(calls) == 4


def test_fused_nonfinite_raises_after_all_parts():
    """A NaN in one thread's part: ValueError, as on the NumPy path."""
    n = PARALLEL_MIN + 100
    x = gradient(n)
    x[n - 10] = np.nan
    with threads(2), kernels_set(K), pytest.raises(ValueError):
        QSGD().quantize(x, [n], seed=1)


@pytest.mark.parametrize("shape", [(1, 1), (1, 8191), (1, 8192), (1, 8193), (1, 100_003), (1, PARALLEL_MIN + 8193),
                                   (5, 1000), (3, 8192), (4, 10_000), (2, 65_537), (40, 30_001)])
@pytest.mark.parametrize("k", [1, 2])
def test_row_abs_sums_same_as_numpy(shape, k):
    """EF-SignSGD's mean on rows (a per-tensor scale: one row): NumPy's buffered float64 row sums,
    bit for bit, on data spanning many binades (where the summation order shows)."""
    rng = np.random.default_rng(shape[1])
    a = (rng.standard_normal(shape[0] * shape[1]) * np.exp(5 * rng.standard_normal(shape[0] * shape[1]))).astype(np.float32)
    want = np.abs(a.reshape(shape)).sum(axis=1, dtype=np.float64)
    with threads(k):
        got = packed.row_abs_sums(K, a, *shape)
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("bucket", [10001, 30001])
def test_numpy_path_takes_odd_buckets_over_a_block(bucket):
    """Buckets whose blocks (multiples of lcm(bucket, 8) = 8 x bucket) exceed BLOCK + bucket:
    the NumPy path once raised 'cannot reshape' there (its buffers were BLOCK + bucket long);
    now both paths give the same bytes."""
    n = 2 * 8 * bucket + 5
    x = gradient(n, seed=bucket)
    for make in (lambda: QSGD(bucket=bucket), lambda: Quant(bits=4, bucket=bucket, rounding="stochastic")):
        with threads(1):
            want = encoded(make(), x, [n], k=None)
        with threads(2):
            got = encoded(make(), x, [n], k=K)
        assert got == want
