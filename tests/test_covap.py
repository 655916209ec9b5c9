"""COVAP (gravac/methods/covap.py, gravac/hooks/covap_hook.py): hand-computed shard layouts, the rotating
filter, floats sent, the error-feedback schedule and its conservation, the overlap timeline of its
pieces, config errors, and the DDP hook on 2 gloo ranks against a by-hand replay."""
from __future__ import annotations

import pytest
import torch
from conftest import gloo_ranks, make_run, run_cli

from gravac.cluster.comm import SimGroup
from gravac.config.compose import ConfigError
from gravac.methods import StepContext
from gravac.methods.base import METHODS, MethodEnv
from gravac.methods.covap import ef_factor, kept_shards, median_size, shard_counts
from gravac.cluster.netmodel import NetworkModel
from gravac.cluster.timeline import schedule
from plots.load import Run

NET = NetworkModel(alpha_s=1e-3, beta_Bps=1e4)
SIZES = [30, 10, 10]                 # parameters; backward reaches 2, then 1, then 0
BUCKETS = [[2], [1], [0]]            # one bucket per parameter: numels 10, 10, 30


def make(world: int = 2, sizes=SIZES, buckets=BUCKETS, costs=None, **method):
    opts = {"drop_rate": 4, "buckets": 0, **method}
    cfg = make_run(method=dict(name="covap", **opts), compressor=dict(name="none"))
    env = MethodEnv(SimGroup(world, NET), list(sizes), torch.device("cpu"), buckets=buckets, costs=costs)
    return METHODS["covap"].target(cfg.method, cfg.compressor, env)


def ctx(step: int, compute_s: float = 0.01) -> StepContext:
    return StepContext(step=step, epoch=0.0, lr=0.1, lr_decayed=False, compute_s=compute_s, samples=64)


def grads(step: int, world: int, n: int = sum(SIZES)) -> list[torch.Tensor]:
    return [torch.randn(n, generator=torch.Generator().manual_seed(31 * step + w), dtype=torch.float32)
            for w in range(world)]


def test_shard_layout_by_hand():
    # median of [50, 100, 200, 300, 1000] = 200; t = int(n/200 - 0.3) = 0, 0, 1, 0, 4
    assert median_size([100, 200, 300, 50, 1000]) == 200
    assert shard_counts([100, 200, 300, 50, 1000], 4) == [1, 1, 2, 1, 4]     # 1000: min(4 + 1, R)
    assert shard_counts([100, 200, 300, 50, 1000], 2) == [1, 1, 2, 1, 2]
    assert median_size([100, 300, 200, 400]) == 250                           # (200 + 300) // 2
    assert shard_counts([100, 300, 200, 400], 8) == [1, 1, 1, 2]              # 400/250 - 0.3 = 1.3
    assert shard_counts([10, 10, 30], 4) == [1, 1, 3]                         # 30/10 - 0.3 = 2.7 -> 3 shards


def test_kept_shards_by_hand_and_rotation():
    counts = [1, 1, 2, 1, 4]                      # global shards 0 | 1 | 2 3 | 4 | 5 6 7 8
    assert kept_shards(0, 4, counts) == [0, None, None, 0, 3]     # i = 0, 4, 8
    assert kept_shards(1, 4, counts) == [None, None, 1, None, 2]  # i = 3, 7
    for R in (1, 2, 3, 4, 5, 9, 12):
        c = shard_counts([100, 200, 300, 50, 1000], R)
        for t0 in (0, 7):
            sent = [(b, j) for it in range(t0, t0 + R) for b, j in enumerate(kept_shards(it, R, c)) if j is not None]
            assert sorted(sent) == [(b, j) for b, n in enumerate(c) for j in range(n)], (R, t0)   # each once


def test_strided_shards_positions_and_floats_by_hand():
    """Buckets: param 2 (flat 40..49), param 1 (30..39), param 0 (0..29, 3 shards); R = 4."""
    m = make(world=1)
    assert m.counts == [1, 1, 3]
    expect = [(list(range(40, 50)) + list(range(2, 30, 3)), 20),    # it 0: bucket 0 (i=0), bucket 2 shard 2 (i=4)
              (list(range(1, 30, 3)), 10),                           # it 1: bucket 2 shard 1 (i=3)
              (list(range(0, 30, 3)), 10),                           # it 2: i=2
              (list(range(30, 40)), 10)]                             # it 3: bucket 1 (i=1)
    total = 0.0
    for s, (pos, floats) in enumerate(expect):
        g = torch.arange(1, 51, dtype=torch.float32) * 10 ** s        # never zero
        m.residuals[0] = [r.zero_() for r in m.residuals[0]]
        res = m.step([g], ctx(s))
        assert sorted(res.grad.nonzero().flatten().tolist()) == sorted(pos), s
        assert torch.equal(res.grad[pos], g[pos])
        assert res.floats_sent == floats and res.comm.wire_bytes == 4 * floats and res.cf == 50 / floats
        assert res.extra["kept_shards"] == (2 if s == 0 else 1) and res.extra["shards"] == 5
        total += res.floats_sent
    assert total == 50                             # every element once in R steps: d/R per step on average


