"""PowerSGD (gravac/methods/powersgd.py) on hand-computed cases, and Accordion switching its rank."""
from __future__ import annotations

import pytest
import torch
from conftest import failure, make_run

from compressors.lowrank import compresses, orthogonalise
from gravac.cluster.comm import SimGroup
from gravac.methods import StepContext, build_method
from gravac.cluster.netmodel import NetworkModel

W = 2


def make(shapes, sizes=None, **method):
    cfg = make_run(method={"name": "powersgd", **method})
    sizes = sizes or [int(torch.Size(s).numel()) for s in shapes]
    return build_method(cfg, SimGroup(W, NetworkModel.from_cfg(cfg.network)), sizes, torch.device("cpu"),
                        shapes=shapes)


def ctx(step: int, spe: int = 4, decayed: bool = False) -> StepContext:
    return StepContext(step=step, epoch=step / spe, lr=0.1, lr_decayed=decayed, compute_s=0.01, samples=W * 8)


# a 4x3 matrix and a bias on two workers; Q = e1 is given, so every number below is by hand
M1 = torch.tensor([[2., 1, 0], [4, 0, 5], [0, 0, 2], [0, 0, 0]])
M2 = torch.tensor([[4., 2, 0], [4, 1, 0], [0, -1, 0], [0, 0, 1]])
B1, B2 = torch.tensor([1., 2, 3]), torch.tensor([3., 2, 1])


def hand_case(**method):
    m = make([(4, 3), (3,)], rank=1, epsilon=0.0, min_compression_rate=1.0, **method)
    m.qs[0] = torch.tensor([[1.], [0.], [0.]])
    grads = [torch.cat([M1.reshape(-1), B1]), torch.cat([M2.reshape(-1), B2])]
    return m, grads, m.step(grads, ctx(0))


def test_hand_computed_4x3_rank_1():
    m, _, res = hand_case()
    # P_w = M_w e1 = first columns; mean P = (3, 4, 0, 0); orthogonalised: (0.6, 0.8, 0, 0)
    # Q_w = M_wᵀ P̂: (4.4, 0.6, 4.0) and (5.6, 2.0, 0.0); mean Q = (5.0, 1.3, 2.0)
    approx = torch.tensor([[3.0, 0.78, 1.2], [4.0, 1.04, 1.6], [0, 0, 0], [0, 0, 0]])     # P̂ Qᵀ
    torch.testing.assert_close(res.grad[:12], approx.reshape(-1))
    torch.testing.assert_close(res.grad[12:], torch.tensor([2., 2., 2.]))                 # the bias, dense
    torch.testing.assert_close(m.qs[0], torch.tensor([[5.0], [1.3], [2.0]]))               # kept: warm start
    torch.testing.assert_close(m.residuals[0][:12], (M1 - approx).reshape(-1))
    torch.testing.assert_close(m.residuals[1][:12], (M2 - approx).reshape(-1))
    assert m.residuals[0][12:].abs().sum() == 0                                           # dense: nothing kept
    assert res.floats_sent == (4 + 3) * 1 + 3 and res.cf == 15 / 10
    assert len(res.comm.messages) == 3                                                    # bias, P, Q
    assert res.comm.wire_bytes == 4 * 10


def test_orthogonalise_rank_2_by_hand():
    out = orthogonalise(torch.tensor([[3., 1], [4, 0], [0, 0]]))
    # column 1: (3, 4, 0)/5; column 2: (1, 0, 0) − 0.6·(0.6, 0.8, 0) = (0.64, −0.48, 0), norm 0.8
    torch.testing.assert_close(out, torch.tensor([[0.6, 0.8], [0.8, -0.6], [0, 0]]))
    zero = orthogonalise(torch.zeros(3, 1), eps=1e-8)
    assert torch.equal(zero, torch.zeros(3, 1))                                            # eps: no NaN


