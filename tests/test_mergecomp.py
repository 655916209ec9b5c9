"""MergeComp: groups in backward order, equality with whole-model/layer-wise static runs, error
feedback per group, the searches (hand-made timelines and a hand-made clock), sim = ddp, config errors."""
from __future__ import annotations

import pytest
import torch
from conftest import gloo_ranks, make_run, run_cli

from gravac.cluster.comm import DistGroup, SimGroup
from gravac.config.compose import ConfigError
from gravac.core.errors import UserError
from gravac.methods import StepContext, build_method
from gravac.methods.mergecomp import (
    binary_search,
    default_cuts,
    exhaustive,
    greedy,
    split_cuts,
)
from gravac.cluster.netmodel import NetworkModel
from gravac.cluster.timeline import Piece, schedule

NET = NetworkModel(alpha_s=1e-5, beta_Bps=1e9)
SIZES = [30, 50, 20, 40, 60, 10, 25, 35, 45, 15]        # 10 tensors, 330 elements


def make(world=3, sizes=SIZES, buckets=None, compressor="topk", cf=10, **method):
    method.setdefault("search", "none")
    cfg = make_run(method=dict(name="mergecomp", **method), compressor=dict(name=compressor, cf=cf))
    return build_method(cfg, SimGroup(world, NET), list(sizes), torch.device("cpu"), buckets=buckets)


def static(world=3, sizes=SIZES, compressor="topk", cf=10, granularity="flat"):
    cfg = make_run(method=dict(name="static"), compressor=dict(name=compressor, cf=cf, granularity=granularity))
    return build_method(cfg, SimGroup(world, NET), list(sizes), torch.device("cpu"))


def ctx(step, prev=None):
    return StepContext(step=step, epoch=step / 100, lr=0.1, lr_decayed=False, compute_s=0.01, samples=96,
                       prev_step_s=prev)


def grads(step, world=3, n=sum(SIZES)):
    return [torch.randn(n, generator=torch.Generator().manual_seed(31 * step + w)) * (1 + w) for w in range(world)]


# --- partitions ------------------------------------------------------------------------------
def test_default_cuts_follow_the_code():
    assert default_cuts(5, 2) == [0, 2, 5]
    assert default_cuts(7, 3) == [0, 2, 4, 7]          # the last group takes the remainder
    assert default_cuts(5, 5) == [0, 1, 2, 3, 4, 5]
    assert default_cuts(5, 1) == [0, 5]
    assert split_cuts(10, 4) == [0, 4, 10] and split_cuts(10, 10) == [0, 10]


@pytest.mark.parametrize("buckets", [None, [[9, 8, 7], [6, 5], [4, 3, 2, 1, 0]], [[2, 9], [0, 5, 1], [3, 8, 4, 7, 6]]])
def test_groups_follow_backward_order_and_cover_every_parameter_once(buckets):
    m = make(buckets=buckets, groups=3)
    order = [i for b in buckets for i in b] if buckets else list(range(9, -1, -1))
    assert m.cuts == [0, 3, 6, 10]
    assert [g.params for g in m.groups] == [sorted(order[0:3]), sorted(order[3:6]), sorted(order[6:10])]
    for cuts in ([0, 1, 10], [0, 4, 5, 9, 10], list(range(11))):
        m.set_partition(cuts)
        seen = torch.zeros(m.numel, dtype=torch.long)
        for g in m.groups:
            g.put(seen, g.take(seen) + 1)
        assert torch.equal(seen, torch.ones(m.numel, dtype=torch.long))      # every element once
        assert sorted(p for g in m.groups for p in g.params) == list(range(10))


