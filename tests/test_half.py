"""16-bit casts (compressors/half.py): exact rounding, the divide before the 16-bit sum, what a
step counts and costs on the clock, and the one-line refusals."""
from __future__ import annotations

import pytest
import torch
from conftest import compose, make_run

from compressors import build_compressor
from compressors.half import CastOverflow
from gravac.cluster.comm import SimGroup
from gravac.cluster.netmodel import NetworkModel
from gravac.cluster.opcosts import OpCosts
from gravac.config.compose import build_config
from gravac.core.check import ConfigError
from gravac.core.errors import DivergedError
from gravac.methods import StepContext, build_method

SIZES = [500, 300, 200]


def ctx(step: int) -> StepContext:
    return StepContext(step=step, epoch=0.0, lr=0.1, lr_decayed=False, compute_s=0.02, samples=32)


def test_rounding_by_hand():
    """Round to nearest even at 11 (fp16) and 8 (bf16) significant bits: 1/3 = 1.0101010101|01..b
    x 2^-2 rounds down in fp16 (1365/4096) and 1.0101010|101..b up in bf16 (171/512); 2049 is a
    tie between 2048 and 2050 in fp16 (even: 2048), 2051 between 2050 and 2052 (2052); 70000 is
    past fp16's 65504 and 137/128 x 2^16 = 70144 in bf16."""
    x = torch.tensor([1 / 3, 2049.0, 2051.0, 0.1, -1.5])
    assert build_compressor("fp16").compress(x, 1).dense().tolist() == [1365 / 4096, 2048.0, 2052.0,
                                                                        0.0999755859375, -1.5]
    bf = build_compressor("bf16").compress(torch.tensor([1 / 3, 70000.0, 257.0]), 1)
    assert bf.wire.dtype == torch.bfloat16 and bf.dense().dtype == torch.float32
    assert bf.dense().tolist() == [171 / 512, 70144.0, 256.0]          # 257: a tie, to even
    assert (bf.wire_bytes(), bf.floats, bf.nnz) == (6, 1.5, 3)


def test_divide_before_the_16_bit_sum():
    """Four workers sending 60000 in fp16: the undivided sum overflows (240000 > 65504), the sum
    of 60000 / 4 = 15000 does not, and the mean is exact; a value fp16 cannot hold is refused in
    one line naming bf16, which sends it (70144, as rounded)."""
    group = SimGroup(4, NetworkModel(alpha_s=0.0, beta_Bps=1e9))
    fp16 = build_compressor("fp16")
    big = torch.tensor([60000.0, -60000.0, 3.0])
    assert torch.isinf(torch.stack([big.half()] * 4).sum(0)[0])       # what dividing afterwards would hit
    mean, comm = group.aggregate([fp16.compress(big, 1) for _ in range(4)])
    assert mean.dtype == torch.float32 and mean.tolist() == [60000.0, -60000.0, 3.0]
    assert (comm.wire_bytes, comm.floats) == (6, 1.5)
    assert comm.messages == [group.net.allreduce(6, 4)] == [2 * 3 / 4 * 6 / 1e9]
    with pytest.raises(CastOverflow, match=r"^a gradient element of magnitude 7e\+04 exceeds fp16's largest value "
                                           r"65504: use compressor=bf16") as e:
        fp16.compress(torch.tensor([1.0, 70000.0]), 1)
    assert "\n" not in str(e.value)
    mean, _ = group.aggregate([build_compressor("bf16").compress(torch.tensor([70000.0]), 1)] * 4)
    assert mean.tolist() == [70144.0]
    with pytest.raises(ValueError, match="NaN/Inf"):
        fp16.compress(torch.tensor([1.0, float("nan")]), 1)


def test_per_worker_rounding_then_sum():
    """Two workers, fp16: 1/3 -> 1365/4096 and 0.1 -> 1638/16384, each halved exactly; their sum
    is 1774.5 x 2^-13, a tie in fp16's [1/8, 1/4) spacing 2^-13: the 16-bit sum rounds to even,
    1774 / 8192 (what fp32 would give, 0.21661376953125, is not sent)."""
    group = SimGroup(2, NetworkModel(alpha_s=0.0, beta_Bps=1e9))
    fp16 = build_compressor("fp16")
    mean, _ = group.aggregate([fp16.compress(torch.tensor([1 / 3]), 1), fp16.compress(torch.tensor([0.1]), 1)])
    assert (1365 / 4096 + 1638 / 16384) / 2 == 1774.5 / 8192
    assert mean.tolist() == [1774 / 8192]


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_static_step_counts_and_clock(name):
    """Static fp16/bf16 on 2 simulated workers: CF 2, floats M/2 = 500, 2 bytes a value, one
    all-reduce of 2000 bytes on the model; the cast's seconds come from the cost table, and with
    error feedback off the average is the mean of the rounded gradients."""
    run = make_run(method=dict(name="static"), compressor=dict(name=name))
    assert run.compressor.error_feedback is False
    group = SimGroup(2, NetworkModel(alpha_s=1e-5, beta_Bps=1e8))
    costs = OpCosts(group, cache=None, machine="test", say=lambda *_: None)
    m = build_method(run, group, SIZES, torch.device("cpu"), costs=costs)
    grads = [torch.randn(1000, generator=torch.Generator().manual_seed(r)) for r in range(2)]
    m.step(grads, ctx(0))                                             # calibrates the cast's cost
    costs.table = {k: (0.004 if ":compress(" in k else 0.001) for k in costs.table}
    res = m.step(grads, ctx(1))
    assert (res.cf, res.floats_sent, res.comm.wire_bytes) == (2.0, 500.0, 2000)
    assert res.comm.messages == [pytest.approx(2 * 1e-5 + 2 * 0.5 * 2000 / 1e8)]
    assert res.compress_model_s == pytest.approx(0.005)              # compensate (a no-op here) + cast
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[name]
    expect = (grads[0].to(dt) / 2 + grads[1].to(dt) / 2).float()
    assert torch.equal(res.grad, expect)


