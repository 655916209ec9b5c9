"""Both compression-gain definitions against hand-computed cases, and their use by the methods."""
from __future__ import annotations

import math

import pytest
import torch

from compressors import Payload
from conftest import failure, make_run
from gravac.cluster.comm import SimGroup
from gravac.methods.gains import CodeGain, SlidingEWMA, layer_norm_sum, payload_layer_norm_sum, segment_bounds
from gravac.methods import StepContext, build_method
from gravac.cluster.netmodel import NetworkModel

BOUNDS = segment_bounds([2, 3])                  # layers [0, 2) and [2, 5)


def test_layer_norm_sum_is_a_sum_of_unsquared_norms():
    x = torch.tensor([3.0, 4.0, 1.0, 2.0, 2.0])  # ||(3,4)|| = 5, ||(1,2,2)|| = 3
    assert layer_norm_sum(x, BOUNDS) == pytest.approx(8.0)
    p = Payload(torch.tensor([4.0, 2.0, 2.0]), torch.tensor([1, 3, 4]), 5)   # layer 0: (4) -> 4; layer 1: (2,2)
    assert payload_layer_norm_sum(p, BOUNDS) == pytest.approx(4 + math.sqrt(8))
    assert payload_layer_norm_sum(Payload(x.clone(), None, 5), BOUNDS) == pytest.approx(8.0)


def test_sliding_ewma_matches_pandas_adjust_true_over_the_window():
    s = SlidingEWMA(window=3, alpha=0.5)
    assert [s.update(v) for v in (1.0, 2.0)] == [0.0, 0.0]      # 0 until the list is full
    # weights (1-a)^i, newest first: 4*1 + 2*0.5 + 1*0.25 over 1.75
    assert s.update(4.0) == pytest.approx((4 + 1 + 0.25) / 1.75)
    # the oldest sample (1.0) left the window: 8*1 + 4*0.5 + 2*0.25 over 1.75
    assert s.update(8.0) == pytest.approx((8 + 2 + 0.5) / 1.75)


def test_code_gain_smooths_numerator_and_denominator_apart():
    g = CodeGain(window=2, alpha=1.0)            # alpha 1: the newest sample only
    assert g.update(3.0, 2.0) == 0.0             # window not full: 0 (the code would divide by 0)
    assert g.update(6.0, 4.0) == pytest.approx(1.5)    # can exceed 1 (residual in the numerator)
    h = CodeGain(window=2, alpha=0.5)
    h.update(1.0, 10.0)
    assert h.update(3.0, 10.0) == pytest.approx(((3 + 0.5) / 1.5) / 10)


W, N = 2, 400


def _ctx(step):
    return StepContext(step=step, epoch=0.0, lr=0.1, lr_decayed=False, compute_s=0.01, samples=W * 32)


def test_static_records_both_gains_and_probe_cfs_by_hand():
    run = make_run(method=dict(name="static", probe_cfs=[20, 40], gain_window=1, gain_alpha=1.0),
                   compressor=dict(name="topk", cf=10, granularity="flat"))
    m = build_method(run, SimGroup(W, NetworkModel.from_cfg(run.network)), [100, 300], torch.device("cpu"))
    grads = [torch.linspace(-1, 1, N) * (w + 1) for w in range(W)]
    rec = m.step([g.clone() for g in grads], _ctx(0)).extra
    top = lambda g, k: g[g.abs().argsort(descending=True)[:k]]    # noqa: E731  (no residual at step 0)
    for key, k in (("gain", 40), ("20", 20), ("40", 10)):
        paper = sum(float((top(g, k) ** 2).sum()) for g in grads) / sum(float((g ** 2).sum()) for g in grads)
        assert (rec[key] if key == "gain" else rec["probe_gain"][key]) == pytest.approx(paper, rel=1e-5)
    # code definition at the sent CF: Σ_w Σ_l ||C(g)_l|| / Σ_w Σ_l ||g_l|| (layers of 100 and 300)
    def lsum(g, k):
        kept = torch.zeros_like(g)
        idx = g.abs().argsort(descending=True)[:k]
        kept[idx] = g[idx]
        return layer_norm_sum(kept, segment_bounds([100, 300]))
    code = sum(lsum(g, 40) for g in grads) / sum(layer_norm_sum(g, segment_bounds([100, 300])) for g in grads)
    assert rec["gain_code_raw"] == pytest.approx(code, rel=1e-5) and rec["gain_code"] == pytest.approx(code, rel=1e-5)
    assert set(rec["probe_gain_code"]) == {"20", "40"}


def _gravac(gain: str):
    run = make_run(method=dict(name="gravac", cf_min=10, cf_max=100, window=1000, epsilon=0.6, gain=gain,
                               gain_window=1, gain_alpha=1.0, ewma=1.0),
                   compressor=dict(name="topk", granularity="flat"))
    return build_method(run, SimGroup(W, NetworkModel.from_cfg(run.network)), [N], torch.device("cpu"))