# --- equal to whole-model and layer-wise static runs ------------------------------------------
@pytest.mark.parametrize("compressor", ["topk", "dgc", "randomk", "redsync"])
@pytest.mark.parametrize("groups,granularity", [(1, "flat"), (0, "layer")])
def test_one_group_is_whole_model_and_one_per_tensor_is_layerwise(compressor, groups, granularity):
    """"Exactly": the averaged gradient bitwise and the floats sent; with several groups every group
    is its own message, so wire bytes and time differ from static layer-wise (one joined payload)."""
    a, b = make(compressor=compressor, groups=groups), static(compressor=compressor, granularity=granularity)
    for s in range(6):
        g = grads(s)
        ra, rb = a.step([x.clone() for x in g], ctx(s)), b.step([x.clone() for x in g], ctx(s))
        assert torch.equal(ra.grad, rb.grad), f"step {s}"
        assert ra.floats_sent == pytest.approx(rb.floats_sent) and ra.cf == pytest.approx(rb.cf)
    assert len(ra.pieces) == (1 if groups == 1 else len(SIZES))
    if groups == 1:
        assert ra.comm.wire_bytes == rb.comm.wire_bytes


def test_error_feedback_conserves_gradient_mass_per_group():
    m = make(groups=3, cf=7)
    sent = []
    agg = m.group.aggregate
    m.group.aggregate = lambda ps: (sent.append([p for p in ps]), agg(ps))[1]
    for s in range(4):
        before = [m.full_state(w)["residual"] for w in range(3)]
        g = grads(s)
        sent.clear()
        m.step(g, ctx(s))
        for gi, grp in enumerate(m.groups):
            for w in range(3):
                compensated = grp.take(g[w]) + grp.take(before[w])
                assert torch.equal(sent[gi][w].dense() + m.memories[w][gi].residual, compensated)
    full = [m.full_state(w)["residual"] for w in range(3)]
    m.set_partition([0, 1, 10])                        # a new partition keeps every residual
    assert all(torch.equal(m.full_state(w)["residual"], full[w]) for w in range(3))


# --- the searches ----------------------------------------------------------------------------
def drive(n, step, t):
    """The binary search run to the end against times t(x): (probe order, answer)."""
    probed = {}
    while True:
        kind, x = binary_search(n, step, probed)
        if kind == "done":
            return list(probed), x
        probed[x] = t(x)


def test_binary_search_as_the_code():
    # start 1, end 9: probe 5, 7 (t5 > t7 -> start 7); probe 8, 10 (t8 < t10 -> end 8); stop; best 7
    assert drive(10, 2, lambda x: abs(x - 7)) == ([5, 7, 8, 10], 7)
    # equal times go left (end = mid); the first of equal best times wins
    assert drive(10, 2, lambda x: (x - 6) ** 2) == ([5, 7, 3], 5)
    assert drive(3, 2, lambda x: 1.0) == ([], 1)        # nothing to search: the code's n // 2


def hand_timeline(cuts):
    """Hand-made: tensors ready at 1, 2, 3 s of backward (F = 0, B = 3, no optimizer), sizes 1, 1, 4;
    0.5 s to compress any group, a message costs 0.1 + 0.25 s per element."""
    sizes, ready = [1, 1, 4], [1.0, 2.0, 3.0]
    pieces = [Piece(list(range(a, b)), 0.5, [0.1 + 0.25 * sum(sizes[a:b])]) for a, b in zip(cuts, cuts[1:])]
    return schedule(0.0, 3.0, ready, 0.0, pieces).step_s


def test_exhaustive_and_greedy_find_the_best_partition_of_a_hand_made_timeline():
    # x=1: {0} compressed 1-1.5, sent 1.5-1.85; {1,2} ready 3 + 0.5 shift, compressed -4.0, sent -5.35
    # x=2: {0,1} compressed 2-2.5, sent -3.1; {2} ready 3.5, compressed -4.0, sent 4.0 + 1.1 = 5.1
    best, times = exhaustive(3, 2, hand_timeline)
    assert best == [0, 2, 3]
    assert times == pytest.approx({(0, 1, 3): 5.35, (0, 2, 3): 5.1})
    assert greedy(3, 2, hand_timeline)[0] == [0, 2, 3]
    # three groups: each compressed when ready (1-1.5, 2.5-3, 4-4.5), the last sent 4.5-5.6
    assert exhaustive(3, 3, hand_timeline)[1] == pytest.approx({(0, 1, 2, 3): 5.6})


