"""DDP comm hooks (gravac/hooks/hooks.py): hand-computed sparse steps, GraVAC's one-step lag against the
in-loop method, bucket rebuilds, and (slow) real DDP on 2 gloo processes against the static Method
at bucket granularity, plus the README's example run as written."""
from __future__ import annotations

import datetime
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from conftest import ROOT, failure, gloo_ranks, make_run

from compressors.base import mix_seed
from gravac.cluster.comm import SimGroup
from gravac.hooks import GraVACState, SparseState, gravac_hook, sparse_hook
from gravac.methods import StepContext
from gravac.methods.base import METHODS, MethodEnv
from gravac.cluster.netmodel import NetworkModel


class FakeBucket:
    """What DDP hands a hook: a bucket's flat local gradient, its index and whether it is last."""

    def __init__(self, index: int, sizes: list[int], grad: torch.Tensor, last: bool):
        self._index, self._buf, self._last, self._sizes = index, grad.clone(), last, sizes

    def index(self):
        return self._index

    def buffer(self):
        return self._buf

    def gradients(self):
        return list(torch.split(self._buf, self._sizes))

    def is_last(self):
        return self._last


def solo_group():
    """A 1-rank gloo group that touches no global state (no init_process_group)."""
    return dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=20))


def run_buckets(state, hook, buckets: list[tuple[list[int], torch.Tensor]]) -> list[torch.Tensor]:
    """One step: every (sizes, grad) bucket through the hook in order; the averaged buckets."""
    futs = [hook(state, FakeBucket(i, sizes, g, i == len(buckets) - 1)) for i, (sizes, g) in enumerate(buckets)]
    return [f.wait().clone() for f in futs]


def test_sparse_hook_hand_computed_topk_with_error_feedback():
    state = SparseState(solo_group(), compressor="topk", cf=2, granularity="flat")
    (out,) = run_buckets(state, sparse_hook, [([4], torch.tensor([3.0, -1.0, 0.5, 4.0]))])
    assert out.tolist() == [3.0, 0.0, 0.0, 4.0]
    assert state.last == {"step": 0, "floats_sent": 2.0, "wire_bytes": 2 * 8 + 8, "numel": 4, "cf": 2.0}
    (out,) = run_buckets(state, sparse_hook, [([4], torch.zeros(4))])     # only the residual is left
    assert out.tolist() == [0.0, -1.0, 0.5, 0.0]
    assert state.iteration == 2 and state.floats_total == 4.0


def test_sparse_hook_layer_granularity_and_bucket_rebuild():
    """layer: each parameter tensor keeps its own top half; a bucket whose layout changes starts
    with a zero residual (DDP rebuilds buckets after the first iteration)."""
    state = SparseState(solo_group(), compressor="topk", cf=2)
    out = run_buckets(state, sparse_hook, [([2, 2], torch.tensor([1.0, 2.0, -5.0, 4.0])),
                                           ([2], torch.tensor([7.0, 8.0]))])
    assert [o.tolist() for o in out] == [[0.0, 2.0, -5.0, 0.0], [0.0, 8.0]]
    assert state.last["floats_sent"] == 3 and state.last["cf"] == 2.0
    out = run_buckets(state, sparse_hook, [([4], torch.zeros(4)), ([2], torch.zeros(2))])
    assert out[0].tolist() == [0.0] * 4                   # new layout: the residual [1, 0, 0, 4] is gone
    assert out[1].tolist() == [7.0, 0.0]                  # same layout: the residual is sent


def test_state_errors_are_one_line():
    g = solo_group()
    cases = [(lambda: SparseState(g, compressor="nope"), "unknown compressor 'nope'; choose one of: "),
             (lambda: SparseState(g, compressor="topk", bogus=1), "unknown option(s) bogus for compressor 'topk'"),
             (lambda: SparseState(g, cf=0.5), "compressor.cf=0.5 is out of range"),
             (lambda: GraVACState(g, cf=10), "GraVAC chooses its own CF"),
             (lambda: GraVACState(g, cf_min=100, cf_max=10), "gravac.cf_max=10.0 must be >= gravac.cf_min=100.0"),
             (lambda: GraVACState(g, policy="linear"), "gravac.policy='linear' is not valid")]
    for make, text in cases:
        with pytest.raises(ValueError) as e:
            make()
        assert text in str(e.value) and "\n" not in str(e.value)
    assert "topk" in str(pytest.raises(ValueError, SparseState, g, compressor="nope").value)
    with pytest.raises(TypeError, match="needs a GraVACState, got SparseState"):
        gravac_hook(SparseState(g), FakeBucket(0, [2], torch.ones(2), True))


