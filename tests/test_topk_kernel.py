"""The compiled kernels (compressors/_kernels.py) against the NumPy code they replace: the same
arrays bit for bit (positions, their order, values, band, max), the same errors, and the NumPy
code when numba is missing."""
from __future__ import annotations

import contextlib
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import compressors.arrays as carrays
from compressors.arrays import NONFINITE, _above_numpy, above
from compressors.topk import band_pick, keep_top, remove_positions, topk_select, without_then

K = pytest.importorskip("compressors._kernels", reason="numba is not installed")
B = K.BLOCK
ROOT = Path(__file__).resolve().parents[1]
SIZES = [1, 7, B - 1, B, B + 1, 3 * B + 5, 50_003]


@contextlib.contextmanager
def kernels_set(k):
    """Run the block with the compiled kernels (K) or the NumPy code (None), restoring the
    setting even when the block fails (else later comparisons would be NumPy against NumPy)."""
    saved = carrays._KERNELS[:]
    carrays._KERNELS[:] = [k]
    try:
        yield
    finally:
        carrays._KERNELS[:] = saved


def gradient(n: int, kind: str, dtype, seed: int = 0) -> np.ndarray:
    """heavy-tailed, normal, or tie-heavy (integers -3..3: most magnitudes shared) data."""
    g = torch.Generator().manual_seed(seed)
    if kind == "ties":
        x = torch.randint(-3, 4, (n,), generator=g).double()
    else:
        x = torch.randn(n, generator=g, dtype=torch.float64)
        if kind == "heavy":
            x *= torch.randn(n, generator=g, dtype=torch.float64).exp()
    return x.numpy().astype(dtype)


def bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def assert_same_scan(got, want):
    assert bits(got.idx) == bits(want.idx) and got.idx.dtype == want.idx.dtype == np.int64
    assert bits(got.vals) == bits(want.vals) and got.vals.dtype == want.vals.dtype
    assert (got.band is None) == (want.band is None)
    if want.band is not None:
        assert bits(got.band) == bits(want.band) and got.band.dtype == want.band.dtype
    assert got.absmax == want.absmax or (math.isnan(got.absmax) and math.isnan(want.absmax))


