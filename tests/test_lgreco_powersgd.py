"""L-GreCo over PowerSGD ranks (gravac/methods/lgreco_powersgd.py) on hand-computed cases: a single
candidate is method=powersgd bit for bit, the error table of a matrix with known singular values,
the budget on errors recomputed by SVD, a mixed assignment that sends less than uniform, resume,
the config error, and real runs (sim = ddp; method=powersgd at the same rank)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from gravac.cluster.comm import SimGroup
from gravac.cluster.netmodel import NetworkModel
from gravac.methods import RunStats, StepContext, build_method
from conftest import failure, make_run, run_cli, run_cli_many

W = 2
# two matrices that compress at every candidate (rank 4 on 10 x 20: (10 + 20)·4·2 >= 200, dense),
# a bias (always dense, outside the DP) and a 4-D conv weight viewed as 8 x 18
SHAPES = [(20, 25), (300,), (10, 20), (8, 2, 3, 3)]
SIZES = [int(math.prod(s)) for s in SHAPES]


def make(shapes=SHAPES, workers=W, **method):
    m = dict(name="lgreco_powersgd", candidates=[1, 2, 3, 4], rank=2, period=3, window=2)
    m.update(method)
    cfg = make_run(method=m)
    return build_method(cfg, SimGroup(workers, NetworkModel.from_cfg(cfg.network)), [int(math.prod(s)) for s in shapes],
                        torch.device("cpu"), shapes=shapes)


def ctx(step: int) -> StepContext:
    return StepContext(step=step, epoch=step / 4, lr=0.1, lr_decayed=False, compute_s=0.01, samples=W * 16)


def grads(step: int, ranks=range(W)) -> list[torch.Tensor]:
    """Tensor 0 nearly rank 1 (cheap to lower), tensor 2 full-rank noise (costly), the conv weight
    in between, so the DP has something to trade."""
    out = []
    for r in ranks:
        g = torch.Generator().manual_seed(1000 * step + r)
        x = torch.randn(sum(SIZES), generator=g) * 0.01
        u, v = torch.linspace(1, 2, 20), torch.linspace(-1, 1, 25)
        x[:500] += (3.0 + r) * torch.outer(u, v).reshape(-1)
        x[800:1000] = torch.randn(200, generator=g)
        out.append(x)
    return out


# --- a single candidate is PowerSGD -------------------------------------------------------------------

def test_single_candidate_is_powersgd_bit_for_bit():
    cfg = make_run(method=dict(name="powersgd", rank=2))
    psgd = build_method(cfg, SimGroup(W, NetworkModel.from_cfg(cfg.network)), SIZES, torch.device("cpu"), shapes=SHAPES)
    lg = make(candidates=[2])
    for s in range(10):
        a, b = psgd.step(grads(s), ctx(s)), lg.step(grads(s), ctx(s))
        assert torch.equal(a.grad, b.grad) and a.floats_sent == b.floats_sent and a.cf == b.cf, s
        if s in (3, 6, 9):
            assert b.extra["lgreco_solve"]["floats_predicted"] == b.floats_sent
    assert lg.tensor_ranks == [2] * 4
    for op in ("compensate", "p", "q", "approximate", "residual"):     # the same costs on the clock
        assert lg._op_key([2] * 4)(op) == psgd._op_key([2] * 4)(op)
    assert lg._op_key([1, 2, 2, 2])("p") != psgd._op_key([2] * 4)("p")


# --- the error table ------------------------------------------------------------------------------------

# singular values 3, 2, 1 (a signed permutation of diag(3, 2, 1)): optimal rank-r errors by hand
HAND = torch.tensor([[0., 2, 0], [3, 0, 0], [0, 0, 0], [0, 0, -1]])


def test_error_table_of_a_matrix_with_known_singular_values():
    """4 x 3, σ = (3, 2, 1): ||M − M_1|| = √(2² + 1²) = √5, ||M − M_2|| = 1, ||M − M_3|| = 0; rank 4
    is clipped to 3. Sizes (4 + 3)·r. An 8 x 6 matrix at torch's rate 2: rank 1 compresses (28 < 48),
    rank 2 does not (56 >= 48), so it is priced dense: 48 values, error 0."""
    m = make(shapes=[(4, 3), (3,), (8, 6)], candidates=[1, 2, 3, 4], rank=1, min_compression_rate=0.1)
    a = torch.cat([HAND.reshape(-1), torch.ones(3), torch.zeros(48)])
    errors, sizes = m.table(a, step=0)
    assert m.layers == [0, 2]
    np.testing.assert_allclose(errors[0], [math.sqrt(5), 1, 0, 0], atol=1e-12)
    assert sizes[0].tolist() == [7, 14, 21, 21]
    m2 = make(shapes=[(4, 3), (3,), (8, 6)], candidates=[1, 2], rank=1, error="squared")
    assert m2.layers == [2]                                # 4 x 3 at rate 2: 14 >= 12, always dense
    mat = torch.arange(48.).view(8, 6) % 5                 # any matrix: its rank-1 error from numpy's SVD
    s = np.linalg.svd(mat.double().numpy(), compute_uv=False)
    errors, sizes = m2.table(torch.cat([HAND.reshape(-1), torch.ones(3), mat.reshape(-1)]), step=0)
    np.testing.assert_allclose(errors[0], [(s[1:] ** 2).sum(), 0.0], rtol=1e-12)
    assert sizes[0].tolist() == [14, 48]


def test_power_iterations_approach_the_svd_error_and_are_seeded():
    """error_method=power (the code's default): never below the optimal error of σ = (3, 2, 1),
    the same numbers every time (Q seeded), and at the optimum once the iterations converge."""
    a = HAND.reshape(-1)
    m = make(shapes=[(4, 3)], candidates=[1, 2], rank=1, min_compression_rate=0.1, error_method="power")
    errors, _ = m.table(a, step=5)
    assert errors[0, 0] >= math.sqrt(5) - 1e-12 and errors[0, 1] >= 1 - 1e-12
    assert np.array_equal(errors, m.table(a, step=5)[0])
    many = make(shapes=[(4, 3)], candidates=[1, 2], rank=1, min_compression_rate=0.1, error_method="power",
                power_iters=60)
    np.testing.assert_allclose(many.table(a, step=5)[0][0], [math.sqrt(5), 1], rtol=1e-9)


# --- the DP's choice --------------------------------------------------------------------------------------

def test_mixed_ranks_send_less_than_uniform_within_the_budget():
    """Tensor 0 is HAND (errors √5, 1, 0 at ranks 1, 2, 3), tensor 1 has rank 1 (error 0 at every
    rank). Budget = uniform rank 2's error = 1 + 0. Cheapest within it: tensor 0 at rank 2 (14
    values), tensor 1 at rank 1 (7): 21 values instead of uniform rank 2's 28."""
    m = make(shapes=[(4, 3), (4, 3)], candidates=[1, 2, 3], rank=2, min_compression_rate=0.1)
    low = torch.zeros(4, 3)
    low[2, 1] = 5.0                        # rank 1, singular values (5, 0, 0) exactly
    rec = m.solve_on(torch.cat([HAND.reshape(-1), low.reshape(-1)]), step=3)
    assert rec["ranks"] == [2, 1]
    assert rec["error_budget"] == pytest.approx(1.0) and rec["error_default"] == pytest.approx(1.0)
    assert rec["error_predicted"] == pytest.approx(1.0) and rec["error_predicted"] <= rec["error_budget"]
    assert (rec["floats_predicted"], rec["floats_default"], rec["fallback"]) == (21, 28, None)
    half = make(shapes=[(4, 3), (4, 3)], candidates=[1, 2, 3], rank=2, min_compression_rate=0.1, budget_scale=0.5)
    rec = half.solve_on(torch.cat([HAND.reshape(-1), low.reshape(-1)]), step=3)
    assert rec["ranks"] == [3, 1] and rec["floats_predicted"] == 28          # half the error: rank 3 where it helps