def test_model_search_sets_and_records_the_best_partition(monkeypatch):
    m = make(search="exhaustive", groups=2, warmup=0)
    # a hand-made model: group [lo, hi) costs hi - lo + 1 seconds on the link, the makespan is the sum
    monkeypatch.setattr(m, "model_cost", lambda c, g: lambda cuts: sum(abs(b - a - 4) for a, b in zip(cuts, cuts[1:])))
    res = m.step(grads(0), ctx(0))
    assert res.extra["chosen"] == [0, 4, 10] == res.extra["partition"] == m.cuts
    assert res.extra["candidates_s"]["0,4,10"] == 2 and len(res.extra["candidates_s"]) == 9
    assert m.step(grads(1), ctx(1)).extra["search_phase"] == "chosen"


def test_binary_search_probes_real_steps_on_the_run_clock():
    """The clock says a step under split x takes |x - 7| + 1 s; warm-up 1 round of 2 steps."""
    m = make(search="binary", groups=2, warmup=1, probe_steps=2)
    recs, prev = [], None
    for s in range(12):
        r = m.step(grads(s), ctx(s, prev)).extra
        recs.append(r)
        x = r["partition"][1] if len(r["partition"]) == 3 else 10
        prev = abs(x - 7) + 1.0
    assert [r["search_phase"] for r in recs] == ["warmup"] * 2 + ["probe"] * 8 + ["chosen"] * 2
    assert [r["partition"][1] for r in recs[2:10]] == [5, 5, 7, 7, 8, 8, 10, 10]        # the splits probed
    assert {k: v for r in recs for k, v in r.get("candidates_s", {}).items()} == \
        {"0,5,10": 3.0, "0,7,10": 1.0, "0,8,10": 2.0, "0,10": 4.0}
    assert recs[10]["chosen"] == [0, 7, 10] == recs[11]["partition"]
    assert recs[0]["partition"] == [0, 5, 10]          # the code's default during warm-up
    state = m.state_dict()
    again = make(search="binary", groups=2, warmup=1, probe_steps=2)
    again.load_state_dict(state)
    assert again.cuts == [0, 7, 10] and again.phase == "chosen" and again.probed == m.probed


# --- config errors -----------------------------------------------------------------------------
def test_config_errors_are_one_line():
    with pytest.raises(ConfigError, match="search=binary searches one split into 2 groups"):
        make_run(method=dict(name="mergecomp", groups=3))
    with pytest.raises(ConfigError, match="leaves no partition to search"):
        make_run(method=dict(name="mergecomp", groups=1, search="exhaustive"))
    with pytest.raises(UserError, match="more than the model's 10 parameter tensors"):
        make(groups=11)
    with pytest.raises(UserError, match="exceed method.max_candidates=100"):
        make(groups=5, search="exhaustive", max_candidates=100)       # C(9, 4) = 126 partitions
    make(groups=4, search="exhaustive", max_candidates=100)           # C(9, 3) = 84


