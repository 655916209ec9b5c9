"""Adaptive methods over torch.distributed: every rank takes the same decision at every step,
and a 2-process gloo run equals the simulated cluster on the same per-worker gradients."""
from __future__ import annotations

import itertools
import traceback

import pytest
import torch

from gravac.cluster.comm import DistGroup, SimGroup
from gravac.methods import StepContext, build_method
from gravac.cluster.netmodel import NetworkModel
from conftest import gloo_ranks, make_run
from gravac.core.schema import RunConfig

WORLD = 2
SIZES = [500, 300, 200]
SPE = 3                                         # steps per epoch (Accordion)
SCENARIOS = {
    "gravac": dict(steps=30, method=dict(name="gravac", cf_min=4, cf_max=200, window=5, step=2,
                                         epsilon=0.7, omega=0.05, ewma=0.5),
                   compressor=dict(name="topk", granularity="flat")),
    "accordion": dict(steps=15, method=dict(name="accordion", cf_low=1.5, cf_high=40, switch_freq=1, eta=0.5),
                      compressor=dict(name="topk", granularity="layer")),
    "accordion_averaged": dict(steps=15, method=dict(name="accordion", cf_low=1.5, cf_high=40, switch_freq=1,
                                                     eta=0.5),
                               compressor=dict(name="randomk", granularity="layer", shared_indices=False),
                               accumulate="averaged"),
    # PowerSGD needs shapes: two matrices that compress and a 1-D tensor sent dense
    "powersgd": dict(steps=6, method=dict(name="powersgd", rank=2), compressor=dict(name="none"),
                     shapes=[(20, 25), (300,), (10, 20)]),
    "accordion_powersgd": dict(steps=15, method=dict(name="accordion_powersgd", switch_freq=1, eta=0.5),
                               compressor=dict(name="none"), shapes=[(20, 25), (300,), (10, 20)]),
    # L-GreCo over PowerSGD ranks: solves at steps 3 and 6 on rank 0's window, ranks broadcast
    "lgreco_powersgd": dict(steps=8, method=dict(name="lgreco_powersgd", candidates=[1, 2, 3, 4], rank=2, period=3,
                                                 window=2), compressor=dict(name="none"), shapes=[(20, 25), (300,), (10, 20)]),
}
# static compression with every compressor: floats sent and CF must be the same numbers on sim and
# ddp also when the count differs by worker (DGC, RedSync: thresholds) or indices do (Random-k)
for _c, _opts in [("topk", {}), ("dgc", {}), ("redsync", {}), ("randomk", {}),
                  ("randomk", {"shared_indices": False})]:
    SCENARIOS[f"static_{_c}" + ("_independent" if _opts else "")] = dict(
        steps=6, method=dict(name="static"), compressor=dict(name=_c, cf=20, granularity="layer", **_opts))
# quantizers: packed payloads all-gathered, decoded and averaged in rank order; stochastic rounding
# drawn per worker from the seed (QSGD, TernGrad, stochastic min-max), EF-SignSGD with its residual
for _c, _opts in [("qsgd", {"levels": 7, "bucket": 64}), ("terngrad", {}), ("efsignsgd", {}),
                  ("quant", {"bits": 4, "bucket": 100, "rounding": "stochastic"})]:
    SCENARIOS[f"static_{_c}"] = dict(steps=6, method=dict(name="static"),
                                     compressor=dict(name=_c, granularity="layer", **_opts))
# L-GreCo over quantizers: per-layer code widths (rank 0 solves, broadcasts the widths), payloads of
# pieces of different widths all-gathered at one size on every worker; QSGD and min-max stochastic
SCENARIOS["lgreco_quant"] = dict(steps=9, method=dict(name="lgreco", period=3, window=2),
                                 compressor=dict(name="quant", bits=4, bucket=64, rounding="stochastic"))
SCENARIOS["lgreco_qsgd"] = dict(steps=9, method=dict(name="lgreco", period=3, window=2),
                                compressor=dict(name="qsgd", levels=7, bucket=64))