def test_options_of_the_wrong_type_are_one_line():
    """Keywords are checked as config is (gravac.core.check.checked): the option, its value and what
    is valid, in one line; no Python TypeError from deep inside."""
    from gravac.hooks.covap_hook import CovapState
    g = solo_group()
    cases = [(lambda: SparseState(g, cf="abc"), "compressor.cf='abc' is not a number"),
             (lambda: SparseState(g, seed="x"), "SparseState.seed='x' is not an integer"),
             (lambda: SparseState(g, momentum="x"), "SparseState.momentum='x' is not a number"),
             (lambda: SparseState(g, compressor="dgc", sample_ratio="x"), "compressor.sample_ratio='x' is not a number"),
             (lambda: GraVACState(g, epsilon="x"), "gravac.epsilon='x' is not a number"),
             (lambda: GraVACState(g, batch_size="x"), "GraVACState.batch_size='x' is not an integer"),
             (lambda: CovapState(g, drop_rate=2, ef_init="x"), "covap.ef_init='x' is not a number")]
    for make, text in cases:
        with pytest.raises(ValueError) as e:
            make()
        assert text in str(e.value) and "\n" not in str(e.value)


def test_empty_parameters_send_nothing():
    """An empty parameter (numel 0) in a bucket, at per-layer granularity: skipped, the other
    tensors compressed as without it (Random-k's per-layer seeds keep their layer numbers, so its
    draws differ, not its counts)."""
    g = torch.tensor([3.0, -1.0, 0.5, 4.0, 2.0, -6.0])
    with_empty = run_buckets(SparseState(solo_group(), cf=2), sparse_hook, [([4, 0, 2], g)])
    without = run_buckets(SparseState(solo_group(), cf=2), sparse_hook, [([4, 2], g)])
    assert torch.equal(with_empty[0], without[0])
    state = SparseState(solo_group(), compressor="randomk", cf=2)
    (out,) = run_buckets(state, sparse_hook, [([4, 0, 2], g)])
    assert state.last["floats_sent"] == 3 and int((out[:4] != 0).sum()) == 2 and int((out[4:] != 0).sum()) == 1
    state = GraVACState(solo_group(), compressor="topk", cf_min=2, cf_max=4, window=2, gain="code")
    for _ in range(3):                                       # dense, then compressed (+ recompressed)
        (out,) = run_buckets(state, gravac_hook, [([0, 4, 0, 2, 0], g)])
        assert out.shape == g.shape


SIZES = [[300, 200], [400, 100]]            # two buckets of two parameter tensors each
GRAVAC = dict(cf_min=4, cf_max=64, window=4, step=2, epsilon=0.6, omega=0.0, ewma=0.5, error_feedback=False)


def lag_grad(step: int) -> torch.Tensor:
    """A few large entries over small noise, their number changing with the step, so the gains
    cross epsilon both ways."""
    g = torch.Generator().manual_seed(step)
    n = sum(map(sum, SIZES))
    x = 0.05 * torch.randn(n, generator=g)
    x[torch.randperm(n, generator=g)[: [5, 60, 300][step % 3]]] += 3.0
    return x