@pytest.mark.parametrize("shape,rank,rate,expected", [
    ((4, 3), 1, 2.0, False),      # (4 + 3)·1·2 = 14 >= 12
    ((4, 3), 1, 1.0, True),       # 7 < 12
    ((8, 6), 1, 2.0, True),       # 28 < 48
    ((4, 2, 3, 3), 1, 2.0, True),     # viewed as 4 x 18: 44 < 72
    ((4, 2, 3, 3), 2, 2.0, False),    # 88 >= 72
    ((2, 50), 4, 2.0, False),     # rank clipped to 2: 208 >= 100
    ((2, 50), 4, 0.5, True),      # 52 < 100
    ((100,), 1, 0.001, False),    # 1-D never compresses
])
def test_compress_iff_rule(shape, rank, rate, expected):
    assert compresses(shape, rank, rate) is expected


def test_one_d_tensors_and_tensors_that_would_not_compress_go_dense():
    m = make([(6,), (4, 3), (16, 16)], rank=1, min_compression_rate=0.01)
    plan = m.plan([1, 1, 1])
    assert [i for i, *_ in plan.low] == [1, 2] and plan.dense == [(0, 6)]
    m = make([(6,), (4, 3), (16, 16)], rank=1)                  # torch's default rate 2: 4x3 dense
    plan = m.plan([1, 1, 1])
    assert [i for i, *_ in plan.low] == [2] and plan.dense == [(0, 6), (6, 12)]
    g = [torch.randn(274, generator=torch.Generator().manual_seed(w)) for w in range(W)]
    res = m.step(g, ctx(0))
    assert res.floats_sent == plan.floats == 18 + 32 and len(res.comm.messages) == 3
    torch.testing.assert_close(res.grad[:18], (g[0][:18] + g[1][:18]) / 2)


def test_warm_start_keeps_q_and_uses_it_orthogonalised():
    m, grads, _ = hand_case()
    comps = [g + r for g, r in zip(grads, m.residuals)]
    q = torch.tensor([[5.0], [1.3], [2.0]]) / torch.tensor([5.0, 1.3, 2.0]).norm()
    p = sum(c[:12].view(4, 3) @ q for c in comps) / W
    p = p / p.norm()
    qn = sum(c[:12].view(4, 3).T @ p for c in comps) / W
    res = m.step(grads, ctx(1))
    torch.testing.assert_close(res.grad[:12], (p @ qn.T).reshape(-1))
    torch.testing.assert_close(m.qs[0], qn)


def test_without_warm_start_q_is_drawn_afresh():
    m, grads, _ = hand_case(warm_start=False)
    assert list(m.qs) == [0] and torch.equal(m.qs[0], torch.tensor([[1.], [0.], [0.]]))   # none kept
    a = m.step(grads, ctx(1)).grad
    m2, _, _ = hand_case(warm_start=False)
    assert torch.equal(m2.step(grads, ctx(1)).grad, a)                      # seeded: reproducible
    m3, _, _ = hand_case()
    assert not torch.allclose(m3.step(grads, ctx(1)).grad, a)              # warm start differs


def test_error_feedback_conserves_the_gradient():
    """Σ_t mean_w g = Σ_t averaged approximation + mean_w residual: nothing is lost, only delayed."""
    m = make([(8, 6), (6,), (5, 4, 2)], rank=1)
    total_g, total_out = torch.zeros(m.numel, dtype=torch.float64), torch.zeros(m.numel, dtype=torch.float64)
    for s in range(6):
        g = [torch.randn(m.numel, generator=torch.Generator().manual_seed(10 * s + w)) for w in range(W)]
        total_g += sum(x.double() for x in g) / W
        total_out += m.step(g, ctx(s)).grad.double()
    kept = sum(r.double() for r in m.residuals) / W
    torch.testing.assert_close(total_out + kept, total_g, rtol=0, atol=1e-5)
    assert kept.abs().sum() > 0


def test_start_step_sends_dense_first():
    m = make([(8, 6)], rank=1, start_step=2)
    g = [torch.randn(48, generator=torch.Generator().manual_seed(w)) for w in range(W)]
    assert [m.step(g, ctx(s)).floats_sent for s in range(3)] == [48, 48, 14]


def test_checkpoint_round_trip_continues_identically():
    a, grads, _ = hand_case()
    b, _, _ = hand_case()
    b.qs, b.residuals = {}, [torch.zeros_like(r) for r in b.residuals]
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.step(grads, ctx(1)).grad, b.step(grads, ctx(1)).grad)


# --- Accordion with PowerSGD ---------------------------------------------------------------
SHAPES = [(20, 20), (10, 30), (30, 10)]