# 16-bit casts: values divided by the world size, then all-reduced in 16 bits (gloo sums them in
# fp16/bf16 as the simulated cluster does); error feedback on for bf16 (its residual: the rounding)
SCENARIOS["static_fp16"] = dict(steps=6, method=dict(name="static"), compressor=dict(name="fp16"))
SCENARIOS["static_bf16"] = dict(steps=6, method=dict(name="static"), compressor=dict(name="bf16", error_feedback=True))
SCENARIOS["mergecomp_fp16"] = dict(steps=6, method=dict(name="mergecomp", groups=2, search="none"),
                                   compressor=dict(name="fp16"))
SCENARIOS["mergecomp_qsgd"] = dict(steps=6, method=dict(name="mergecomp", groups=2, search="none"),
                                   compressor=dict(name="qsgd", bucket=128))
# exclusive partitions: per-worker counts differ, the union's indices go through the index all-gather
SCENARIOS["micro"] = dict(steps=8, method=dict(name="micro"), compressor=dict(name="none", cf=20))
SCENARIOS["exdyna"] = dict(steps=8, method=dict(name="exdyna", blocks=16, align=4), compressor=dict(name="none", cf=20))
SCENARIOS["exdyna_calibrated"] = dict(steps=4, method=dict(name="exdyna", blocks=16, align=4, threshold_start="calibrated"),
                                     compressor=dict(name="none", cf=20))
# COVAP: a rotating shard filter (same positions on every worker, values all-reduced); auto R from
# step 0's dense all-reduce (compute_s 0.02 s of ctx) decided on rank 0 and broadcast
SCENARIOS["covap"] = dict(steps=8, method=dict(name="covap", drop_rate=3, decay_step=2), compressor=dict(name="none"))
SCENARIOS["covap_auto"] = dict(steps=5, method=dict(name="covap", buckets=3), compressor=dict(name="none"))
# overlap: tolerance 0 is never met (latency), so R = the shortest mean step among 1..3, i.e. 3
SCENARIOS["covap_overlap"] = dict(steps=5, method=dict(name="covap", buckets=3, drop_rate="overlap", overlap_tol=0.0,
                                                       max_rate=3), compressor=dict(name="none"))
# MergeComp: every group its own message(s), DGC counts differing by worker; the binary search's
# warm-up, (no) probes and choice (3 tensors: the code's default split 1)
SCENARIOS["mergecomp"] = dict(steps=6, method=dict(name="mergecomp", groups=2, search="none"),
                              compressor=dict(name="dgc", cf=20))
SCENARIOS["mergecomp_binary"] = dict(steps=6, method=dict(name="mergecomp", warmup=1, probe_steps=2),
                                     compressor=dict(name="topk", cf=20))
JOIN_TIMEOUT_S = 240
DTYPES = (torch.float64, torch.float16)


def config(name: str) -> RunConfig:
    sc = SCENARIOS[name]
    cfg = make_run(method=dict(sc["method"]), compressor=dict(sc["compressor"]))
    if "accumulate" in sc:
        cfg.method.accumulate = sc["accumulate"]
    return cfg