@pytest.mark.parametrize("gain", [{}, dict(gain="code", gain_window=2, epsilon=0.7)], ids=["paper", "code"])
def test_gravac_hook_applies_the_in_loop_decision_one_step_later(gain):
    """Without error feedback the gains depend on the gradients alone, so the hook's level at step
    i+1 must be the in-loop method's level at step i, and cf_min / cs must follow the same path."""
    steps, n0, opts = 14, sum(SIZES[0]), {**GRAVAC, **gain}
    state = GraVACState(solo_group(), compressor="topk", **opts)
    cfg = make_run(method=dict(name="gravac", **{k: v for k, v in opts.items() if k != "error_feedback"}),
                   compressor=dict(name="topk", error_feedback=False))
    method = METHODS["gravac"].target(cfg.method, cfg.compressor, MethodEnv(
        SimGroup(1, NetworkModel.from_cfg(cfg.network)), [s for b in SIZES for s in b], torch.device("cpu")))
    hook_levels, loop_levels = [], []
    for i in range(steps):
        g = lag_grad(i)
        run_buckets(state, gravac_hook, [(SIZES[0], g[:n0]), (SIZES[1], g[n0:])])
        hook_levels.append((state.last["level"], state.last["cf_min"], state.last["cs"]))
        rec = method.step([g], StepContext(step=i, epoch=0.0, lr=0.1, lr_decayed=False, compute_s=0.01,
                                           samples=1)).extra
        loop_levels.append((rec["level"], rec["cf_min"], rec["cs"]))
    assert hook_levels[0][0] == "dense"
    assert len({lv for lv, _, _ in loop_levels}) >= 2          # the case does switch levels
    for i in range(1, steps):
        if loop_levels[i - 1][1:] == loop_levels[i][1:]:       # no window update in between
            assert hook_levels[i] == (loop_levels[i - 1][0], *loop_levels[i][1:]), i
    assert [h[1:] for h in hook_levels] == [lp[1:] for lp in loop_levels]
    assert state.last["level"] == "min" and state.last["floats_sent"] == 75 + 50 + 100 + 25   # cf_min 4, per tensor


# --- real DDP on 2 gloo processes ------------------------------------------------------------------
WORLD, DDP_STEPS = 2, 4
COMPRESSORS_DDP = {"topk": dict(compressor="topk", cf=4), "dgc": dict(compressor="dgc", cf=4),
                   "randomk": dict(compressor="randomk", cf=4),
                   "qsgd": dict(compressor="qsgd", levels=7, bucket=16), "efsignsgd": dict(compressor="efsignsgd"),
                   "fp16": dict(compressor="fp16"), "bf16": dict(compressor="bf16", error_feedback=True)}


def test_sparse_hook_quantizer_by_hand():
    """EF-SignSGD through the hook: sign x mean |x| (2.125) sent as 4 bits and a float32; on one
    rank the average is what was sent; GraVAC and a set cf refuse quantizers in one line."""
    state = SparseState(solo_group(), compressor="efsignsgd", granularity="flat")
    (out,) = run_buckets(state, sparse_hook, [([4], torch.tensor([3.0, -1.0, 0.5, 4.0]))])
    assert out.tolist() == [2.125, -2.125, 2.125, 2.125]
    assert state.last == {"step": 0, "floats_sent": 5 / 4, "wire_bytes": 1 + 4, "numel": 4, "cf": 4 / (5 / 4)}
    (out,) = run_buckets(state, sparse_hook, [([4], torch.zeros(4))])     # the residual is sent next
    assert out.tolist() == [1.375, 1.375, -1.375, 1.375]     # residual 0.875 1.125 -1.625 1.875, mean 1.375
    with pytest.raises(ValueError, match="^GraVAC chooses compression factors, and compressor='qsgd'"):
        GraVACState(solo_group(), compressor="qsgd")
    with pytest.raises(ValueError, match=r"^compressor.cf=10(\.0)? is out of range"):
        SparseState(solo_group(), compressor="qsgd", cf=10)