def test_payload_identical_on_every_worker_and_mean_of_compensated():
    """Every worker contributes values at the same positions (no indices): the output is the mean
    of the workers' compensated gradients there and zero elsewhere; residuals hold the rest."""
    world = 3
    m = make(world=world, drop_rate=3, ef="constant")
    seen = []
    reduce = m.group.allreduce_mean
    m.group.allreduce_mean = lambda ts, **kw: (seen.append([t.clone() for t in ts]), reduce(ts, **kw))[1]
    for s in range(6):
        before = [[r.clone() for r in w] for w in m.residuals]
        gs = grads(s, world)
        res = m.step(gs, ctx(s))
        assert len({t.numel() for t in seen[-1]}) == 1
        comp = [g.clone() for g in gs]
        for w in range(world):
            for ix, r in zip(m.index, before[w]):
                comp[w][ix] += r
        mean = torch.stack(comp).mean(0)
        kept = res.grad != 0
        torch.testing.assert_close(res.grad[kept], mean[kept])
        assert int(kept.sum()) == res.floats_sent


@pytest.mark.parametrize("rate,init,step", [(4, 0.5, 50), (9, 0.2, 100)])
def test_ef_factor_follows_the_schedule(rate, init, step):
    by_hand = {0: init, step - 1: init, step: init + 0.1, 3 * step + 1: init + 0.3,
               round((1 - init) / 0.1) * step - 1: 0.9, round((1 - init) / 0.1) * step: 1.0, 10**6: 1.0}
    for it, f in by_hand.items():
        assert ef_factor(it, init, step) == pytest.approx(f)
    m = make(world=1, drop_rate=rate)
    assert (m.ef_init, m.decay_step) == (init, step)                   # the code's defaults by R
    for it, f in by_hand.items():
        m.t = it
        assert m.step(grads(0, 1), ctx(it)).extra["ef_factor"] == pytest.approx(f)
    assert make(world=1, drop_rate=rate, ef_init=0.3, decay_step=7).factor(14) == pytest.approx(0.5)
    assert make(world=1, drop_rate=rate, ef="constant").factor(0) == 1.0


def flat(m, w: int) -> torch.Tensor:
    out = torch.zeros(m.numel, dtype=torch.float64)
    for ix, r in zip(m.index, m.residuals[w]):
        out[ix] = r.double()
    return out


@pytest.mark.parametrize("ef", ["schedule", "constant"])
def test_error_feedback_conserves_mass(ef):
    """Per step and worker: sent + residual after = g + f · residual before (f = 1: over the run,
    the sum of the averaged outputs + the mean residual = the sum of the mean gradients)."""
    world = 2
    m = make(world=world, drop_rate=3, ef=ef, decay_step=2)
    total_in, total_out = torch.zeros(m.numel, dtype=torch.float64), torch.zeros(m.numel, dtype=torch.float64)
    for s in range(9):
        before = [flat(m, w) for w in range(world)]
        gs = grads(s, world)
        res = m.step(gs, ctx(s))
        f = res.extra["ef_factor"]
        lhs = res.grad.double() + sum(flat(m, w) for w in range(world)) / world
        rhs = sum(g.double() + f * b for g, b in zip(gs, before)) / world
        assert float((lhs - rhs).abs().max()) < 1e-5, s
        total_in += torch.stack(gs).double().mean(0)
        total_out += res.grad.double()
    if ef == "constant":
        residual = sum(flat(m, w) for w in range(world)) / world
        assert float((total_out + residual - total_in).abs().max()) < 1e-5
    assert any(float(r.abs().max()) > 0 for r in m.residuals[0])       # something was held back


class FixedCosts:
    """The run's clock for compression with fixed seconds per operation (ef: 1 ms, slice: 2 ms)."""
    spent_s = 0.0

    def cost(self, key, fn, measured):
        return {"ef": 1e-3, "slice": 2e-3}[key.split(":")[1].split("(")[0]]

    def calibrates(self, key):
        return False


