"""Tests of the quantizers (compressors/packed.py, qsgd, terngrad, efsignsgd, quant): hand-computed
encodings and bytes, unbiasedness against the variance bounds, error-feedback conservation, error
bounds per code width, exact wire bytes, and the one-line config errors."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from compressors import ErrorFeedback, Layerwise, build_compressor
from compressors.efsignsgd import EFSignSGD, EFSignSGDCfg
from compressors.packed import QuantPayload, group_lengths, pack, unpack
from compressors.qsgd import QSGD, QSGDCfg
from compressors.quant import Quant, QuantCfg
from compressors.terngrad import TernGrad, TernGradCfg
from gravac.core.check import ConfigError, checked

NAMES = ["qsgd", "terngrad", "efsignsgd", "quant"]


def heavy(n: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g, dtype=torch.float64) * torch.randn(n, generator=g, dtype=torch.float64).exp()).to(dtype)


def f32_bytes(*v: float) -> list[int]:
    return list(np.asarray(v, dtype=np.float32).view(np.uint8))


def wire(p: QuantPayload) -> list[int]:
    return p.to_bytes().tolist()


# ---------------------------------------------------------------- hand-computed encodings

def test_efsignsgd_by_hand():
    x = torch.tensor([1.0, -2, 3, 0, -4, 5, -6, 7, 8])
    p = EFSignSGD().compress(x, 1)
    # mean |x| = 36 / 9 = 4; bits x >= 0: 1 0 1 1 0 1 0 1 | 1, little-end first
    assert p.codes.tolist() == [0b10101101, 0b1] and p.scales.tolist() == [4.0]
    assert wire(p) == [173, 1] + f32_bytes(4.0) and p.wire_bytes() == 6
    assert p.dense().tolist() == [4.0, -4, 4, 4, -4, 4, -4, 4, 4]
    assert p.floats == 6 / 4 and p.indices is None and p.nnz == 9


def test_terngrad_by_hand():
    # |x| / max is 0 or 1 here, so the stochastic rounding has nothing to draw: codes y + 1
    x = torch.tensor([2.0, -2, 0, 2, -2])
    p = TernGrad().compress(x, 1, seed=5)
    assert p.codes.tolist() == [2 | 0 << 2 | 1 << 4 | 2 << 6, 0] and p.scales.tolist() == [2.0]
    assert wire(p) == [146, 0] + f32_bytes(2.0) and p.wire_bytes() == 6
    assert torch.equal(p.dense(), x)


def test_qsgd_by_hand():
    # s = 5 (4-bit codes), buckets of 2: norms 5, 0, 10; levels s*x/norm are integers here
    x = torch.tensor([3.0, -4, 0, 0, 6, 8])
    p = QSGD(levels=5, bucket=2).compress(x, 1, seed=1)
    assert p.bits == 4 and p.scales.tolist() == [5.0, 0.0, 10.0]
    assert p.codes.tolist() == [8 | 1 << 4, 5 | 5 << 4, 8 | 9 << 4]      # level + s
    assert wire(p) == [24, 85, 152] + f32_bytes(5, 0, 10) and p.wire_bytes() == 3 + 12
    assert torch.equal(p.dense(), x)
    assert QSGD(levels=1).bits == 2 and QSGD(levels=7).bits == 4 and QSGD(levels=8).bits == 8


def test_quant_by_hand():
    # 2 bits, buckets of 4: [0,1,2,3] lo 0 step 1; [10]*4 lo 10 step 0; [5, 0.4, 0.6, 3] lo 0.4 ...
    x = torch.tensor([0.0, 1, 2, 3, 10, 10, 10, 10, 4])
    p = Quant(bits=2, bucket=4).compress(x, 1)
    assert p.codes.tolist() == [0 | 1 << 2 | 2 << 4 | 3 << 6, 0, 0]
    assert p.scales.tolist() == [[0.0, 1.0], [10.0, 0.0], [4.0, 0.0]]
    assert wire(p) == [228, 0, 0] + f32_bytes(0, 1, 10, 0, 4, 0) and p.wire_bytes() == 3 + 24
    assert torch.equal(p.dense(), x)
    # nearest rounding: 0.4 -> level 0, 0.6 -> level 1 (step 1 between 0 and 3)
    q = Quant(bits=2, bucket=0).compress(torch.tensor([0.0, 0.4, 0.6, 3.0]), 1)
    assert unpack(q.codes, 2, 4).tolist() == [0, 0, 1, 3]
    assert q.dense().tolist() == [0.0, 0.0, 1.0, 3.0]


def test_pack_round_trip_and_layout():
    rng = np.random.default_rng(0)
    for bits in (1, 2, 4, 8):
        for n in (1, 2, 3, 7, 8, 9, 1001):
            codes = rng.integers(0, 1 << bits, n, dtype=np.uint8)
            packed = pack(codes, bits)
            assert packed.shape[0] == math.ceil(n * bits / 8)
            assert np.array_equal(unpack(packed, bits, n), codes)
    assert pack(np.array([1, 2, 3], dtype=np.uint8), 4).tolist() == [0x21, 0x03]
    assert group_lengths([3, 0, 5], 4).tolist() == [3, 4, 1]
    assert group_lengths([3, 0, 5], 0).tolist() == [3, 5]


def test_layerwise_groups_stay_inside_layers():
    x = torch.tensor([1.0, 2, 4, 100, 100, 100, 100, 200])
    p = Layerwise(Quant(bits=2, bucket=4), [3, 5]).compress(x, 1)
    assert p.lens.tolist() == [3, 4, 1]
    assert p.scales[:, 0].tolist() == [1.0, 100.0, 200.0]
    assert torch.equal(p.dense(), x)
    f = Quant(bits=2, bucket=4).compress(x, 1)            # flat: [1,2,3,100] shares a bucket
    assert f.lens.tolist() == [4, 4] and not torch.equal(f.dense(), x)


# ---------------------------------------------------------------- wire bytes, error bounds

@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("sizes", [[1], [1000], [7, 0, 300, 4000, 2, 1692]])
def test_wire_bytes_exact_and_bytes_round_trip(name, sizes):
    n = sum(sizes)
    x = heavy(n, 3)
    comp = build_compressor(name, layer_sizes=sizes)
    inner = comp.inner
    p = comp.compress(x, 1, seed=2)
    lens = group_lengths(sizes, inner.bucket)
    per = 2 if name == "quant" else 1
    assert p.wire_bytes() == math.ceil(n * inner.bits / 8) + 4 * per * lens.shape[0]
    assert p.to_bytes().numel() == p.wire_bytes()
    q = p.from_bytes(p.to_bytes())
    assert torch.equal(q.dense(), p.dense())
    assert p.floats == p.wire_bytes() / 4


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_quant_error_bound_per_bits(bits, rounding):
    x = heavy(10000, 1)
    comp = Quant(bits=bits, bucket=256, rounding=rounding)
    p = comp.compress(x, 1, seed=4)
    err = (p.dense() - x).abs().numpy()
    step = np.repeat(p.scales[:, 1], p.lens)
    bound = step * (0.5 if rounding == "nearest" else 1.0) * (1 + 1e-4) + 1e-6 * np.abs(x.numpy())
    assert (err <= bound).all()
    assert err.max() > 0.3 * step.max() * (0.5 if rounding == "nearest" else 1.0)  # the bound is not loose


@pytest.mark.parametrize("name", ["qsgd", "terngrad"])
def test_stochastic_error_below_one_level(name):
    x = heavy(5000, 2)
    comp = build_compressor(name, **({"levels": 7, "bucket": 128} if name == "qsgd" else {}))
    p = comp.compress(x, 1, seed=9)
    level = np.repeat(p.scales / (7 if name == "qsgd" else 1), p.lens)
    assert ((p.dense() - x).abs().numpy() < level * (1 + 1e-5)).all()
    # the same seed draws the same codes; another seed others
    assert np.array_equal(comp.compress(x, 1, seed=9).codes, p.codes)
    assert not np.array_equal(comp.compress(x, 1, seed=10).codes, p.codes)
    assert comp.per_rank_seed


# ---------------------------------------------------------------- unbiasedness

def draws(comp, x, r: int) -> torch.Tensor:
    return torch.stack([comp.compress(x, 1, seed=s).dense().double() for s in range(r)])


@pytest.mark.parametrize("name,levels", [("qsgd", 1), ("qsgd", 3), ("qsgd", 127), ("terngrad", None)])
def test_unbiased_within_variance_bound(name, levels):
    """E[Q(x)] = x: each element is rounded between two levels a step Δ apart, so its variance is
    at most Δ²/4 and the mean of R draws lies within 5 Δ / (2 √R) of x (Δ: the bucket's norm / s,
    TernGrad's max). Nearest rounding on the same input leaves that band (the check can fail)."""
    x = heavy(96, 5)
    bucket = 32
    comp = QSGD(levels=levels, bucket=bucket) if name == "qsgd" else TernGrad(bucket=bucket)
    r = 1500
    d = draws(comp, x, r)
    p0 = comp.compress(x, 1, seed=0)
    delta = torch.from_numpy(np.repeat(p0.scales.astype(np.float64), p0.lens)) / (levels or 1)
    tol = 5 * delta / (2 * math.sqrt(r)) + 1e-6 * delta
    assert ((d.mean(0) - x.double()).abs() <= tol).all()
    # QSGD's Lemma 3.1 per bucket: E||Q(v) - v||² <= min(n/s², √n/s) ||v||² (TernGrad: s = 1)
    s = levels or 1
    for b in range(x.numel() // bucket):
        sl = slice(b * bucket, (b + 1) * bucket)
        v = x[sl].double()
        mse = ((d[:, sl] - v) ** 2).sum(1).mean()
        assert mse <= min(bucket / s**2, math.sqrt(bucket) / s) * float(v @ v) * 1.05
    nearest = Quant(bits=2, bucket=bucket, rounding="nearest")
    biased = draws(nearest, x, 2).mean(0) - x.double()
    step = torch.from_numpy(np.repeat(nearest.compress(x, 1).scales[:, 1].astype(np.float64), nearest.compress(x, 1).lens))
    assert ((biased.abs() > 5 * step / (2 * math.sqrt(r)))).any()


def test_quant_stochastic_is_unbiased():
    x = heavy(64, 6)
    comp = Quant(bits=2, bucket=16, rounding="stochastic")
    r = 1500
    d = draws(comp, x, r)
    step = torch.from_numpy(np.repeat(comp.compress(x, 1).scales[:, 1].astype(np.float64), comp.compress(x, 1).lens))
    assert ((d.mean(0) - x.double()).abs() <= 5 * step / (2 * math.sqrt(r)) + 1e-6).all()


# ---------------------------------------------------------------- error feedback

@pytest.mark.parametrize("layer", [False, True])
def test_efsignsgd_error_feedback_conservation(layer):
    """sent + new residual = gradient + old residual, every step; the residual stays bounded."""
    sizes = [10, 300, 5]
    n = sum(sizes)
    comp = build_compressor("efsignsgd", **({"layer_sizes": sizes} if layer else {}))
    ef = ErrorFeedback(n)
    for step in range(20):
        g = heavy(n, step)
        old = ef.residual.clone()
        c = ef.compensate(g)
        p = comp.compress(c, 1, seed=step)
        ef.update(c, p)
        assert torch.allclose(p.dense() + ef.residual, g + old, rtol=0, atol=1e-5 * float(c.abs().max()))
        assert float(ef.residual.norm()) > 0
        # every group sends ±(its mean |c|)
        m = np.repeat(p.scales, p.lens)
        assert np.allclose(p.dense().abs().numpy(), m)
    assert float(ef.residual.norm()) < 10 * float(heavy(n, 0).norm())


# ---------------------------------------------------------------- config and errors

@pytest.mark.parametrize("cls,name", [(QSGDCfg, "qsgd"), (TernGradCfg, "terngrad"), (EFSignSGDCfg, "efsignsgd"),
                                      (QuantCfg, "quant")])
def test_cf_is_fixed_by_the_code_width(cls, name):
    assert checked(cls, {"name": name}, "compressor").cf == 100.0          # unset: accepted
    with pytest.raises(ConfigError, match=r"^compressor.cf=10(\.0)? .*fixed by its code width") as e:
        checked(cls, {"name": name, "cf": 10}, "compressor")
    assert "\n" not in str(e.value)


def test_config_errors_are_one_line():
    with pytest.raises(ConfigError, match=r"^compressor.error_feedback=False .*error feedback"):
        checked(EFSignSGDCfg, {"name": "efsignsgd", "error_feedback": False}, "compressor")
    with pytest.raises(ConfigError, match=r"^compressor.bits=3 is not valid; choose one of: 8, 4, 2$"):
        checked(QuantCfg, {"name": "quant", "bits": 3}, "compressor")
    with pytest.raises(ConfigError, match=r"^compressor.levels=200 "):
        checked(QSGDCfg, {"name": "qsgd", "levels": 200}, "compressor")
    assert checked(QSGDCfg, {"name": "qsgd"}, "compressor").error_feedback is False
    assert checked(QuantCfg, {"name": "quant"}, "compressor").error_feedback is True


@pytest.mark.parametrize("name", NAMES)
def test_nan_inf_and_multilevel_refused(name):
    comp = build_compressor(name)
    for bad in (math.nan, math.inf, -math.inf):
        x = heavy(3000)
        x[2999] = bad
        with pytest.raises(ValueError, match="NaN/Inf"):
            comp.compress(x, 1)
    p = comp.compress(heavy(100), 1)
    with pytest.raises(ValueError, match="cannot compress a payload further"):
        comp.recompress(p, 10)
    with pytest.raises(ValueError, match="cannot compress a payload further"):
        build_compressor(name, layer_sizes=[50, 50]).recompress(p, 10)


@pytest.mark.parametrize("name", NAMES)
def test_dtypes_and_zeros(name):
    comp = build_compressor(name)
    for dtype in (torch.float64, torch.float16, torch.bfloat16):
        x = heavy(1000, 1, dtype)
        p = comp.compress(x, 1)
        assert p.dense().dtype == dtype and p.dense().shape == x.shape
    z = comp.compress(torch.zeros(777), 1).dense()
    assert (z == 0).all() if name != "efsignsgd" else (z.abs() == 0).all()


def test_fixed_cf_and_setting():
    q = QSGDCfg(name="qsgd")
    assert QSGD.fixed_cf(q) == pytest.approx(32 / (8 + 32 / 512))
    assert TernGrad.fixed_cf(TernGradCfg(name="terngrad")) == 16
    assert EFSignSGD.fixed_cf(EFSignSGDCfg(name="efsignsgd")) == 32
    assert Quant.fixed_cf(QuantCfg(name="quant", bits=4, bucket=1024)) == pytest.approx(32 / (4 + 64 / 1024))
    assert Quant.setting(QuantCfg(name="quant", bits=4)) == "4-bit, bucket 1024"


@pytest.mark.parametrize("name,opts", [("qsgd", {}), ("terngrad", {}), ("quant", {"bits": 4, "rounding": "stochastic"}),
                                       ("efsignsgd", {})])
def test_codes_do_not_depend_on_threads(monkeypatch, name, opts):
    """The blocked loops run in contiguous parts on several threads; each block's work and dither
    follow from its position alone, so one block, or blocks of 64 in 1, 2 or 3 parts give the same
    bytes and values (flat, and layers whose groups straddle blocks)."""
    import compressors.packed as packed
    x = heavy(5003, 8)
    out = []                                 # first one block of the whole tensor, then blocks of 64
    for comp in (build_compressor(name, **opts), build_compressor(name, layer_sizes=[1000, 3, 4000], **opts)):
        p = comp.compress(x, 1, seed=3)
        out.append((p.to_bytes(), p.dense()))
    monkeypatch.setattr(packed, "BLOCK", 64)
    monkeypatch.setattr(packed, "PARALLEL_MIN", 0)
    for threads in (1, 2, 3):
        monkeypatch.setattr(torch, "get_num_threads", lambda t=threads: t)
        for comp in (build_compressor(name, **opts), build_compressor(name, layer_sizes=[1000, 3, 4000], **opts)):
            p = comp.compress(x, 1, seed=3)
            out.append((p.to_bytes(), p.dense()))
    for i in (0, 1):
        for b, d in out[i + 2::2]:
            assert torch.equal(b, out[i][0]) and torch.equal(d, out[i][1])


@pytest.mark.parametrize("rows", [2, 3, 5, 16])
def test_row_sums_do_not_depend_on_threads(monkeypatch, rows):
    """by_rows gives each thread two rows or more for sums: float32 einsum sums a lone row in
    another order than the same row among others (at these lengths), so one-row parts (3 rows on 2
    threads cut 2 + 1) would make QSGD's norms depend on the thread count. Unreached before with
    the real PARALLEL_MIN (2^20 values in rows of <= 2^16 is >= 16 rows), now excluded by design."""
    import compressors.packed as packed
    g = heavy(rows * 10000, 4).numpy().reshape(rows, 10000)
    norms = lambda v: np.einsum("ij,ij->i", v, v)
    want = norms(g)
    monkeypatch.setattr(packed, "PARALLEL_MIN", 0)
    for threads in (2, 3, 8):
        monkeypatch.setattr(torch, "get_num_threads", lambda t=threads: t)
        assert np.array_equal(packed.by_rows(norms, g), want)
        assert np.array_equal(packed.by_rows(lambda v: v.max(axis=1), g, np.maximum), g.max(axis=1))


def test_methods_that_choose_cfs_refuse_quantizers_and_static_names_them():
    from conftest import make_run
    from gravac.methods.static import Static
    for method in ("gravac", "accordion"):
        with pytest.raises(ConfigError, match=rf"^method={method} chooses compression factors, and compressor=qsgd "
                                              r"has none to choose .*: use method=lgreco, method=mergecomp or "
                                              r"method=static with it") as e:
            make_run(method=dict(name=method), compressor=dict(name="qsgd"))
        assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"has none to choose .*: use method=mergecomp or method=static with it"):
        make_run(method=dict(name="gravac"), compressor=dict(name="terngrad"))    # L-GreCo refuses TernGrad
    with pytest.raises(ConfigError, match=r"^method.probe_cfs needs multi-level compression"):
        make_run(method=dict(name="static", probe_cfs=[20]), compressor=dict(name="terngrad"))
    run = make_run(method=dict(name="static"), compressor=dict(name="quant", bits=4))
    assert Static.label(run.method, run.compressor) == "Min-max quant 4-bit, bucket 1024"
    assert Static.cf_text(run.method, run.compressor) == "7.88x"
    assert Static.ignores(run.method, run.compressor) == ["compressor.cf"]
    topk = make_run(method=dict(name="static"), compressor=dict(name="topk", cf=10))
    assert Static.label(topk.method, topk.compressor) == "Top-k 10x" and Static.ignores(topk.method, topk.compressor) == []


@pytest.mark.parametrize("cls", [QSGD, TernGrad, EFSignSGD, Quant], ids=lambda c: c.__name__)
def test_a_bad_bucket_is_one_value_error(cls):
    """Constructed directly (library use, no config check), every quantizer refuses a bucket that is
    negative or not whole, in one line naming it."""
    for bad in (-1, 2.5):
        with pytest.raises(ValueError, match=rf"^{cls.__name__} needs an integer bucket >= 0"):
            cls(bucket=bad)