class Shuffled(torch.nn.Module):
    """Parameters registered in another order than backward reaches them, so DDP's bucket
    rebuild after the first iteration changes the buckets."""

    def __init__(self):
        super().__init__()
        self.c = torch.nn.Linear(16, 4)
        self.a = torch.nn.Linear(8, 32)
        self.b = torch.nn.Linear(32, 16)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def _train(rank: int, state, hook, steps: int):
    """DDP training of Shuffled with `hook`; per step per bucket (index, sizes, local, averaged)."""
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(Shuffled(), bucket_cap_mb=0.002)
    seen = []

    def recording(st, bucket):
        local, sizes = bucket.buffer().clone(), [g.numel() for g in bucket.gradients()]
        return hook(st, bucket).then(lambda f: seen.append((bucket.index(), sizes, local, f.value().clone()))
                                     or f.value())
    model.register_comm_hook(state, recording)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    steps_out = []
    for _ in range(steps):
        seen.clear()
        x = torch.randn(16, 8, generator=g)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        steps_out.append({"buckets": sorted(seen, key=lambda s: s[0]), "last": dict(state.last)})
    return steps_out, [p.detach().clone() for p in model.parameters()]


def _ddp_work(rank: int) -> dict:
    res = {name: _train(rank, SparseState(None, **opts), sparse_hook, DDP_STEPS)
           for name, opts in COMPRESSORS_DDP.items()}
    res["gravac"] = _train(rank, GraVACState(None, compressor="topk", cf_min=2, cf_max=16, window=3,
                                             epsilon=0.3, ewma=0.5), gravac_hook, 8)
    return res


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory):
    return gloo_ranks(_ddp_work, tmp_path_factory.mktemp("hooks"), WORLD, 180)


def static_method(opts: dict, sizes: list[int], index: int):
    """The project's static Method on one bucket, with the hook's per-bucket seed."""
    cfg = make_run(method=dict(name="static"),
                   compressor=dict(name=opts["compressor"], **{k: v for k, v in opts.items() if k != "compressor"}))
    env = MethodEnv(SimGroup(WORLD, NetworkModel.from_cfg(cfg.network)), sizes, torch.device("cpu"),
                    seed=mix_seed(0, index))
    return METHODS["static"].target(cfg.method, cfg.compressor, env)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(COMPRESSORS_DDP))
def test_ddp_hook_equals_static_method_per_bucket(ddp_runs, name):
    """Every averaged bucket equals the static Method's output on both ranks' local bucket
    gradients, bit for bit, before and after DDP's bucket rebuild; floats sent agree."""
    (steps0, w0), (steps1, w1) = ddp_runs[0][name], ddp_runs[1][name]
    layouts = [[(i, tuple(s)) for i, s, _, _ in st["buckets"]] for st in steps0]
    assert layouts[0] != layouts[1] and layouts[1] == layouts[-1]    # the rebuild happened once
    assert len(layouts[0]) == 1 and len(layouts[1]) == 2               # 1 bucket, then 2 after the rebuild
    methods = {}
    for step, (a, b) in enumerate(zip(steps0, steps1)):
        floats = 0.0
        for (i, sizes, g0, out0), (_, _, g1, out1) in zip(a["buckets"], b["buckets"]):
            key = (i, tuple(sizes))
            if key not in methods:
                methods[key] = static_method(COMPRESSORS_DDP[name], sizes, i)
            res = methods[key].step([g0, g1], StepContext(step=step, epoch=0.0, lr=0.05, lr_decayed=False,
                                                          compute_s=0.0, samples=32))
            assert torch.equal(res.grad, out0) and torch.equal(out0, out1), (step, i)
            floats += res.floats_sent
        assert a["last"]["floats_sent"] == pytest.approx(floats) == b["last"]["floats_sent"]
    assert all(torch.equal(p, q) for p, q in zip(w0, w1))


@pytest.mark.slow
def test_ddp_gravac_hook_ranks_agree(ddp_runs):
    (steps0, w0), (steps1, w1) = ddp_runs[0]["gravac"], ddp_runs[1]["gravac"]
    levels = [s["last"]["level"] for s in steps0]
    assert levels == [s["last"]["level"] for s in steps1] and levels[0] == "dense"
    assert set(levels) - {"dense"}                          # it did compress
    assert all(torch.equal(p, q) for p, q in zip(w0, w1))