def thresholds(a: np.ndarray) -> list[float]:
    """Edge thresholds and ones equal to magnitudes present in a (ties at the threshold)."""
    m = np.sort(np.abs(a.astype(np.float64)))
    return [0.0, -0.0, -1.0, math.inf, 1e-3, 1e30, float(m[len(m) // 2]), float(m[len(m) * 9 // 10]), float(m[-1])]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("kind", ["heavy", "normal", "ties"])
@pytest.mark.parametrize("n", SIZES)
def test_scan_same_as_numpy(dtype, kind, n, monkeypatch):
    monkeypatch.setattr(carrays, "CHUNK", 1024)   # NumPy path: several blocks; capacity from 64 on: growth
    a = gradient(n, kind, dtype, seed=n)
    m = np.sort(np.abs(a.astype(np.float64)))
    his = [None, 0.0, math.inf, float(m[len(m) * 19 // 20]), 2.0]
    with np.errstate(over="ignore"):
        for thr in thresholds(a):
            for hi in his:
                for strict in (False, True):
                    for expect in (0, n):
                        got = above(a, thr, strict=strict, hi=hi, expect=expect)
                        want = _above_numpy(a, thr, strict, False, hi, expect)
                        assert_same_scan(got, want)


def test_scan_strided_same_as_numpy():
    """A strided view (a layer's slice of a flat buffer need not be contiguous)."""
    a = gradient(4 * B + 7, "heavy", np.float32)[::3]
    for thr, hi in ((0.5, 1.0), (2.0, None)):
        assert_same_scan(above(a, thr, hi=hi), _above_numpy(a, thr, False, False, hi, 0))


def test_scan_runs_compiled(monkeypatch):
    """The comparisons above compare two implementations: above() does reach the kernel."""
    calls = []
    monkeypatch.setattr(carrays, "_above_compiled", lambda *args: calls.append(1))
    above(gradient(100, "heavy", np.float32), 1.0)
    assert calls


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("at", [0, B - 1, B, 3 * B + 4])
def test_scan_nonfinite(dtype, bad, at, monkeypatch):
    """NaN/Inf: check raises as before; without check, the same arrays (a NaN is never selected)."""
    a = gradient(3 * B + 5, "heavy", dtype)
    a[at] = bad
    a[at // 2] = bad if math.isnan(bad) else -bad
    for thr in (0.0, 1.0, math.inf):
        for kernels in ([K], [None]):
            monkeypatch.setattr(carrays, "_KERNELS", kernels)
            for hi in (None, 2.0):
                with pytest.raises(ValueError, match="NaN/Inf"):
                    above(a, thr, check=True, hi=hi)
        monkeypatch.setattr(carrays, "_KERNELS", [K])
        for strict in (False, True):
            assert_same_scan(above(a, thr, strict=strict, hi=3.0), _above_numpy(a, thr, strict, False, 3.0, 0))
    assert NONFINITE.startswith("gradient contains NaN/Inf")


def test_scan_abs_sum_stays_numpy():
    """abs_sum keeps NumPy's block-by-block float64 sum (the kernel would round differently)."""
    a = gradient(5 * B + 3, "heavy", np.float32)
    got = above(a, 1.0, abs_sum=True, strict=True)
    want = _above_numpy(a, 1.0, True, True, None, 0)
    assert_same_scan(got, want)
    assert got.abssum == want.abssum


def topk_both(a: np.ndarray, k: int, **kw):
    new = topk_select(a.copy(), k, **kw)
    with kernels_set(None):
        old = topk_select(a.copy(), k, **kw)
    return new, old


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["heavy", "normal", "ties"])
@pytest.mark.parametrize("n", [3 * B + 5, 70_001])
def test_topk_same_as_numpy(dtype, kind, n):
    """Exact Top-k end to end (scan, band, keep_top with both of its branches): same positions in
    the same order, same values, over seeds that land the k-th magnitude on both halves of the band."""
    a = gradient(n, kind, dtype, seed=n)
    for cf in (2, 10, 100, 1000):
        for seed in range(4):
            (ni, nv), (oi, ov) = topk_both(a, max(1, n // cf), seed=seed, exact_below=0, sample_size=1024)
            assert bits(ni) == bits(oi) and bits(nv) == bits(ov), (cf, seed)


def test_topk_reaches_both_keep_top_branches(monkeypatch):
    """The seeds of test_topk_same_as_numpy cover both ways keep_top ends (few or most of the band
    kept), so both compiled paths were compared."""
    import compressors.topk as ctopk
    seen = set()
    for name in ("without_then", "remove_positions"):
        real = getattr(ctopk, name)
        monkeypatch.setattr(ctopk, name, lambda *a, real=real, name=name: seen.add(name) or real(*a))
    a = gradient(70_001, "normal", np.float32, seed=70_001)
    for seed in range(4):
        topk_select(a.copy(), 7000, seed=seed, exact_below=0, sample_size=1024)
    assert seen == {"without_then", "remove_positions"}


def test_topk_nonfinite_raises():
    a = gradient(70_001, "heavy", np.float32)
    a[12_345] = np.nan
    with pytest.raises(ValueError):
        topk_select(a, 7000, check=True, exact_below=0)
    a[12_345] = np.inf
    with pytest.raises(ValueError):
        topk_select(a, 7000, check=True, exact_below=0)


def test_without_then_same_as_outside_then():
    """drop_then (kernel) against outside_then (NumPy): band ascending, unsorted (falls back), empty."""
    rng = np.random.default_rng(0)
    c = 10_000
    for trial in range(20):
        nb = int(rng.integers(0, c))
        band = np.sort(rng.choice(c, nb, replace=False)).astype(np.int64)
        keep = band[rng.permutation(nb)[:int(rng.integers(0, nb + 1))]]
        if trial % 5 == 4:
            band = band[::-1].copy()
        idx, vals = rng.permutation(3 * c)[:c].astype(np.int64), rng.standard_normal(c).astype(np.float32)
        with kernels_set(None):
            want = without_then(idx.copy(), vals.copy(), band, keep)
        with kernels_set(K):
            got = without_then(idx.copy(), vals.copy(), band, keep)
        assert bits(got[0]) == bits(want[0]) and bits(got[1]) == bits(want[1]), trial


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("kind", ["heavy", "ties", "zeros"])
def test_band_pick_same_as_numpy(dtype, kind, monkeypatch):
    """The band's count largest (ties to the lowest positions) or smallest (ties to the highest),
    kernel (radix select) against NumPy (partition), in order, for every count of small bands."""
    rng = np.random.default_rng(3)
    vals = gradient(5000, "ties" if kind == "ties" else "heavy", dtype, seed=7)
    if kind == "zeros":
        vals[rng.random(5000) < 0.6] = 0
        vals[::7] = -0.0
    bands = [np.arange(5000, dtype=np.int64), np.sort(rng.choice(5000, 300, replace=False)),
             rng.permutation(5000)[:40], np.array([17], np.int64)]
    for band in bands:
        nb = band.shape[0]
        counts = range(-1, nb + 2) if nb <= 40 else [0, 1, 2, nb // 3, nb // 2, nb - 1, nb, nb + 5]
        for top in (True, False):
            for count in counts:
                if not top and not 0 < count < nb:
                    continue   # the NumPy code's range for the smallest
                monkeypatch.setattr(carrays, "_KERNELS", [K])
                got = band_pick(vals, band, count, top=top)
                monkeypatch.setattr(carrays, "_KERNELS", [None])
                want = band_pick(vals, band, count, top=top)
                assert bits(got) == bits(want) and got.dtype == want.dtype, (nb, top, count)


def test_band_pick_nan_falls_back():
    vals = gradient(1000, "heavy", np.float32)
    vals[10] = np.nan
    ok, _ = K.band_pick(vals.view(np.int32), np.arange(1000, dtype=np.int64), np.int32(0x7FFFFFFF),
                        np.int32(0x7F800000), 10, True)
    assert not ok


def test_remove_positions_same_as_numpy(monkeypatch):
    """remove_at (kernel) against remove_positions' NumPy code: drops in any order, head and tail."""
    rng = np.random.default_rng(5)
    c = 3000
    for trial in range(30):
        nd = int(rng.integers(0, c + 1))
        drop = rng.choice(c, nd, replace=False).astype(np.int64)
        if trial % 3 == 0:
            drop.sort()
        idx, vals = rng.permutation(2 * c)[:c].astype(np.int64), rng.standard_normal(c).astype(np.float32)
        monkeypatch.setattr(carrays, "_KERNELS", [K])
        got = remove_positions(idx.copy(), vals.copy(), drop)
        monkeypatch.setattr(carrays, "_KERNELS", [None])
        want = remove_positions(idx.copy(), vals.copy(), drop)
        assert bits(got[0]) == bits(want[0]) and bits(got[1]) == bits(want[1]), trial
    idx, vals = np.arange(10, dtype=np.int64), np.arange(10, dtype=np.int32)
    for drop in ([9, 9], [3, 10], [-1]):
        assert K.remove_at(idx, vals, np.array(drop, np.int64)) == -1
    assert np.array_equal(idx, np.arange(10))


def test_drop_then_rejects_bad_positions():
    idx, vals = np.arange(10, dtype=np.int64), np.arange(10, dtype=np.int32)
    for drop, keep in (([3, 3], [3]), ([5, 2], [2]), ([2, 10], [2]), ([-1, 2], [2]), ([2, 5], [11])):
        assert K.drop_then(idx, vals, np.array(drop, np.int64), np.array(keep, np.int64)) == -1
    assert np.array_equal(idx, np.arange(10))
    assert K.drop_then(idx, vals, np.array([1, 4], np.int64), np.array([4], np.int64)) == 9
    assert idx[:9].tolist() == [0, 2, 3, 5, 6, 7, 8, 9, 4]


def test_keep_top_unsorted_band_falls_back():
    """keep_top with a band in any order (not a scan's) still gives the NumPy result."""
    rng = np.random.default_rng(1)
    vals = rng.standard_normal(1000).astype(np.float32)
    order = np.argsort(-np.abs(vals), kind="stable")
    band = order[900:].copy()   # the 100 smallest may be dropped, in decreasing order of magnitude
    got = keep_top(np.arange(1000, dtype=np.int64), vals.copy(), 910, band)
    with kernels_set(None):
        want = keep_top(np.arange(1000, dtype=np.int64), vals.copy(), 910, band)
    assert bits(got[0]) == bits(want[0]) and bits(got[1]) == bits(want[1])


def test_without_numba_numpy_path():
    """With numba unimportable, compressors import and Top-k runs on the NumPy code."""
    code = ("import sys; sys.modules['numba'] = None\n"
            "import numpy as np, compressors.arrays as A\n"
            "from compressors.topk import topk_select\n"
            "a = np.random.default_rng(0).standard_normal(100_000).astype(np.float32)\n"
            "i, v = topk_select(a, 1000, exact_below=0)\n"
            "assert A.kernels() is None and len(i) == 1000\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