def grad(name: str, step: int, rank: int) -> torch.Tensor:
    """Deliberately different per worker and over time, so levels and regimes change."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    n = sum(SIZES)
    if name.startswith("accordion"):             # a steady direction; layer 1 jumps in epoch 2
        x = torch.linspace(1, 2, n) * (rank + 1) + 0.2 * torch.randn(n, generator=g)
        if step // SPE == 2:
            x[500:800] *= 4
        return x
    if name.startswith("lgreco"):                # layers of different scales: worth different widths
        return torch.randn(n, generator=g) * torch.tensor([0.01] * 500 + [0.1] * 300 + [1.0 + rank] * 200)
    x = torch.randn(n, generator=g) * (0.01 if (step // 4 + rank) % 3 else 1.0)
    spikes = [10, 40, 120][(step // 3 + rank) % 3]
    x[torch.randperm(n, generator=g)[:spikes]] += 5.0 * (rank + 1)
    return x


def ctx(step: int) -> StepContext:
    return StepContext(step=step, epoch=step / SPE, lr=0.1, lr_decayed=step == 10, compute_s=0.02,
                       samples=WORLD * 16)


def fake_clock():
    """2^-10 s per call (exact in binary), so every worker's measured compression time is the
    same on any backend."""
    ticks = itertools.count()
    return lambda: next(ticks) / 1024


def run_method(name: str, group, ranks: list[int]) -> list[dict]:
    """Run a scenario; per step the record fields and the averaged gradient."""
    cfg = config(name)
    method = build_method(cfg, group, SIZES, torch.device("cpu"), shapes=SCENARIOS[name].get("shapes"))
    if name == "gravac":
        method.clock = fake_clock()
    out = []
    for s in range(SCENARIOS[name]["steps"]):
        res = method.step([grad(name, s, r) for r in ranks], ctx(s))
        out.append({"cf": res.cf, "floats_sent": res.floats_sent, "wire_bytes": res.comm.wire_bytes,
                    "modelled_s": res.comm.modelled_s, "extra": res.extra, "grad": res.grad.clone()})
    return out


def run_dtypes(group, ranks: list[int]) -> dict:
    """Sparse payloads of other float types through the group: (mean, wire bytes) per dtype."""
    from compressors import Payload
    out = {}
    for dtype in DTYPES:
        payloads = []
        for r in ranks:
            g = torch.Generator().manual_seed(r)
            idx = torch.randperm(1000, generator=g)[: 50 + 7 * r]
            vals = (torch.randn(len(idx), generator=g, dtype=torch.float64) / 3).to(dtype)
            payloads.append(Payload(vals, idx, 1000))
        mean, comm = group.aggregate(payloads)
        out[str(dtype)] = (mean, comm.wire_bytes, comm.floats)
    return out


def _work(rank: int) -> dict:
    """One gloo process: every scenario's records (or its error)."""
    group = DistGroup(NetworkModel.from_cfg(RunConfig().network), torch.device("cpu"))
    results = {}
    for name in SCENARIOS:      # a deterministic error fails the same step on both ranks
        try:
            results[name] = run_method(name, group, [rank])
        except Exception:
            results[name] = traceback.format_exc()
    results["dtypes"] = run_dtypes(group, [rank])
    return results


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory):
    """Results of both ranks of a 2-process gloo run (spawned; killed if it hangs)."""
    return gloo_ranks(_work, tmp_path_factory.mktemp("ddp"), WORLD, JOIN_TIMEOUT_S)


def records(ddp_results, rank: int, name: str) -> list[dict]:
    """One rank's records of a scenario; fails with the worker's traceback if it raised."""
    rec = ddp_results[rank][name]
    if isinstance(rec, str):
        pytest.fail(f"scenario {name} failed on rank {rank}:\n{rec}")
    return rec


def same(a: list[dict], b: list[dict], grad_tol: float = 0.0) -> None:
    """Identical records step by step; gradients equal (within grad_tol)."""
    assert len(a) == len(b)
    for s, (x, y) in enumerate(zip(a, b)):
        assert x["extra"] == y["extra"], f"step {s}"
        assert (x["cf"], x["floats_sent"], x["wire_bytes"]) == (y["cf"], y["floats_sent"], y["wire_bytes"]), f"step {s}"
        assert x["modelled_s"] == pytest.approx(y["modelled_s"])
        torch.testing.assert_close(x["grad"], y["grad"], rtol=grad_tol, atol=grad_tol)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_decisions_identical_on_every_rank(ddp_results, name):
    same(records(ddp_results, 0, name), records(ddp_results, 1, name))


def test_gravac_run_exercises_levels_and_windows(ddp_results):
    recs = [r["extra"] for r in records(ddp_results, 0, "gravac")]
    assert len({r["level"] for r in recs}) >= 2                   # the scripted gradients move the level
    assert len({(r["cf_min"], r["cs"]) for r in recs}) >= 2        # and the windows move the CFs


def test_covap_overlap_plans_r_and_filters(ddp_results):
    steps = records(ddp_results, 0, "covap_overlap")
    assert [r["extra"]["drop_rate"] for r in steps] == [1, 3, 3, 3, 3]
    assert all(r["floats_sent"] < sum(SIZES) for r in steps[1:])


def test_lgreco_powersgd_run_solves_and_changes_ranks(ddp_results):
    recs = [r["extra"] for r in records(ddp_results, 0, "lgreco_powersgd")]
    assert [s for s, r in enumerate(recs) if "lgreco_solve" in r] == [3, 6]
    levels = [r["lgreco_levels"] for r in recs if "lgreco_levels" in r]
    assert levels[0] == [2, None, 2] and len(levels) >= 2          # a solve moved the ranks