def _svd_errors(a: torch.Tensor, m, ranks: list[int]) -> float:
    """Σ over the DP's tensors of the optimal error at `ranks`, by numpy (0 where sent dense)."""
    from compressors.lowrank import compresses, matrix_shape
    total = 0.0
    for i in m.layers:
        n, k = matrix_shape(SHAPES[i])
        if compresses(SHAPES[i], ranks[i], m.cfg.min_compression_rate):
            s = np.linalg.svd(a[m.offsets[i]:m.offsets[i] + n * k].view(n, k).double().numpy(), compute_uv=False)
            total += math.sqrt((s[min(ranks[i], len(s)):] ** 2).sum())
    return total


def test_budget_holds_on_recomputed_errors_and_the_levels_are_mixed():
    """At every solve, the chosen ranks' error on rank 0's window mean (recomputed here by numpy's
    SVD) is within the budget, the default's error is the budget, the choice sends no more than
    uniform rank 2, the step sends what was predicted, and some solve mixes ranks for fewer floats."""
    m = make()
    assert m.layers == [0, 2, 3]
    window, solves, mixed = [], 0, False
    for s in range(13):
        gs = grads(s)
        comp0 = gs[0] + m.residuals[0]
        res = m.step(gs, ctx(s))
        if "lgreco_solve" in res.extra:
            solves += 1
            rec, a = res.extra["lgreco_solve"], torch.stack(window).mean(0)
            assert _svd_errors(a, m, [2] * 4) == pytest.approx(rec["error_budget"], rel=1e-9)
            assert _svd_errors(a, m, m.tensor_ranks) <= rec["error_budget"] * (1 + 1e-12)
            assert rec["error_predicted"] <= rec["error_budget"]
            assert rec["floats_predicted"] <= rec["floats_default"] == 2 * (45 + 30 + 26) + 300
            assert rec["floats_measured"] == rec["floats_predicted"] == res.floats_sent
            if len({m.tensor_ranks[i] for i in m.layers}) > 1 and rec["floats_predicted"] < rec["floats_default"]:
                mixed = True
            window = []
        if s % 3 >= 1:
            window.append(comp0)
    assert solves == 4 and mixed
    assert m.levels()[1] is None                                   # the bias: dense, not in the DP
    for i in m.layers:                                             # a changed rank: Q at that rank
        if m.tensor_ranks[i] in (1, 2, 3):
            assert m.qs[i].shape[1] == m.tensor_ranks[i]