def test_pieces_give_the_hand_computed_overlap_step_time():
    """R = 4, step 0: buckets 0 and 2 send 10 floats each (40 bytes: 2 alpha + 40/beta = 6 ms on 2
    workers), bucket 1 only updates its residual. Forward 0.1 s, backward 0.2 s; ready at 0.05
    (param 2), 0.1 (param 1), 0.2 (param 0); optimizer 0.01 s.
    compute: b0 0.15-0.153, b1 0.203-0.204, b2 0.304-0.307 (each delays the rest of backward);
    link: b0 0.153-0.159, b2 0.307-0.313; step = 0.313 + 0.01."""
    m = make(world=2, costs=FixedCosts())
    res = m.step(grads(0, 2), ctx(0))
    assert [len(p.messages) for p in res.pieces] == [1, 0, 1]
    assert [p.compress_s for p in res.pieces] == pytest.approx([3e-3, 1e-3, 3e-3])
    assert res.comm.messages == pytest.approx([6e-3, 6e-3]) and res.compress_model_s == pytest.approx(7e-3)
    plan = schedule(0.1, 0.2, [0.2, 0.1, 0.05], 0.01, res.pieces)
    assert plan.step_s == pytest.approx(0.323)
    assert plan.exposed_comm_s == pytest.approx(0.006)


def test_auto_profiles_step_zero_dense_then_rounds_the_ccr_up():
    """Step 0 dense: three all-reduces of 40, 40, 120 bytes = 3 · 2 ms + 200/1e4 s = 26 ms of
    communication over 10 ms of compute: CCR 2.6, R = 3."""
    m = make(world=2, drop_rate="auto")
    res = m.step(grads(0, 2), ctx(0, compute_s=0.01))
    assert res.cf == 1.0 and res.floats_sent == 50 and len(res.pieces) == 3
    assert res.extra["ccr"] == pytest.approx(2.6) and res.extra["drop_rate"] == 1
    assert res.extra["ef_factor"] is None
    nxt = m.step(grads(1, 2), ctx(1))
    assert nxt.extra["drop_rate"] == 3 and m.counts == shard_counts([10, 10, 30], 3)
    assert nxt.extra["ccr"] == pytest.approx(2.6)


def test_overlap_rate_by_hand():
    """Two one-shard buckets of 100 floats, ready at 0.5 s and 1.0 s of a 1 s backward, 1 s per
    message: R = 1 exposes 1.5 s; R >= 2 sends A on one step of the rotation (0.5 s exposed) and B
    on another (1.0 s), so the mean exposed is 1.5 / R. tol 0.2 s: the smallest R with 1.5 / R <= 0.2
    is 8; with max_rate 5 none is, and the shortest mean step (1 + 1.5 / R) is R = 5."""
    from gravac.methods.covap import overlap_rate
    from gravac.cluster.profile import DeviceProfile
    prof = DeviceProfile(forward_s=0.0, backward_s=1.0, ready_s=[0.5, 1.0], optimizer_s=0.0, source="given")
    plan = dict(numels=[100, 100], groups=[[0], [1]], profile=prof, message=lambda e: e * 0.01, compute_s=1.0)
    assert overlap_rate(**plan, max_rate=64, tol=0.2) == 8
    assert overlap_rate(**plan, max_rate=5, tol=0.2) == 5
    assert overlap_rate(**plan, max_rate=64, tol=1.5) == 1                 # R = 1 is within a loose tolerance
    # without a profile every bucket waits for the end of backward: exposed = messages sent / R
    assert overlap_rate(**{**plan, "profile": None}, max_rate=64, tol=0.2) == 10


def test_overlap_profiles_step_zero_then_plans_r_on_the_timeline():
    """The test network (1 ms + 10 kB/s) and no device profile: buckets of 10, 10, 30 floats all
    wait for backward's end, so a rotation of R exposes the messages it sends / R; step 0 is dense."""
    from gravac.methods.covap import overlap_rate
    m = make(world=2, drop_rate="overlap", overlap_tol=0.5)
    res = m.step(grads(0, 2), ctx(0, compute_s=0.01))
    assert res.extra["drop_rate"] == 1 and res.extra["ccr"] == pytest.approx(2.6)
    want = overlap_rate([10, 10, 30], [[2], [1], [0]], None, lambda e: NET.allreduce(4 * e, 2), 0.01, 64, 0.5)
    assert want > 3                              # more than ceil(CCR): overlap asks for more than the ratio
    assert m.step(grads(1, 2), ctx(1)).extra["drop_rate"] == want