@pytest.mark.slow
def test_cli_error_is_one_line():
    out = run_cli(["method=mergecomp", "method.groups=3", "train.steps=1"], timeout=120)
    assert out.returncode != 0
    lines = [line for line in out.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "search=binary" in lines[0] and "Traceback" not in out.stderr


# --- sim = ddp -----------------------------------------------------------------------------------
def ddp_run(group, ranks):
    """Binary search with probe times that differ by rank (as measured wall time would): rank 0's
    broadcast means decide, so the ranks agree; DGC counts differ by worker."""
    cfg = make_run(method=dict(name="mergecomp", search="binary", groups=2, warmup=1, probe_steps=2),
                   compressor=dict(name="dgc", cf=10))
    m = build_method(cfg, group, SIZES, torch.device("cpu"))
    out, prev = [], None
    for s in range(14):
        res = m.step([grads(s, 2)[r] for r in ranks], ctx(s, prev))
        x = res.extra["partition"][1] if len(res.extra["partition"]) == 3 else 10
        prev = abs(x - 4) + 1.0 + 0.25 * ranks[0]
        out.append({"extra": res.extra, "grad": res.grad.clone(), "floats": res.floats_sent,
                    "wire": res.comm.wire_bytes, "modelled": res.comm.modelled_s})
    return out


def _ddp_work(rank):
    return ddp_run(DistGroup(NET, torch.device("cpu")), [rank])


def test_ddp_equals_simulated_cluster(tmp_path):
    ddp = gloo_ranks(_ddp_work, tmp_path, 2)
    sim = ddp_run(SimGroup(2, NET), [0, 1])
    for s in range(14):
        assert ddp[0][s]["extra"] == ddp[1][s]["extra"] == sim[s]["extra"], f"step {s}"
        for r in (0, 1):
            assert (ddp[r][s]["floats"], ddp[r][s]["wire"]) == (sim[s]["floats"], sim[s]["wire"])
            assert ddp[r][s]["modelled"] == pytest.approx(sim[s]["modelled"])
            torch.testing.assert_close(ddp[r][s]["grad"], sim[s]["grad"], rtol=1e-6, atol=1e-6)
    assert sim[-1]["extra"]["partition"] == [0, 4, 10]


# --- the iteration-time table (plots/tables.py) --------------------------------------------------
def _table_run(path: str, steps: list[tuple[float, float, float, float]], chosen_at: int | None):
    """A run whose steps are (step_model_s, compress_model_s, comm_model_s, exposed) on a serial clock."""
    from plots.load import Run
    recs = [{"step": i, "step_model_s": t, "compress_model_s": c, "comm_model_s": m, "exposed_comm_model_s": e,
             "partition": [0, 2, 5]} for i, (t, c, m, e) in enumerate(steps)]
    if chosen_at is not None:
        recs[chosen_at]["chosen"] = True
    return Run(path=path, config={"method": {"name": "mergecomp"}}, summary={}, steps=recs, evals=[])


def test_iteration_table_by_hand():
    """Steady window = after the chosen step (else the last quarter); t_1 = step - compression -
    communication; scaling factor t_1 / t_N in %, the same definition as plots/scaling.py."""
    from plots.settings import Context, Group
    from plots.tables import iteration_table
    searched = _table_run("a", [(0.5, 0.0, 0.1, 0.1)] * 3 + [(0.10, 0.01, 0.01, 0.02)] * 2, chosen_at=2)
    plain = _table_run("b", [(0.9, 0.0, 0.0, 0.0)] * 6 + [(0.16, 0.02, 0.06, 0.08)] * 2, chosen_at=None)
    ctx = Context("m", "d", "top1", 8, "1 Gbit/s", groups=[Group([searched], {}, "S"), Group([plain], {}, "P")])
    text, rows = iteration_table([ctx])
    assert [r["window"] for r in rows] == ["3-4", "6-7"]
    assert rows[0]["iteration_s"] == pytest.approx(0.10) and rows[0]["single_worker_s"] == pytest.approx(0.08)
    assert rows[0]["scaling_factor"] == pytest.approx(0.8) and rows[0]["chosen_at"] == 2
    assert rows[1]["scaling_factor"] == pytest.approx(0.08 / 0.16) and rows[1]["chosen_at"] is None
    assert "| S | 1 | 3-4 | 100.00 | 20.00 | 80.0 | 0 2 5 | 2 |" in text
    assert "| P | 1 | 6-7 | 160.00 | 80.00 | 50.0 | 0 2 5 | — |" in text