def test_summary_histogram_shares_and_explanation():
    m = make()
    results = [m.step(grads(s), ctx(s)) for s in range(7)]
    stats = RunStats([{"step": s, "epoch": s / 4, "floats_sent": r.floats_sent, **r.extra}
                      for s, r in enumerate(results)], 4)
    summary = m.summarize(stats)
    hist, shares = summary["layer_rank_histogram"], summary["parameter_rank_share"]
    assert sum(hist.values()) == 7 * 4 and hist["dense"] == 7 and list(hist)[-1] == "dense"
    assert shares["dense"] == pytest.approx(300 / sum(SIZES)) and sum(shares.values()) == pytest.approx(1.0)
    assert summary["layer_sizes"] == SIZES and summary["level_unit"] == "rank"
    assert type(m).describe(m.cfg, make_run(method=dict(name="lgreco_powersgd")).compressor)["level_unit"] == "rank"
    line = m.explain(stats)
    assert line.startswith("L-GreCo (PowerSGD) solved 2 time(s)") and "parameter-steps per rank" in line
    assert "never solved" in make(period=50).explain(RunStats([{"step": 0, "epoch": 0, "floats_sent": 1}], 4))


# --- checkpoints and configuration ----------------------------------------------------------------------------

def test_checkpoint_resumes_exactly():
    """Resumed mid-window (step 5: one window step summed, ranks already changed at step 3)."""
    a, b = make(), make()
    for s in range(5):
        a.step(grads(s), ctx(s))
    b.load_state_dict(a.state_dict())
    assert b.tensor_ranks == a.tensor_ranks and b.window.count == a.window.count == 1
    for s in range(5, 13):
        x, y = a.step(grads(s), ctx(s)), b.step(grads(s), ctx(s))
        extra_y = {k: v for k, v in y.extra.items() if k != "lgreco_levels" or s > 5}
        assert torch.equal(x.grad, y.grad) and x.extra == extra_y and x.floats_sent == y.floats_sent, s


def test_default_rank_must_be_a_candidate():
    from gravac.config.compose import ConfigError
    with pytest.raises(ConfigError, match=r"method.rank=8 must be one of method.candidates=\[1, 2, 3, 4\]"):
        make_run(method=dict(name="lgreco_powersgd", rank=8))
    with pytest.raises(ConfigError, match="window=5 must be <="):
        make_run(method=dict(name="lgreco_powersgd", window=5, period=3))
    with pytest.raises(ConfigError, match="candidates"):
        make_run(method=dict(name="lgreco_powersgd", candidates=[1.5, 2]))