def test_overlap_needs_the_network_model():
    from gravac.core.errors import UserError
    cfg = make_run(method=dict(name="covap", drop_rate="overlap"), compressor=dict(name="none"))
    env = MethodEnv(SimGroup(2, NET), list(SIZES), torch.device("cpu"), buckets=BUCKETS, modelled_time=False)
    with pytest.raises(UserError, match="drop_rate=overlap plans R on the network model"):
        METHODS["covap"].target(cfg.method, cfg.compressor, env)


def test_rebuckets_the_model_into_about_ten_buckets():
    sizes = [100] * 40
    cfg = make_run(method=dict(name="covap"), compressor=dict(name="none"))
    env = MethodEnv(SimGroup(2, NET), sizes, torch.device("cpu"), buckets=[list(range(39, -1, -1))])
    m = METHODS["covap"].target(cfg.method, cfg.compressor, env)
    assert len(m.groups) == 10 and m.groups[0] == [39, 38, 37, 36]      # backward order kept
    assert m.numels == [400] * 10


def test_state_dict_round_trip():
    a = make(world=2, drop_rate="auto")
    for s in range(4):
        a.step(grads(s, 2), ctx(s))
    b = make(world=2, drop_rate="auto")
    b.load_state_dict(a.state_dict())
    ra, rb = a.step(grads(4, 2), ctx(4)), b.step(grads(4, 2), ctx(4))
    assert ra.extra == rb.extra and torch.equal(ra.grad, rb.grad)


@pytest.mark.parametrize("opts,text", [
    (dict(drop_rate=0), "method.drop_rate=0 is out of range: must be an integer >= 1, auto or overlap"),
    (dict(max_rate=0), "method.max_rate=0 is out of range"),
    (dict(drop_rate="fast"), "method.drop_rate='fast' is out of range"),
    (dict(drop_rate=2.5), "method.drop_rate=2.5 is out of range"),
    (dict(ef="always"), "method.ef='always' is not valid; choose one of: schedule, constant, off"),
    (dict(ef_init=1.5), "method.ef_init=1.5 is out of range"),
    (dict(decay_step=0), "method.decay_step=0 is out of range"),
    (dict(buckets=-1), "method.buckets=-1 is out of range")])
def test_config_errors_are_one_line(opts, text):
    with pytest.raises(ConfigError) as e:
        make_run(method=dict(name="covap", **opts), compressor=dict(name="none"))
    assert text in str(e.value) and "\n" not in str(e.value)