def test_gravac_gain_code_compresses_where_the_papers_gain_sends_dense():
    """Gaussian gradients: Top-k 10x keeps ~44% of the energy (paper gain ~0.44 < 0.6: dense), while
    the code's ratio of unsquared norms is ~sqrt(0.44) = 0.66 >= 0.6, and grows with the residual."""
    grads = [[torch.randn(N, generator=torch.Generator().manual_seed(100 * s + w)) for w in range(W)]
             for s in range(6)]
    paper, code = _gravac("paper"), _gravac("code")
    rp = [paper.step([g.clone() for g in gs], _ctx(s)).extra for s, gs in enumerate(grads)]
    rc = [code.step([g.clone() for g in gs], _ctx(s)).extra for s, gs in enumerate(grads)]
    assert all(r["level"] == "dense" for r in rp)
    assert all(r["gain_paper_raw"][0] < 0.6 for r in rp)
    assert all(r["level"] != "dense" for r in rc)
    assert rc[-1]["gain_code_raw"][0] > rc[0]["gain_code_raw"][0]              # the residual lifts it
    assert rc[0]["delta_min"] == pytest.approx(rc[0]["gain_code"][0])          # the code's gain decides
    # both definitions are recorded by both runs, and the first step (same inputs) agrees
    assert rp[0]["gain_code_raw"] == pytest.approx(rc[0]["gain_code_raw"])
    assert rp[0]["gain_paper_raw"] == pytest.approx(rc[0]["gain_paper_raw"])


def test_gain_probe_figure_and_table_from_a_static_run(tmp_path):
    """A static run with probe CFs records both gains at every CF; plots/gains.py draws and tabulates them."""
    from conftest import run_cli
    from plots import gains as gains_plot
    r = run_cli(["method=static", "compressor=topk", "compressor.cf=10", "method.probe_cfs=[20,1000]",
                 "train.steps=6", "dataset.image_size=8", "dataset.train_size=256", "dataset.test_size=64",
                 "model.width=4", "train.batch_size=8", "logger.progress=false", "cluster.threads=1",
                 f"clock.cache_dir={tmp_path / 'cache'}", f"experiment.results_root={tmp_path / 'runs'}"])
    assert r.returncode == 0, failure(r)
    (run,) = gains_plot.load(str(tmp_path / "runs"))
    data = gains_plot.series(run)
    assert sorted(data) == [10.0, 20.0, 1000.0]
    for cf in data:
        assert len(data[cf]["gain"]) == 6 and len(data[cf]["gain_code_raw"]) == 6
        assert all(0.0 <= v <= 1.0 + 1e-9 for v in data[cf]["gain"])     # the paper's gain is an energy share
    # more compression keeps less energy, step by step
    assert all(a >= b for a, b in zip(data[10.0]["gain"], data[1000.0]["gain"]))
    out = tmp_path / "curated"
    assert gains_plot.main([str(tmp_path / "runs"), "--curate", str(out)]) == 0
    assert (out / "gains.png").stat().st_size > 0 and len(list((out / "runs").iterdir())) == 1
    assert "| 1000x |" in (out / "gains.md").read_text()
    (out / "gains.md").unlink()
    assert gains_plot.main([str(out / "runs")]) == 0       # redraws from the committed copies
    assert "| 1000x |" in (out / "gains.md").read_text()


def test_static_send_dense_is_a_gain_probe_on_dense_sgds_path():
    """method.send=dense records the gains static compression would measure, but sends what dense
    sends (the exact average, CF 1, M floats) and keeps no residual, so step 2 sees the raw gradient."""
    grads = [[torch.randn(N, generator=torch.Generator().manual_seed(10 * s + w)) for w in range(W)] for s in range(2)]
    probe_run = make_run(method=dict(name="static", send="dense", probe_cfs=[40]),
                         compressor=dict(name="topk", cf=10, granularity="flat"))
    static_run = make_run(method=dict(name="static", probe_cfs=[40]), compressor=dict(name="topk", cf=10, granularity="flat"))
    group = lambda run: SimGroup(W, NetworkModel.from_cfg(run.network))    # noqa: E731
    probe = build_method(probe_run, group(probe_run), [N], torch.device("cpu"))
    res = [probe.step([g.clone() for g in gs], _ctx(s)) for s, gs in enumerate(grads)]
    assert all(r.cf == 1.0 and r.floats_sent == N for r in res)
    assert torch.equal(res[1].grad, (grads[1][0] + grads[1][1]) / 2)
    fresh = build_method(static_run, group(static_run), [N], torch.device("cpu"))   # no residual at its step 0
    want = fresh.step([g.clone() for g in grads[1]], _ctx(0)).extra
    assert res[1].extra["gain"] == pytest.approx(want["gain"]) and res[1].extra["probe_gain"] == pytest.approx(want["probe_gain"])
    assert float(probe.memories[0][0].residual.abs().sum()) == 0.0
