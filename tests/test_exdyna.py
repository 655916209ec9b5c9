"""ExDyna and MiCRO: exclusive partitions, no build-up, block moves, threshold scaling, error feedback."""
from __future__ import annotations

import math

import pytest
import torch

from gravac.cluster.comm import SimGroup
from gravac.config.compose import saved_config
from gravac.methods import StepContext, build_method
from gravac.methods.exdyna import block_layout, equal_split, first_threshold, rebalance, scale_threshold
from gravac.cluster.netmodel import NetworkModel
from conftest import make_run

NET = NetworkModel(alpha_s=1e-5, beta_Bps=1e9)
D = 4000


def make(name: str, world: int = 4, cf: float = 50, numel: int = D, **method):
    cfg = make_run(method=dict(name=name, **method), compressor=dict(name="none", cf=cf))
    return build_method(cfg, SimGroup(world, NET), [numel // 2, numel - numel // 2], torch.device("cpu"))


def ctx(step: int) -> StepContext:
    return StepContext(step=step, epoch=0.0, lr=0.1, lr_decayed=False, compute_s=0.01, samples=64)


def grads(step: int, world: int, numel: int = D) -> list[torch.Tensor]:
    """Magnitudes falling along the gradient (large at the front), so equal partitions are unbalanced."""
    scale = torch.linspace(3.0, 0.1, numel)
    return [torch.randn(numel, generator=torch.Generator().manual_seed(97 * step + w)) * scale * 0.05
            for w in range(world)]


def run(method, steps: int, world: int):
    """Per step: the records, the partition bounds, every worker's gathered indices and the output."""
    seen = {}
    bounds, gather = method.bounds, method.group.allgather_indices

    def spy_bounds():
        seen["bounds"] = bounds()
        return seen["bounds"]

    def spy_gather(idx, numel):
        out, comm = gather(idx, numel)
        seen["gathered"] = [i.clone() for i in out]
        return out, comm
    method.bounds, method.group.allgather_indices = spy_bounds, spy_gather
    out = []
    for s in range(steps):
        res = method.step(grads(s, world), ctx(s))
        out.append((res, seen["bounds"], seen["gathered"]))
    return out


def test_threshold_scaling_branches():
    assert first_threshold(100) == 0.05
    assert scale_threshold(1.0, 111, 100) == 1.005       # exam 1.11 > 1.1: raise fast
    assert scale_threshold(1.0, 110, 100) == 1.00125     # exam 1.1 (not above): raise slowly
    assert scale_threshold(1.0, 91, 100) == 1.00125      # exam 0.91 > 0.909
    assert scale_threshold(1.0, 90, 100) == 0.995        # exam 0.9: lower


def test_layouts_by_hand():
    assert equal_split(10, 4) == [3, 3, 2, 2]
    assert block_layout(100_000, 1024, 32) == (1024, 96, 100_000 - 96 * 1024)   # 97 -> 96, rest to last
    assert block_layout(5000, 1024, 32) == (1024, 4, 904)                        # short blocks unaligned
    assert block_layout(500, 1024, 32) == (500, 1, 0)                            # an element per block
    assert make("micro", numel=10).bounds() == [(0, 3), (3, 6), (6, 8), (8, 10)]


def test_rebalance_moves_one_block_by_the_rule_in_order():
    # k_prev 45 over 4 -> k_acc 11; block 8 of 360 -> each move shifts int(8*45/360) = 1 from the estimate
    assert rebalance([10] * 4, [5, 20, 5, 15], 0, 45, 8, 360, 2.5) == [11, 8, 12, 9]   # 1->0, 1->2, 3->2
    # the counts are mapped back to partitions: at cycle 1 worker r held partition (1 + r) mod 4
    assert rebalance([10] * 4, [5, 10, 10, 20], 1, 45, 8, 360, 2.5) == [9, 11, 10, 10]
    assert rebalance([3, 10, 10, 10], [20, 5, 10, 10], 0, 45, 8, 360, 2.5) == [3, 10, 10, 10]  # 2 < min_blk


@pytest.mark.parametrize("name", ["micro", "exdyna"])
def test_partitions_exclusive_and_union_is_the_sum(name):
    world = 4
    method = make(name, world, blocks=64, align=4) if name == "exdyna" else make(name, world)
    for s, (res, bounds, gathered) in enumerate(run(method, 25, world)):
        assert bounds[0][0] == 0 and bounds[-1][1] == D
        assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(bounds, bounds[1:]))   # contiguous, cover
        for r, idx in enumerate(gathered):
            lo, hi = bounds[(s + r) % world]
            assert idx.numel() >= 1 and int(idx.min()) >= lo and int(idx.max()) < hi
        union = torch.cat(gathered)
        assert union.unique().numel() == union.numel() == sum(res.extra["ks"]) == res.extra["union"]
        k = res.extra["union"]
        assert res.floats_sent == k and res.cf == D / k
        assert res.comm.wire_bytes == 8 + 4 * max(res.extra["ks"]) + 4 * k       # count, padded int32, values
        assert res.extra["imbalance"] == pytest.approx(max(res.extra["ks"]) * world / k - 1)
        assert res.extra["density_error"] == pytest.approx(abs(k / D - 1 / 50))


def test_exdyna_rebalances_and_respects_min_blk():
    method = make("exdyna", 4, blocks=64, align=4)
    recs = [res.extra for res, _, _ in run(method, 40, 4)]
    assert recs[0]["blocks_min"] == recs[0]["blocks_max"] == 16
    assert any(r["blocks_max"] > 16 for r in recs)                 # the skewed gradient moves blocks
    assert all(r["blocks_min"] >= 64 / 16 for r in recs)           # min_blk = 64 / (4 * 4)
    assert sum(method.parts) == 64


def test_threshold_follows_the_previous_global_count():
    recs = [res.extra for res, _, _ in run(make("micro"), 12, 4)]
    k = D // 50
    thr = first_threshold(k)
    for prev, rec in zip([None] + recs, recs):
        if prev is not None:
            thr = scale_threshold(thr, prev["union"], k)
        assert rec["threshold"] == pytest.approx(thr, rel=1e-12)


def test_nothing_passes_sends_one_index_per_worker():
    method = make("micro", 4, cf=1000)                            # threshold 1/(2 sqrt 4) = 0.25
    gather, seen = method.group.allgather_indices, []
    method.group.allgather_indices = lambda idx, n: (seen.append(torch.cat(idx).tolist()), gather(idx, n))[1]
    for s in range(4):
        res = method.step([torch.full((D,), 1e-6) for _ in range(4)], ctx(s))
    # worker r at step 3 holds partition (3 + r) mod 4 = [0, 1000) + 1000 * ((3 + r) % 4): lo + 3 mod 1000
    assert seen[3] == [3003, 3, 1003, 2003]
    assert res.extra["imbalance"] == 0.0 and res.extra["union"] == 4


@pytest.mark.parametrize("name", ["micro", "exdyna"])
def test_error_feedback_conserves_the_gradient(name):
    """Over the run, the mean of all gradients = the sum of the averaged outputs + the mean residual;
    the residual is zero at the last step's union on every worker."""
    world, steps = 4, 8
    method = make(name, world, blocks=64, align=4) if name == "exdyna" else make(name, world)
    total_in, total_out = torch.zeros(D, dtype=torch.float64), torch.zeros(D, dtype=torch.float64)
    for s, (res, _, gathered) in enumerate(run(method, steps, world)):
        total_in += torch.stack(grads(s, world)).double().mean(0)
        total_out += res.grad.double()
    union = torch.cat(gathered)                                   # the last step's
    assert all(float(m.residual[union].abs().max()) == 0.0 for m in method.memories)
    residual = torch.stack([m.residual for m in method.memories]).double().mean(0)
    assert float((total_out + residual - total_in).abs().max()) < 1e-5


def test_config_keeps_cf_and_names_the_setting():
    run_cfg = make_run(method=dict(name="exdyna"), compressor=dict(name="topk", cf=500))
    assert (run_cfg.compressor.name, run_cfg.compressor.cf) == ("none", 500)
    setting = saved_config(run_cfg)["setting"]
    assert setting["label"] == "ExDyna 500x global" and setting["cf_text"] == "500x (global)"
    calibrated = make_run(method=dict(name="micro", threshold_start="calibrated"), compressor=dict(name="none", cf=500))
    assert saved_config(calibrated)["setting"]["label"] == "MiCRO 500x global (calibrated start)"


def test_state_dict_round_trip_continues_identically():
    a = make("exdyna", 4, blocks=64, align=4)
    for s in range(6):
        a.step(grads(s, 4), ctx(s))
    b = make("exdyna", 4, blocks=64, align=4)
    b.load_state_dict(a.state_dict())
    ra, rb = a.step(grads(6, 4), ctx(6)), b.step(grads(6, 4), ctx(6))
    assert ra.extra == rb.extra and torch.equal(ra.grad, rb.grad)
    assert math.isclose(ra.extra["threshold"], rb.extra["threshold"])


def test_index_allgather_counts_counts_and_padding():
    gathered, comm = SimGroup(2, NET).allgather_indices([torch.tensor([3, 1]), torch.tensor([7])], 10)
    assert [g.tolist() for g in gathered] == [[3, 1], [7]]
    assert comm.wire_bytes == 8 + 2 * 4 and comm.floats == 0.0              # count + 2 padded int32
    assert comm.modelled_s == pytest.approx(NET.allgather(8, 2) + NET.allgather(8, 2))


@pytest.mark.parametrize("name", ["micro", "exdyna"])
def test_calibrated_start_selects_about_k_at_the_first_step(name):
    """The code's start sends many times K on this gradient; the calibrated start shares the mean
    of the thresholds that would give each worker its share of K (on this deliberately skewed
    gradient, 30x larger at the front, that mean over-selects in the large partitions)."""
    k = D // 50
    code = run(make(name), 1, 4)[0][0].extra
    calibrated_method = make(name, threshold_start="calibrated")
    res, bounds, gathered = run(calibrated_method, 1, 4)[0]
    rec = res.extra
    # by hand: each worker's |value| that keeps its share of K (k x its partition's length / D; MiCRO
    # 1000 entries each, ExDyna 768, 768, 768, 1696), averaged over the 4 workers
    g = grads(0, 4)
    part = [g[w][bounds[w][0]:bounds[w][1]].abs() for w in range(4)]
    need = [p.sort(descending=True).values[round(k * len(p) / D) - 1] for p in part]
    assert rec["threshold"] == pytest.approx(float(sum(need) / 4), rel=1e-6)
    assert rec["ks"] == [max(1, int((p >= rec["threshold"]).sum())) for p in part]   # none passing: one index
    assert code["union"] > 5 * rec["union"] and rec["union"] < 3 * k
    assert res.floats_sent == rec["union"] + 1                    # the one-float all-reduce of step 0
    later = calibrated_method.step(grads(1, 4), ctx(1))
    assert later.floats_sent == later.extra["union"]              # only at step 0


def test_threshold_start_is_checked_in_one_line():
    with pytest.raises(Exception, match="threshold_start"):
        make("micro", threshold_start="fast")