def readme_example() -> str:
    """The Python block of the README's "Use in your own DDP code" section."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Use in your own DDP code", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
def test_readme_example_runs_as_written(tmp_path):
    script = tmp_path / "ddp_example.py"
    script.write_text(readme_example())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(script)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, failure(out)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("step ")]
    assert [ln.split(":")[0] for ln in lines] == ["step 9", "step 19", "step 29"], out.stdout
    # Top-k 100x per parameter tensor: 2048 // 100 + max(1, 64 // 100) + 256 // 100 + 1 = 24 of 2372
    assert all(ln.endswith("sent 24 of 2372 floats (CF 98.8x)") for ln in lines), lines


# --- options that differ between ranks, empty parameters under DDP (2 gloo processes) --------------
class WithEmpty(torch.nn.Module):
    """Two layers, with or without an empty parameter between them."""

    def __init__(self, empty: bool):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(8, 4), torch.nn.Linear(4, 2)
        self.empty = torch.nn.Parameter(torch.zeros(0)) if empty else None

    def forward(self, x):
        y = self.b(torch.relu(self.a(x)))
        return y + self.empty.sum() if self.empty is not None else y


def _first_step_error(rank: int, state, hook) -> str:
    """What one DDP backward with `state` raises ("" when it does not)."""
    model = torch.nn.parallel.DistributedDataParallel(WithEmpty(False))
    model.register_comm_hook(state, hook)
    try:
        model(torch.randn(4, 8)).sum().backward()
    except ValueError as e:
        return str(e)
    return ""


def _disagree_work(rank: int) -> dict:
    from gravac.hooks.covap_hook import CovapState, covap_hook
    out = {"seed": _first_step_error(rank, SparseState(None, compressor="randomk", cf=10, seed=rank), sparse_hook),
           "cf": _first_step_error(rank, SparseState(None, compressor="randomk", cf=[10, 20][rank]), sparse_hook),
           "compressor": _first_step_error(rank, SparseState(None, compressor=["topk", "randomk"][rank]), sparse_hook),
           "gravac": _first_step_error(rank, GraVACState(None, compressor="topk", epsilon=[0.5, 0.7][rank]),
                                       gravac_hook),
           "covap": _first_step_error(rank, CovapState(None, drop_rate=[2, 4][rank]), covap_hook)}
    weights = []
    for empty in (True, False):                               # the same options on both ranks: trains
        model = torch.nn.parallel.DistributedDataParallel(WithEmpty(empty))
        model.register_comm_hook(SparseState(None, compressor="topk", cf=4), sparse_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(rank)
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4, 8, generator=g)).pow(2).mean().backward()
            opt.step()
        weights.append([p.detach().clone() for p in model.parameters() if p.numel()])
    out["weights"] = weights
    return out


@pytest.fixture(scope="module")
def disagree_runs(tmp_path_factory):
    return gloo_ranks(_disagree_work, tmp_path_factory.mktemp("disagree"), 2, 120)


@pytest.mark.parametrize("option, shown", [
    ("seed", "seed (rank 0: 0, rank 1: 1)"), ("cf", "cf (rank 0: 10.0, rank 1: 20.0)"),
    ("compressor", 'compressor (rank 0: "topk", rank 1: "randomk")'), ("gravac", "epsilon (rank 0: 0.5, rank 1: 0.7)"),
    ("covap", "drop_rate (rank 0: 2, rank 1: 4)")])
def test_options_that_differ_between_ranks_are_refused_at_the_first_bucket(disagree_runs, option, shown):
    """Instead of a hang, a gloo abort or (seed=rank with shared Random-k) model copies drifting
    apart: one line on every rank, naming the option and each rank's value."""
    for res in disagree_runs:
        msg = res[option]
        assert msg.startswith("hook options differ between ranks: ") and shown in msg and "\n" not in msg, msg
    assert "same positions on every rank" in disagree_runs[0]["seed"]


def test_ddp_with_an_empty_parameter_trains_as_without_it(disagree_runs):
    (with0, without0), (with1, without1) = (r["weights"] for r in disagree_runs)
    for a, b, c, d in zip(with0, without0, with1, without1):
        assert torch.equal(a, b) and torch.equal(a, c) and torch.equal(a, d)
