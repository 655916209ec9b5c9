"""GraVAC: the controller on scripted gain streams, and the method on a simulated cluster."""
from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings, strategies as st

from gravac.cluster.comm import SimGroup
from gravac.methods import StepContext, build_method
from gravac.methods.gravac import GraVACController
from gravac.cluster.netmodel import NetworkModel
from conftest import make_run
from gravac.core.schema import RunConfig


def ctl(**kw) -> GraVACController:
    """A controller with small test defaults (window 4, no smoothing, ω = 1%)."""
    args = dict(cf_min=10, cf_max=1000, window=4, step=2, epsilon=0.7, omega=0.01,
                policy="exponential", ewma=1.0)
    args.update(kw)
    return GraVACController(**args)


def run(c: GraVACController, gains, t_iter=lambda cf: 0.1, samples=128, start=0):
    """Feed (δ_min, δ_c) pairs; the step time of each step is t_iter(CF it sent)."""
    out, prev = [], None
    for i, g in enumerate(gains, start):
        dm, dc = g(c) if callable(g) else g
        t = t_iter(prev.cf_sent) if prev is not None else 0.0
        prev = c.step(i, dm, dc, t, samples)
        out.append(prev)
    return out


def throughput_grows(cf):
    """Step time falling with CF by more than ω per doubling: saturation never triggers."""
    return 0.05 + 1.0 / cf


# --- scaling up --------------------------------------------------------------------------------
def test_scales_up_while_gains_stay_above_epsilon():
    c = ctl()
    decs = run(c, [(0.95, 0.9)] * 20, throughput_grows)       # gap 5% > ω: cf_min stays
    assert [d.cs for d in decs[::4]] == [2, 4, 16, 100, 100]
    assert [d.cf_c for d in decs[::4]] == [20, 40, 160, 1000, 1000]
    assert all(d.level == "c" for d in decs) and all(d.cf_min == 10 for d in decs)
    assert all(d.cf_sent == d.cf_c for d in decs)


def test_cf_min_follows_candidate_when_gains_agree():
    c = ctl()
    decs = run(c, [(0.9, 0.9)] * 16, throughput_grows)        # equal gains: ω rule raises cf_min
    assert [(d.cf_min, d.cs) for d in decs[::4]] == [(10, 2), (20, 4), (80, 12.5), (1000, 1)]
    assert decs[-1].level == "min" and decs[-1].cf_sent == 1000      # no candidate above cf_max
    assert all(d.cf_min * d.cs <= 1000 for d in decs)


def test_reset_step_restarts_cs_after_raise():
    c = ctl(reset_step=True)
    decs = run(c, [(0.9, 0.9)] * 12, throughput_grows)
    assert [(d.cf_min, d.cs) for d in decs[::4]] == [(10, 2), (20, 2), (40, 2)]


def test_grow_if_accepted_holds_a_failing_candidate():
    stream = [(0.95, 0.9)] * 4 + [(0.95, 0.5)] * 8 + [(0.95, 0.9)] * 4
    always = run(ctl(), stream, throughput_grows)
    held = run(ctl(grow_if="accepted"), stream, throughput_grows)
    assert [d.cs for d in always[::4]] == [2, 4, 16, 100]
    assert [d.cs for d in held[::4]] == [2, 4, 4, 4]                  # δ_c < ε at windows 2 and 3
    assert [d.level for d in held[12:]] == ["c"] * 4
    assert [d.cs for d in run(ctl(grow_if="accepted"), stream + [(0.95, 0.9)], throughput_grows)][-1] == 16


@pytest.mark.parametrize("policy,seq", [("exponential", [2, 4, 16, 256]),
                                        ("geometric", [2, 4, 8, 16, 32, 64])])
def test_policy_sequences(policy, seq):
    c = ctl(cf_min=1.5, cf_max=1e6, policy=policy)
    decs = run(c, [(0.95, 0.9)] * (4 * len(seq)), throughput_grows)
    assert [d.cs for d in decs[::4]] == seq