def test_accordion_run_switches_regimes(ddp_results):
    recs = [r["extra"] for r in records(ddp_results, 1, "accordion")]
    decisions = [r["accordion_decision"] for r in recs if "accordion_decision" in r]
    assert [(d["epoch"], d["reason"], d["low_layers"]) for d in decisions] == [
        (0, "check", [0, 1, 2]), (1, "check", []), (2, "check", [1]),      # layer 1 jumped in epoch 2
        (3, "lr_decay", [0, 1, 2]), (3, "check", [1])]                     # decay at step 10; 1 fell back
    assert [r["cf_low_layers"] for r in recs] == [3] * 6 + [0] * 3 + [1] + [3] * 2 + [1] * 3


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_ddp_equals_simulated_cluster(ddp_results, name):
    group = SimGroup(WORLD, NetworkModel.from_cfg(RunConfig().network))
    ddp = records(ddp_results, 0, name)
    same(ddp, run_method(name, group, list(range(WORLD))), grad_tol=1e-6)


def test_payload_values_travel_in_their_own_dtype(ddp_results):
    """float64 stays exact on ddp (it used to be rounded to float32) and fp16 sends 2 bytes a value:
    the mean equals the simulated cluster's bitwise, and wire bytes are what is sent."""
    sim = run_dtypes(SimGroup(WORLD, NetworkModel.from_cfg(RunConfig().network)), list(range(WORLD)))
    for rank in range(WORLD):
        for dtype in DTYPES:
            mean, wire, floats = ddp_results[rank]["dtypes"][str(dtype)]
            s_mean, s_wire, s_floats = sim[str(dtype)]
            assert mean.dtype == dtype and torch.equal(mean, s_mean)
            elem = torch.tensor([], dtype=dtype).element_size()
            assert wire == s_wire == 57 * (elem + 4) + 8       # padded to the larger count (50 + 7)
            assert floats == s_floats == (50 + 57) / 2         # the mean count over workers


def test_quantized_steps_send_their_packed_bytes(ddp_results):
    """16-bit casts: 2000 bytes for 1000 values, floats 500, CF 2 (MergeComp: over its 2 groups).
    Static QSGD (4-bit codes, a norm per 64 elements of each layer): 1000 codes in 500 bytes
    plus 17 norms, floats = wire bytes / 4, cf = 1000 / floats, every step, on both backends; the
    per-worker draws differ (the average is not one worker's codes)."""
    groups = sum(-(-m // 64) for m in SIZES)          # 8 + 5 + 4
    for rank in range(WORLD):
        for r in records(ddp_results, rank, "static_qsgd"):
            assert r["wire_bytes"] == 500 + 4 * groups == 568
            assert r["floats_sent"] == 568 / 4 and r["cf"] == pytest.approx(1000 / 142)
    for name in ("static_fp16", "static_bf16", "mergecomp_fp16"):     # 2 bytes a value, half the floats
        for r in records(ddp_results, 0, name):
            assert (r["wire_bytes"], r["floats_sent"], r["cf"]) == (2000, 500.0, 2.0)
    ef = records(ddp_results, 0, "static_efsignsgd")[0]
    assert ef["wire_bytes"] == 125 + 3 * 4 and ef["cf"] == pytest.approx(1000 / (137 / 4))


def test_lgreco_quantizers_send_mixed_widths_at_their_packed_bytes(ddp_results):
    """L-GreCo over min-max quant and QSGD: the solves mix the widths, and every step sends the
    exact bytes of its widths (each layer its codes from a fresh byte and 8 (quant: min, step) or 4
    (QSGD: norm) bytes per bucket of 64; one width: the uniform payload), floats = wire bytes / 4."""
    for name, scale_bytes in (("lgreco_quant", 8), ("lgreco_qsgd", 4)):
        levels, mixed = None, 0
        for r in records(ddp_results, 0, name):
            levels = r["extra"].get("lgreco_levels", levels)
            if len(set(levels)) > 1:
                mixed += 1
                want = sum(-(-m * b // 8) + scale_bytes * -(-m // 64) for m, b in zip(SIZES, levels))
            else:
                want = -(-sum(SIZES) * levels[0] // 8) + scale_bytes * sum(-(-m // 64) for m in SIZES)
            assert r["wire_bytes"] == want and r["floats_sent"] == want / 4, name
        assert mixed, name