def test_cli_config_error_is_one_line():
    r = run_cli(["method=lgreco_powersgd", "method.rank=8", "train.steps=1", "logger.progress=false"], timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr + r.stdout
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "method.rank=8 must be one of method.candidates=[1, 2, 3, 4]" in lines[0], r.stderr


# --- real runs --------------------------------------------------------------------------------------------------

SMALL = ["dataset.image_size=8", "dataset.train_size=64", "dataset.test_size=32", "model.width=4",
         "train.batch_size=8", "train.eval_every=100", "logger.progress=false", "cluster.workers=2",
         "cluster.threads=1", "train.lr=0.02"]


def _steps(root) -> list[dict]:
    (run,) = [p for p in root.glob("*/*") if p.is_dir()]
    return [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]


def _summary(root) -> dict:
    (run,) = [p for p in root.glob("*/*") if p.is_dir()]
    return json.loads((run / "summary.json").read_text())


@pytest.mark.slow   # 14-33 s: the default suite stays near 15 min; CI runs it with -m slow
def test_cli_single_candidate_equals_powersgd_and_ddp_equals_sim(tmp_path):
    """Real training: candidates=[2] equals method=powersgd rank 2 loss for loss; with several
    candidates the ranks and floats are the same on cluster=ddp as on cluster=sim."""
    lg = ["method=lgreco_powersgd", "method.candidates=[1,2,3,4]", "method.rank=2", "method.period=3",
          "method.window=2", "train.steps=10"]
    runs = {"powersgd": ["method=powersgd", "method.rank=2", "train.steps=6"],
            "single": ["method=lgreco_powersgd", "method.candidates=[2]", "method.rank=2", "method.period=2",
                       "method.window=1", "train.steps=6"],
            "sim": [*lg, "cluster=sim"], "ddp": [*lg, "cluster=ddp"]}
    jobs = [dict(args=[*SMALL, f"experiment.results_root={tmp_path / k}", *v], timeout=300) for k, v in runs.items()]
    for k, r in zip(runs, run_cli_many(jobs)):
        assert r.returncode == 0, f"{k}: {failure(r)}"
    psgd, single = _steps(tmp_path / "powersgd"), _steps(tmp_path / "single")
    assert [s["loss"] for s in psgd] == [s["loss"] for s in single]
    assert [s["floats_sent"] for s in psgd] == [s["floats_sent"] for s in single]
    sim, ddp = _steps(tmp_path / "sim"), _steps(tmp_path / "ddp")
    levels = [(s["step"], s["lgreco_levels"]) for s in sim if "lgreco_levels" in s]
    assert levels == [(s["step"], s["lgreco_levels"]) for s in ddp if "lgreco_levels" in s]
    assert any(v is None for v in levels[0][1])                      # 1-D tensors: dense, outside the DP
    assert [s["step"] for s in sim if "lgreco_solve" in s] == [3, 6, 9]
    for x, y in zip(sim, ddp):
        assert x["floats_sent"] == y["floats_sent"]
        assert math.isclose(x["loss"], y["loss"], rel_tol=1e-4, abs_tol=1e-5), (x["step"], x["loss"], y["loss"])
    summary = _summary(tmp_path / "sim")
    assert summary["method_summary"]["level_unit"] == "rank" and summary["explanation"].startswith("L-GreCo (PowerSGD)")


@pytest.mark.slow
def test_cli_resume_equals_uninterrupted(tmp_path):
    """A run stopped at step 5 (mid-window, after the solve at 3) and resumed to 10 records the same
    losses, floats and solves as one run of 10 steps: residuals, Qs, ranks and the window sum are
    checkpointed."""
    args = [*SMALL, "method=lgreco_powersgd", "method.period=3", "method.window=2", "train.checkpoint_every=5"]
    for cmd in ([*args, "train.steps=10", f"experiment.results_root={tmp_path / 'a'}"],
                [*args, "train.steps=5", f"experiment.results_root={tmp_path / 'b'}"]):
        r = run_cli(cmd, timeout=300)
        assert r.returncode == 0, failure(r)
    (run_b,) = [p for p in (tmp_path / "b").glob("*/*") if p.is_dir()]
    r = run_cli([*args, "train.steps=10", f"experiment.results_root={tmp_path / 'b'}", f"experiment.resume={run_b}"],
                timeout=300)
    assert r.returncode == 0, failure(r)
    a, b = _steps(tmp_path / "a"), _steps(tmp_path / "b")
    keys = ("step", "loss", "floats_sent", "lgreco_solve")
    assert [[x.get(k) for k in keys] for x in a] == [[x.get(k) for k in keys] for x in b]
    assert [x["step"] for x in a if "lgreco_solve" in x] == [3, 6, 9]