def test_geometric_multiplies_by_initial_step():
    c = ctl(cf_max=1e6, policy="geometric", step=3)
    decs = run(c, [(0.95, 0.9)] * 12, throughput_grows)
    assert [d.cs for d in decs[::4]] == [3, 9, 27]


def test_window_boundaries():
    c = ctl(window=5)
    decs = run(c, [(0.95, 0.9)] * 16, throughput_grows)
    assert [i for i, d in enumerate(decs) if d.window_end] == [4, 9, 14]
    assert [d.cs for d in decs] == [2] * 5 + [4] * 5 + [16] * 5 + [100]


def test_window_counts_global_steps_after_resume():
    c = ctl(window=5)
    decs = run(c, [(0.95, 0.9)] * 3, throughput_grows, start=7)
    assert [d.window_end for d in decs] == [False, False, True]


# --- scaling down through epsilon --------------------------------------------------------------
def test_falls_back_to_cf_min_then_dense():
    c = ctl(window=1000)
    stream = [(0.9, 0.8)] * 3 + [(0.9, 0.5)] * 3 + [(0.5, 0.3)] * 3 + [(0.9, 0.8)] * 2
    levels = [d.level for d in run(c, stream)]
    assert levels == ["c"] * 3 + ["min"] * 3 + ["dense"] * 3 + ["c"] * 2
    decs = run(ctl(window=1000), [(0.5, 0.3)])
    assert (decs[0].level, decs[0].cf_sent) == ("dense", 1.0)


def test_ewma_gives_new_sample_weight_alpha():
    c = ctl(ewma=0.25, window=1000)
    decs = run(c, [(1.0, 1.0), (0.0, 0.0), (0.0, 0.0)])
    assert decs[0].delta_min == 1.0                                # first sample seeds the EWMA
    assert decs[1].delta_min == pytest.approx(0.75)
    assert decs[2].delta_min == pytest.approx(0.5625)
    assert decs[1].delta_min_raw == 0.0
    assert [d.level for d in decs] == ["c", "c", "dense"]           # smoothing delays the fall-back


def test_candidate_ewma_restarts_at_new_cf():
    c = ctl(ewma=0.5)
    decs = run(c, [(0.95, 0.9)] * 4 + [(0.95, 0.72)], throughput_grows)
    assert decs[4].cf_c == 40 and decs[4].delta_c == pytest.approx(0.72)   # not mixed with 0.9


# --- saturation -------------------------------------------------------------------------------
def test_saturation_settles_on_lower_cf():
    c = ctl()
    decs = run(c, [(0.95, 0.9)] * 20, lambda cf: 0.1)   # same time, same gain: T[20] == T[40]
    assert [d.cf_c for d in decs[::4]] == [20, 40, 20, 20, 20]
    assert c.settled and c.s.settled_cf == 20
    assert set(c.t_compression) == {20.0, 40.0}
    assert c.t_compression[20.0] == pytest.approx(128 / 0.1 * 0.9)


def test_saturation_below_cf_min_lowers_it_and_freezes():
    c = ctl()
    decs = run(c, [(0.9, 0.9)] * 16, lambda cf: 0.1)
    assert [(d.cf_min, d.cs) for d in decs[::4]] == [(10, 2), (20, 4), (20, 1), (20, 1)]
    assert c.settled and all(d.level == "min" for d in decs[8:])


def test_saturation_needs_two_within_omega():
    c = ctl()
    times = {20: 0.1, 40: 0.1 / 1.02, 160: 0.1 / 1.04}            # 2% better per step: keep going
    decs = run(c, [(0.95, 0.9)] * 12, lambda cf: times.get(cf, 0.1))
    assert [d.cf_c for d in decs[::4]] == [20, 40, 160] and not c.settled


def test_dense_is_never_a_saturation_candidate():
    c = ctl()
    run(c, [(0.5, 0.3)] * 8, lambda cf: 0.1)
    assert set(c.t_compression) == {1.0} and not c.settled


def test_t_system_uses_previous_step_time():
    c = ctl(window=1000)
    decs = run(c, [(0.95, 0.9)] * 3, lambda cf: 0.5, samples=64)
    assert decs[0].t_system is None and decs[1].t_system == pytest.approx(128)