def test_cli_config_error_is_one_line():
    r = run_cli(["method=covap", "method.drop_rate=0", "logger.progress=false"], timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "method.drop_rate=0 is out of range" in r.stderr.strip().splitlines()[-1]


# --- the DDP hook ------------------------------------------------------------------------------------
def test_hook_errors_are_one_line():
    from test_hooks import solo_group

    from gravac.hooks.covap_hook import CovapState
    for kw, text in [(dict(drop_rate="auto"), "needs bench/run.py's clock"),
                     (dict(drop_rate="overlap"), "drop_rate='overlap' needs bench/run.py's clock"),
                     (dict(drop_rate=0), "covap.drop_rate=0 is out of range"),
                     (dict(drop_rate=2, ef="x"), "covap.ef='x' is not valid")]:
        with pytest.raises(ValueError) as e:
            CovapState(solo_group(), **kw)
        assert text in str(e.value) and "\n" not in str(e.value)


HOOK_RATE, HOOK_STEPS = 3, 9


def _hook_work(rank: int):
    """test_hooks' DDP training of its small model, with a bucket cap giving several buckets."""
    import torch.nn.parallel as par
    from test_hooks import _train

    from gravac.hooks.covap_hook import CovapState, covap_hook
    orig = par.DistributedDataParallel
    par.DistributedDataParallel = lambda model, **kw: orig(model, bucket_cap_mb=0.0003)
    try:
        return _train(rank, CovapState(None, drop_rate=HOOK_RATE, decay_step=2), covap_hook, HOOK_STEPS)
    finally:
        par.DistributedDataParallel = orig


@pytest.fixture(scope="module")
def hook_runs(tmp_path_factory):
    return gloo_ranks(_hook_work, tmp_path_factory.mktemp("covap_hook"), 2, 180)


@pytest.mark.slow
def test_ddp_hook_ranks_agree_and_match_a_replay(hook_runs):
    """Both ranks end with the same weights; every averaged bucket equals a by-hand replay of the
    filter (residuals, f, layout learnt from the previous step) on both ranks' local buckets; once
    the layout is learnt, each R consecutive steps send every element exactly once."""
    (steps0, w0), (steps1, w1) = hook_runs
    assert all(torch.equal(p, q) for p, q in zip(w0, w1))
    res: dict = {}
    layout: dict = {}
    for step, (a, b) in enumerate(zip(steps0, steps1)):
        f = ef_factor(step, 0.5, 2)
        seen = {}
        for (i, sizes, g0, out0), (_, _, g1, out1) in zip(a["buckets"], b["buckets"]):
            n = g0.numel()
            seen[i] = n
            acc = []
            for r, g in enumerate((g0, g1)):
                prev = res.get((r, i))
                prev = prev if prev is not None and prev.numel() == n else torch.zeros(n)
                acc.append(f * prev + g)
            expect = torch.zeros(n)
            known = layout.get(i)
            if known is None or known[0] != n:
                expect = (acc[0] + acc[1]) / 2
                acc = [torch.zeros(n), torch.zeros(n)]
            else:
                j = (-(known[2] + step)) % HOOK_RATE
                if j < known[1]:
                    expect[j::known[1]] = (acc[0][j::known[1]] + acc[1][j::known[1]]) / 2
                    for x in acc:
                        x[j::known[1]] = 0
            res[(0, i)], res[(1, i)] = acc
            torch.testing.assert_close(out0, expect, rtol=1e-6, atol=1e-6)
            assert torch.equal(out0, out1), (step, i)
        if {k: v[0] for k, v in layout.items()} != seen:
            order = sorted(seen)
            counts = shard_counts([seen[k] for k in order], HOOK_RATE)
            layout = {k: (seen[k], c, sum(counts[:x])) for x, (k, c) in enumerate(zip(order, counts))}
        assert a["last"] == b["last"]
    filtered = [s["last"] for s in steps0 if s["last"]["filtered"]]
    assert len(filtered) >= 2 * HOOK_RATE and len(layout) >= 3
    numel = filtered[0]["numel"]
    for k in range(0, len(filtered) - HOOK_RATE + 1):
        assert sum(x["floats_sent"] for x in filtered[k:k + HOOK_RATE]) == numel


# --- the scaling table (plots/scaling.py) ------------------------------------------------------------
class StubRun:
    """What plots/scaling.py reads of a run: per-step records, parameters, cluster size, label."""
    model, dataset, model_key, method = "m", "d", "step_model_s", "x"
    network, setting = {"bandwidth_gbps": 1.0, "enabled": True}, {"label": "X"}

    def __init__(self, workers: int, step_s: float):
        self.workers, self.summary = workers, {"parameters": 100}
        first = {"step_model_s": 9.0, "compress_model_s": 0.0, "comm_model_s": 0.0, "floats_sent": 100.0,
                 "cf": 1.0, "exposed_comm_model_s": 0.0}                       # step 0: left out
        rest = {"step_model_s": step_s, "compress_model_s": 0.01, "comm_model_s": step_s - 0.09,
                "floats_sent": 25.0, "cf": 4.0, "exposed_comm_model_s": step_s - 0.08}
        self.steps = [first] + [dict(rest) for _ in range(4)]

    def cfg(self, key, default=None):
        return default

    single_worker_s = Run.single_worker_s                 # the definition under test, not a copy

    def column(self, key):
        import numpy as np
        return np.array([s[key] for s in self.steps])

    def has_column(self, key):
        return key in self.steps[0]


def test_scaling_table_by_hand():
    """t_1 = step - compression - communication = 0.08 s; factor t_1 / t_N; CF = 100 / 25 floats."""
    from plots.scaling import scaling_table
    text, rows = scaling_table([StubRun(8, 0.12), StubRun(2, 0.10), StubRun(8, 0.14)])
    assert [(r["workers"], r["runs"]) for r in rows] == [(2, 1), (8, 2)]
    assert rows[0]["scaling_factor"] == pytest.approx(0.08 / 0.10)
    assert rows[1]["iteration_ms"] == pytest.approx(130.0) and rows[1]["scaling_factor"] == pytest.approx(0.08 / 0.13)
    assert rows[1]["cf"] == pytest.approx(4.0) and rows[1]["compress_ms"] == pytest.approx(10.0)
    assert "| m | 1 Gbit/s | X | 8 | 130.0 | 61.5 |" in text