def accordion(**method):
    cfg = make_run(method={"name": "accordion_powersgd", "switch_freq": 2, "eta": 0.5, **method})
    return build_method(cfg, SimGroup(W, NetworkModel.from_cfg(cfg.network)), [400, 300, 300],
                        torch.device("cpu"), shapes=SHAPES)


def trajectory(step: int) -> list[torch.Tensor]:
    """A steady direction per worker with noise; layer 1 triples from epoch 2 (a critical regime)."""
    out = []
    for w in range(W):
        g = torch.randn(1000, generator=torch.Generator().manual_seed(100 * step + w)) * 0.1
        g += torch.linspace(1, 2, 1000)
        if step // 4 >= 2:
            g[400:700] *= 3
        out.append(g)
    return out


def test_accordion_powersgd_switches_rank_on_a_critical_regime():
    m = accordion()
    res = [m.step(trajectory(s), ctx(s, decayed=s == 17)) for s in range(20)]
    # every layer compresses at rank 2 and 1: (n + m)·r·2 < n·m. Rank 2 everywhere: 2·(40 + 40 + 40)
    # floats; after epoch 2's check (step 12) only layer 1 stays at rank 2: 40 + 80 + 40; rank 2
    # everywhere again after the decay at step 17
    assert [r.floats_sent for r in res] == [240] * 12 + [160] * 5 + [240] * 3
    assert [r.extra["cf_low_layers"] for r in res] == [3] * 12 + [1] * 5 + [3] * 3
    check = res[12].extra["accordion_decision"]
    assert check["epoch"] == 2 and check["low_layers"] == [1] and check["ratios"][1] == pytest.approx(2.0, rel=0.05)
    assert res[17].extra["accordion_decision"]["reason"] == "lr_decay"
    assert m.qs[0].shape == (20, 2) and m.qs[1].shape == (30, 2)            # fresh Q at the new rank
    line = m.explain(_stats(res))
    assert "rank 1 on some layers at 5 of 20 steps (from step 12" in line


def _stats(results):
    from gravac.methods import RunStats
    return RunStats([{"step": s, "epoch": s / 4, "floats_sent": r.floats_sent, **r.extra}
                     for s, r in enumerate(results)], 4)


def test_accordion_powersgd_refuses_a_critical_rank_below_the_other():
    from gravac.config.compose import ConfigError
    with pytest.raises(ConfigError, match="rank_critical=1 must be >= method.rank=2"):
        make_run(method={"name": "accordion_powersgd", "rank": 2, "rank_critical": 1})


@pytest.mark.slow
def test_accordion_powersgd_resume_equals_uninterrupted(tmp_path):
    """A run stopped at step 6 and resumed to 12 records the same losses and floats as one run of
    12 steps: residuals, kept Qs and regimes are checkpointed (the ranks switch at step 8)."""
    import json

    from conftest import run_cli
    args = ["method=accordion_powersgd", "method.switch_freq=1", "train.eval_every=4", "train.checkpoint_every=4",
            "logger.progress=false", "dataset.image_size=8", "dataset.train_size=64", "dataset.test_size=32",
            "model.width=4", "cluster.workers=2", "cluster.threads=1", "train.batch_size=8"]

    def records(root):
        (run,) = [p for p in root.glob("*/*") if p.is_dir()]
        return run, [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]

    for cmd in ([*args, "train.steps=12", f"experiment.results_root={tmp_path / 'a'}"],
                [*args, "train.steps=6", f"experiment.results_root={tmp_path / 'b'}"]):
        r = run_cli(cmd)
        assert r.returncode == 0, failure(r)
    run_b, _ = records(tmp_path / "b")
    r = run_cli([*args, "train.steps=12", f"experiment.results_root={tmp_path / 'b'}", f"experiment.resume={run_b}"])
    assert r.returncode == 0, failure(r)
    (_, a), (_, b) = records(tmp_path / "a"), records(tmp_path / "b")
    keys = ("step", "loss", "floats_sent", "cf_low_layers")
    assert [[x[k] for k in keys] for x in a] == [[x[k] for k in keys] for x in b]
    assert len({x["floats_sent"] for x in a}) == 2                  # the ranks did switch