# --- invariants ---------------------------------------------------------------------------------
gain = st.floats(0.0, 1.0, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(cf_min=st.sampled_from([1.5, 10, 20]), span=st.sampled_from([1, 3, 100, 1000]),
       policy=st.sampled_from(["exponential", "geometric"]), omega=st.sampled_from([0.0, 0.01, 0.5]),
       gains=st.lists(st.tuples(gain, gain), min_size=1, max_size=60),
       ewma=st.sampled_from([0.04, 0.5, 1.0]), reset=st.booleans(),
       grow_if=st.sampled_from(["always", "accepted"]))
def test_invariants(cf_min, span, policy, omega, gains, ewma, reset, grow_if):
    cf_max = cf_min * span
    c = ctl(cf_min=cf_min, cf_max=cf_max, window=3, policy=policy, omega=omega, ewma=ewma,
            reset_step=reset, grow_if=grow_if)
    for d in run(c, gains, lambda cf: 0.01 + 1 / cf):
        assert 1 <= d.cs and d.cf_min * d.cs <= cf_max * (1 + 1e-9) and d.cf_min >= 1
        assert d.level in ("c", "min", "dense")
        if d.level == "c":
            assert d.delta_c >= 0.7 and d.cf_sent == d.cf_c and d.cs > 1
        elif d.level == "min":
            assert d.delta_min >= 0.7 and d.cf_sent == d.cf_min
        else:
            assert d.delta_min < 0.7 and d.cf_sent == 1
    assert c.cf_min * c.cs <= cf_max * (1 + 1e-9)


def test_state_dict_round_trip():
    stream = [(0.95, 0.9)] * 6 + [(0.9, 0.9)] * 10
    a = ctl(ewma=0.3)
    run(a, stream[:7], throughput_grows)
    b = ctl(ewma=0.3)
    b.load_state_dict(a.state_dict())
    da = run(a, stream[7:], throughput_grows, start=7)
    db = run(b, stream[7:], throughput_grows, start=7)
    assert da == db


def test_rejects_bad_parameters():
    with pytest.raises(ValueError):
        ctl(policy="linear")
    with pytest.raises(ValueError):
        ctl(cf_min=100, cf_max=10)


# --- the method on a simulated cluster ------------------------------------------------------------
N, W = 1000, 2                                   # elements, workers


def gravac_cfg(granularity="flat", **method) -> RunConfig:
    m = dict(name="gravac", cf_min=10, cf_max=1000, window=1000, step=2, epsilon=0.7, omega=0.01, ewma=1.0)
    m.update(method)
    return make_run(method=m, compressor=dict(name="topk", granularity=granularity))


def make(cfg: RunConfig, sizes=(N,)):
    group = SimGroup(W, NetworkModel.from_cfg(cfg.network))
    method = build_method(cfg, group, list(sizes), torch.device("cpu"))
    ticks = iter(range(10**9))
    method.clock = lambda: next(ticks) * 1e-3          # deterministic compression times (1 ms)
    return method


def ctx(step: int) -> StepContext:
    return StepContext(step=step, epoch=step / 100, lr=0.1, lr_decayed=False, compute_s=0.01, samples=W * 32)


def spiky(big: int, seed: int) -> torch.Tensor:
    """`big` large entries over small noise: the top-`big` hold almost all of the energy."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, generator=g) * 1e-3
    x[torch.randperm(N, generator=g)[:big]] = 10 * torch.sign(torch.randn(big, generator=g))
    return x


def gaussian(seed: int) -> torch.Tensor:
    return torch.randn(N, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("make_grad,level,nnz", [
    (lambda s: spiky(20, s), "c", 50),           # 20 spikes fit in k_c = 50: δ_c ≈ 1
    (lambda s: spiky(100, s), "min", 100),        # 100 spikes: g_min keeps all, g_c half
    (gaussian, "dense", N),                       # Gaussian: top 10% hold ≈ 44% of the energy
])
def test_level_follows_gains(make_grad, level, nnz):
    m = make(gravac_cfg())
    grads = [make_grad(w) for w in range(W)]
    res = m.step([g.clone() for g in grads], ctx(0))
    assert res.extra["level"] == level
    assert res.floats_sent == nnz and res.cf == pytest.approx(N / nnz)
    sent_bytes = 4 * N if level == "dense" else nnz * 8 + 8   # values+int32 indices+count
    assert res.comm.wire_bytes == 8 * 4 + sent_bytes           # + the gains exchange (4 floats)
    for w, g in enumerate(grads):                              # residual = compensated − sent
        sent = g - m.memories[0][w].residual
        assert int((sent != 0).sum()) == nnz
    total = sum(g - m.memories[0][w].residual for w, g in enumerate(grads)) / W
    torch.testing.assert_close(res.grad, total)


def test_dense_step_leaves_zero_residual():
    m = make(gravac_cfg())
    m.step([spiky(100, w) for w in range(W)], ctx(0))            # compressed: residual non-zero
    assert any(bool(mem.residual.any()) for mem in m.memories[0])
    res = m.step([gaussian(10 + w) * 100 for w in range(W)], ctx(1))
    assert res.extra["level"] == "dense"
    assert all(not bool(mem.residual.any()) for mem in m.memories[0])
    assert len(m.memories) == 1                                   # ONE residual per worker


RECORD = {"cf_min", "cs", "cf_c", "level", "delta_min", "delta_c", "delta_min_raw", "delta_c_raw",
          "t_system", "t_compression"}


def test_record_fields_and_time_accounting():
    m = make(gravac_cfg(window=3))
    results = [m.step([spiky(20, 7 * s + w) for w in range(W)], ctx(s)) for s in range(7)]
    for r in results:
        assert RECORD <= set(r.extra)
        assert r.extra["cf_c"] == r.extra["cf_min"] * r.extra["cs"]
        assert r.compress_s == pytest.approx(1e-3)
        json.dumps(r.extra, allow_nan=False)                                       # records must serialise
    assert results[0].extra["t_system"] is None
    r0 = results[0]
    t_iter = 0.01 + r0.compress_s + r0.comm.modelled_s           # compute + compress + modelled comm
    assert results[1].extra["t_system"] == pytest.approx(W * 32 / t_iter)
    assert results[1].extra["t_compression"] == {"20": pytest.approx(W * 32 / t_iter * r0.extra["delta_c"])}
    assert [r.extra["cs"] for r in results] == [2, 2, 2, 4, 4, 4, 16]


def test_wall_time_source_uses_measured_comm():
    cfg = gravac_cfg()
    cfg.network.time_source = "wall"
    m = make(cfg)
    r0 = m.step([spiky(20, w) for w in range(W)], ctx(0))
    r1 = m.step([spiky(20, 5 + w) for w in range(W)], ctx(1))
    assert r1.extra["t_system"] == pytest.approx(W * 32 / (0.01 + r0.compress_s + r0.comm.measured_s))


def test_layerwise_multilevel():
    sizes = (600, 300, 100)
    m = make(gravac_cfg(granularity="layer"), sizes)
    res = m.step([spiky(20, w) for w in range(W)], ctx(0))
    assert res.extra["level"] in ("c", "min", "dense")
    k_min = sum(s // 10 for s in sizes)
    assert res.floats_sent <= k_min


def test_state_dict_resume_matches():
    grads = [[spiky(20 + 40 * (s % 3), 11 * s + w) for w in range(W)] for s in range(12)]
    a = make(gravac_cfg(window=4, ewma=0.5))
    for s in range(5):
        a.step([g.clone() for g in grads[s]], ctx(s))
    b = make(gravac_cfg(window=4, ewma=0.5))
    b.load_state_dict(a.state_dict())
    b.clock = a.clock
    for s in range(5, 12):
        ra = a.step([g.clone() for g in grads[s]], ctx(s))
        rb = b.step([g.clone() for g in grads[s]], ctx(s))
        assert ra.extra == rb.extra
        torch.testing.assert_close(ra.grad, rb.grad)