def test_sent_per_ddp_bucket_as_the_hook_does():
    """With the clock's DDP buckets ([2], [1, 0] in backward order) static fp16 sends one 16-bit
    all-reduce per bucket (2 bytes a value: 400 and 1600 bytes), each after its share of the cast
    (200 and 800 of the 1000 elements' 5 ms), so it overlaps backward like dense SGD; the values
    and what is counted are those of one all-reduce."""
    run = make_run(method=dict(name="static"), compressor=dict(name="fp16"))
    group = SimGroup(2, NetworkModel(alpha_s=1e-5, beta_Bps=1e8))
    costs = OpCosts(group, cache=None, machine="test", say=lambda *_: None)
    m = build_method(run, group, SIZES, torch.device("cpu"), buckets=[[2], [1, 0]], costs=costs)
    grads = [torch.randn(1000, generator=torch.Generator().manual_seed(r)) for r in range(2)]
    m.step(grads, ctx(0))
    costs.table = {k: (0.004 if ":compress(" in k else 0.001) for k in costs.table}
    res = m.step(grads, ctx(1))
    ar = [group.net.allreduce(400, 2), group.net.allreduce(1600, 2)]
    assert [(p.params, p.messages) for p in res.pieces] == [([2], [ar[0]]), ([1, 0], [ar[1]])]
    assert [p.compress_s for p in res.pieces] == [pytest.approx(0.001), pytest.approx(0.004)]
    assert res.comm.messages == ar and res.comm.modelled_s == pytest.approx(sum(ar))
    assert (res.cf, res.floats_sent, res.comm.wire_bytes) == (2.0, 500.0, 2000)
    assert torch.equal(res.grad, (grads[0].half() / 2 + grads[1].half() / 2).float())


def test_error_feedback_keeps_the_rounding_error():
    """With compressor.error_feedback=true the residual is exactly g - fp16(g) and is sent next."""
    run = make_run(method=dict(name="static"), compressor=dict(name="fp16", error_feedback=True))
    m = build_method(run, SimGroup(1, NetworkModel(0.0, 1e9)), [3], torch.device("cpu"))
    g = torch.tensor([1 / 3, 0.1, 2049.0])
    m.step([g], ctx(0))
    assert torch.equal(m.memories[0][0].residual, g - g.half().float())
    res = m.step([torch.zeros(3)], ctx(1))
    assert torch.equal(res.grad, (g - g.half().float()).half().float())


def test_overflow_stops_the_run_in_one_line():
    run = make_run(method=dict(name="static"), compressor=dict(name="fp16"))
    m = build_method(run, SimGroup(2, NetworkModel(0.0, 1e9)), [2], torch.device("cpu"))
    with pytest.raises(DivergedError, match=r"^step 0: a gradient element .* use compressor=bf16"):
        m.step([torch.tensor([1.0, 1e5]), torch.zeros(2)], ctx(0))


def test_config_refusals_are_one_line():
    """compressor.cf is fixed (2x); CF-range methods refuse the cast naming the methods that take
    it (from the registries), multi-level probes too; static, MergeComp and the fp16 arm compose."""
    with pytest.raises(ConfigError, match=r"^compressor.cf=10(\.0)? is out of range: must be left unset: a 16-bit"):
        build_config(compose(["compressor=fp16", "compressor.cf=10"]))
    for method in ("gravac", "accordion"):
        with pytest.raises(ConfigError, match=rf"^method={method} chooses compression factors, and compressor=bf16 "
                                              r"has none to choose .*use method=mergecomp or method=static") as e:
            build_config(compose([f"method={method}", "compressor=bf16"]))
        assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="^method.probe_cfs needs multi-level compression"):
        build_config(compose(["method=static", "compressor=fp16", "method.probe_cfs=[4]"]))
    assert build_config(compose(["method=mergecomp", "compressor=fp16"])).compressor.name == "fp16"
    run = build_config(compose(["arm=fp16"]))
    assert (run.method.name, run.compressor.name, run.compressor.error_feedback) == ("static", "fp16", False)
